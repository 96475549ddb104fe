"""The wire path against the in-process path: the whole shipped suite on kvcheck's reference
served over the wire (``exec:python -m kvcheck.wire.serve``) gives the record the reference
gives in process (docs/wire-protocol.md, "The Python side"): every test the same outcome, the
same per-area counts, the same verdict, except the areas protocol v1 does not carry: ``kernels``
(GPU tensors cannot cross the wire) and ``offload`` (an offload tier is checked in process):
there every test is skipped as an undeclared capability. In process the reference runs
without its kernels too (``kv_helpers.reference_without_kernels``), so its kernel tests are
skipped on both sides."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from kv_helpers import reference_without_kernels

ROOT = Path(__file__).resolve().parents[2]


def _record(tmp_path: Path, impl: str, name: str) -> dict:
    report = tmp_path / f"{name}.jsonl"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--rootdir", str(ROOT),
         str(ROOT / "conformance"), f"--kv-impl={impl}", "--kv-seed=7",
         # Fewer random examples than the default: the same on both sides, and every test
         # still runs (CI's main job runs the default on the reference in process).
         "--kv-max-examples=4",
         f"--kv-report={report}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=1500, check=False)
    assert run.returncode == 0, _failures(run.stdout) + run.stdout[-3000:] + run.stderr[-2000:]
    assert "still running" not in run.stdout, run.stdout[-2000:]
    return json.loads(report.read_text().splitlines()[-1])


def _failures(stdout: str, most: int = 6000) -> str:
    """The head of the run's FAILURES section (which call diverged, and how): the tail alone
    shows only the verdict, and a failure seen once under load could not be told apart."""
    start = stdout.find("= FAILURES =")
    if start < 0:
        return ""
    end = stdout.find("short test summary info", start)
    section = stdout[start:end if end >= 0 else len(stdout)]
    return section[:most] + ("\n[...]\n" if len(section) > most else "\n")


def test_wire_served_reference_gives_the_in_process_record(tmp_path: Path) -> None:
    # The reference in process without its kernels (the wire does not carry them, and
    # interpreted they were a third of this test's time), under its own name.
    (tmp_path / "refnokernels.py").write_text(reference_without_kernels(), encoding="utf-8")
    local = _record(tmp_path, "refnokernels", "in-process")  # `python -m`: the cwd imports
    assert local["implementation"]["name"] == "reference"
    wire = _record(tmp_path, f"exec:{sys.executable} -m kvcheck.wire.serve", "wire")

    not_carried = {t for t in local["outcomes"]
                   if "/test_kernels.py::" in t or "/test_offload.py::" in t}
    assert {t.split("::")[0].rsplit("/", 1)[1] for t in not_carried} == {
        "test_kernels.py", "test_offload.py"}
    assert all(wire["outcomes"][t] == "skipped" for t in not_carried)
    same = {t: o for t, o in local["outcomes"].items() if t not in not_carried}
    assert {t: wire["outcomes"][t] for t in same} == same
    assert set(wire["outcomes"]) == set(local["outcomes"])

    areas = {a: c for a, c in local["areas"].items() if a not in ("kernels", "offload")}
    assert {a: wire["areas"][a] for a in areas} == areas
    assert wire["conforms"] is local["conforms"] is True
    assert wire["complete"] is local["complete"] is True
    assert wire["implementation"]["capabilities"] == sorted(
        set(local["implementation"]["capabilities"]) - {"kernels", "offload"})
    # The verdict's words are the same but for the tests those areas ran in process.
    ran = int(re.search(r"\((\d+) tests ran", local["verdict"]).group(1))  # type: ignore[union-attr]
    ran_here = sum(local["outcomes"][t] == "passed" for t in not_carried)
    local_rest = local["verdict"].split(" tests ran", 1)[1]
    assert wire["verdict"].startswith(
        f"reference conforms to {local['profile']} ({ran - ran_here} tests ran")
    assert wire["verdict"].split(" tests ran", 1)[1].split(";")[:2] == \
        local_rest.split(";")[:2]  # the same block sizes and law counts
