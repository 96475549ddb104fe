"""The built wheel: everything lives under kvcheck/, the shipped suite and the entry points
are there, and no generic top-level package (plugin, bench, results...) leaks out."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("build")
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out),
         str(ROOT)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (path,) = out.glob("kvcheck-*.whl")
    return path


@pytest.fixture(scope="module")
def wheel_names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        return zf.namelist()


def test_only_kvcheck_at_top_level(wheel_names: list[str]) -> None:
    tops = {n.split("/", 1)[0] for n in wheel_names}
    dist_info = {t for t in tops if t.endswith(".dist-info")}
    assert tops - dist_info == {"kvcheck"}, f"unexpected top-level entries: {sorted(tops)}"


def test_every_subpackage_and_the_suite_are_shipped(wheel_names: list[str]) -> None:
    for sub in ("reference_impl", "conformance", "gpu_kernels", "plugin", "bench", "results"):
        assert f"kvcheck/{sub}/__init__.py" in wheel_names, sub
    for module in ("kvcheck/__init__.py", "kvcheck/conformance/test_allocation.py",
                   "kvcheck/conformance/test_differential.py", "kvcheck/plugin/plugin.py",
                   "kvcheck/adapters/reference.py"):
        assert module in wheel_names, module
    assert not [n for n in wheel_names if n.startswith("kvcheck/tests/") or "/tests/" in n]


def test_recorded_corpora_are_shipped(wheel: Path, wheel_names: list[str]) -> None:
    """One corpus per vLLM profile (conformance/corpus/), byte for byte the checkout's, at
    most 2 MB together (the issue's budget for the wheel)."""
    from kvcheck.conformance.protocol import VLLM_PROFILES

    names = {f"kvcheck/conformance/corpus/{p}.cbor.xz" for p in VLLM_PROFILES}
    assert names <= set(wheel_names), sorted(n for n in wheel_names if "corpus" in n)
    assert "kvcheck/conformance/test_recorded.py" in wheel_names
    with zipfile.ZipFile(wheel) as zf:
        shipped = {n: zf.read(n) for n in names}
    for name, data in shipped.items():
        assert data == (ROOT / name.removeprefix("kvcheck/")).read_bytes(), name
    assert sum(map(len, shipped.values())) <= 2_000_000


def test_offload_golden_scenarios_are_shipped(wheel: Path, wheel_names: list[str]) -> None:
    """The offload area's scenarios recorded from vLLM (conformance/offload_golden.json), byte
    for byte the checkout's: the area reads them from the installed package."""
    name = "kvcheck/conformance/offload_golden.json"
    assert name in wheel_names and "kvcheck/conformance/test_offload.py" in wheel_names
    with zipfile.ZipFile(wheel) as zf:
        assert zf.read(name) == (ROOT / "conformance" / "offload_golden.json").read_bytes()


def test_entry_points(wheel: Path, wheel_names: list[str]) -> None:
    (entry,) = [n for n in wheel_names if n.endswith(".dist-info/entry_points.txt")]
    with zipfile.ZipFile(wheel) as zf:
        text = zf.read(entry).decode()
    assert "[pytest11]\nkvcheck = kvcheck.plugin.plugin" in text
    assert "[console_scripts]\nkvcheck = kvcheck.plugin.cli:main" in text


def test_reference_has_no_torch_import() -> None:
    """The reference (and the suite) must run on machines without torch."""
    code = ("import sys, kvcheck.reference_impl, kvcheck.conformance.protocol, "
            "kvcheck.plugin.plugin, kvcheck.adapters.reference; "
            "print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)
    assert proc.stdout.strip() == "False", proc.stderr
    offenders = [p for p in (ROOT / "reference_impl").glob("*.py")
                 if "import torch" in p.read_text()]
    assert offenders == []
