"""The kvcheck command: replay of traces and the run wrapper."""

from __future__ import annotations

import json
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
def forward_impl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "forward_free_impl.py").write_text(FORWARD_FREE_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "forward_free_impl"
    sys.modules.pop("forward_free_impl", None)


def test_replay_reports_divergence_with_snippet(tmp_path: Path, forward_impl: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace("t", forward_impl, KVCacheSpec(num_blocks=8, block_size=4), OPS,
                        directory=tmp_path)
    assert main(["replay", str(trace)]) == 1
    out = capsys.readouterr().out
    assert "forward diverges" in out
    assert "after op #3 {'op': 'free', 'rid': 'a'}: free queue (head first) differs" in out
    assert "m.free('a')" in out and "load_impl('forward_free_impl')" in out


def test_replay_clean_trace_on_reference(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace("t", "reference", KVCacheSpec(num_blocks=8, block_size=4), OPS,
                        directory=tmp_path)
    assert main(["replay", str(trace)]) == 0
    assert "5 ops on reference (compared with reference): no divergence" in capsys.readouterr().out


def test_replay_other_impl_than_recorded(tmp_path: Path, forward_impl: str) -> None:
    trace = write_trace("t", "reference", KVCacheSpec(num_blocks=8, block_size=4), OPS,
                        directory=tmp_path)
    assert main(["replay", str(trace), f"--kv-impl={forward_impl}"]) == 1
    assert main(["replay", str(trace), f"--kv-impl={forward_impl}", "--no-oracle"]) == 0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not a JSON trace"),
        ('{"trace_version": 99, "spec": {}, "ops": []}', "'trace_version' must be an int <= 1"),
        ('{"trace_version": 1, "ops": []}', "field 'spec' missing"),
        ('{"trace_version": 1, "spec": {"blocks": 3}, "ops": []}', "is not a KVCacheSpec"),
    ],
)
def test_replay_rejects_bad_traces(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    assert main(["replay", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_replay_bad_impl_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace("t", "reference", KVCacheSpec(num_blocks=8, block_size=4), OPS,
                        directory=tmp_path)
    assert main(["replay", str(trace), "--kv-impl=no.such.module"]) == 2
    assert "cannot import 'no.such.module'" in capsys.readouterr().err


def test_written_trace_is_json_with_spec(tmp_path: Path) -> None:
    path = write_trace("a/b c", "reference", KVCacheSpec(num_blocks=8, block_size=4), OPS,
                       directory=tmp_path)
    # Sanitising changed the name, so a short hash of the raw name keeps it unique.
    assert path.name.startswith("a_b_c-") and path.name.endswith(".json")
    data = json.loads(path.read_text())
    assert data["spec"]["num_blocks"] == 8 and data["ops"] == OPS


def test_failing_conformance_test_writes_a_replayable_trace(
        pytester: pytest.Pytester) -> None:
    """A divergence found by the suite leaves .kvcheck/repro/<test>.json behind, and
    `kvcheck replay` on it reproduces the failure."""
    pytester.makepyfile(forward_free_impl2=FORWARD_FREE_SOURCE.replace('"forward"', '"forward2"'))
    pytester.syspathinsert()
    result = pytester.runpytest("-p", "no:cacheprovider", "--kv-impl=forward_free_impl2",
                                "-k", "test_lru_refresh_on_hit")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*trace written to .kvcheck/repro/test_lru_refresh_on_hit*"])
    traces = list((pytester.path / ".kvcheck" / "repro").glob("*.json"))
    assert len(traces) == 1
    assert main(["replay", str(traces[0])]) == 1


def test_run_wraps_pytest(pytester: pytest.Pytester) -> None:
    result = pytester.run(sys.executable, "-m", "kvcheck.plugin.cli", "run", "--impl",
                          "reference", "--report", "r.jsonl", "--", "-q", "-p",
                          "no:cacheprovider", "-k", "test_first_allocation")
    assert result.ret == 0
    assert (pytester.path / "r.jsonl").exists()


def test_any_kvcheck_input_error_is_exit_2(monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A kvcheck input error that no command handles itself still ends as exit 2 with the
    message, not a traceback."""
    import kvcheck.results.compare
    from kvcheck.errors import KVCheckInputError

    def refuse(paths: object) -> object:
        raise KVCheckInputError("base.jsonl: something unusable")

    monkeypatch.setattr(kvcheck.results.compare, "load_files", refuse)
    assert main(["compare", "base.jsonl", "cur.jsonl"]) == 2
    assert capsys.readouterr().err == "kvcheck compare: base.jsonl: something unusable\n"
