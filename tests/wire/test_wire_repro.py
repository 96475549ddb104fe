"""Repro over the wire: ``kvcheck replay`` drives an ``exec:`` engine as it drives a module,
and a failing differential test writes, beside its trace, the exact lines exchanged with the
engine about the failing manager (``NAME.wire.txt``, docs/wire-protocol.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from kv_helpers import FORWARD_FREE_SOURCE

from kvcheck.conformance.differential import write_trace
from kvcheck.conformance.ops import add, free, schedule
from kvcheck.conformance.protocol import KVCacheSpec
from kvcheck.plugin.cli import main

OPS = [add("a", range(10)), schedule("a"), free("a"), add("b", [9, 9]), schedule("b")]


@pytest.fixture
def served_forward(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """``exec:`` target serving the forward-free manager (importable by the served process
    through PYTHONPATH)."""
    (tmp_path / "forward_free_wire.py").write_text(FORWARD_FREE_SOURCE)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return f"exec:{sys.executable} -m kvcheck.wire.serve --kv-impl forward_free_wire"


def test_replay_drives_an_exec_engine(tmp_path: Path, served_forward: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace("t", served_forward, KVCacheSpec(num_blocks=8, block_size=4), OPS,
                        directory=tmp_path)
    assert main(["replay", str(trace)]) == 1
    out = capsys.readouterr().out
    assert "forward diverges" in out
    assert "after op #3 {'op': 'free', 'rid': 'a'}: free queue (head first) differs" in out
    assert f"load_impl({served_forward!r})" in out  # the repro starts the engine too
    assert main(["replay", str(trace), "--kv-impl=reference"]) == 0


def test_a_failing_test_writes_the_wire_transcript(pytester: pytest.Pytester,
                                                   served_forward: str) -> None:
    area = Path(__file__).resolve().parents[2] / "conformance" / "test_differential.py"
    ini = pytester.makeini("[pytest]\n")
    result = pytester.runpytest_subprocess(
        f"--kv-impl={served_forward}", "-p", "no:cacheprovider", "-c", str(ini), str(area),
        "-k", "test_random_workloads_match_reference", "--kv-max-examples=30", timeout=600)
    text = result.stdout.str()
    assert result.parseoutcomes().get("failed") == 1, text[-3000:]
    written = [line.split("wire transcript of the manager: ", 1)[1].strip()
               for line in text.splitlines() if "wire transcript of the manager: " in line]
    assert written, text[-3000:]
    lines = Path(pytester.path / written[0]).read_text().splitlines()
    assert lines[0].startswith('> {"id":1,"method":"init"') and lines[1].startswith("< ")
    assert any('"method":"make_kv_cache_manager"' in line for line in lines[2:4])
    assert any('"method":"free"' in line for line in lines)
    # Every line is kvcheck's request or the engine's answer, in turn.
    assert [line[:2] for line in lines] == ["> ", "< "] * (len(lines) // 2)
