"""The crosscheck command's verdicts, without vLLM: the vLLM comparison is replaced, so that
the summary, the first differing batch and the missing-vLLM exit are checked everywhere."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("msgspec")

from kvcheck.events import crosscheck


def _fake_vllm(monkeypatch: pytest.MonkeyPatch, bad_call: int | None,
               publishers: str | None = None) -> list[bool]:
    calls: list[bool] = []

    def compare(batch: object, release: str, *, ts: float, data_parallel_rank: int | None,
                int_hashes: bool) -> str | None:
        calls.append(int_hashes)
        return "bytes differ at byte 12" if len(calls) == bad_call else None

    monkeypatch.setattr(crosscheck, "installed_release", lambda: ("vllm-0.33", "0.33.0"))
    monkeypatch.setattr(crosscheck, "compare_batch", compare)
    monkeypatch.setattr(crosscheck, "compare_publishers", lambda *args: publishers)
    return calls


def test_summary_counts_batches_and_both_hash_forms(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    calls = _fake_vllm(monkeypatch, None)
    assert crosscheck.main(["--batches", "40", "--seed", "2"]) == 0
    assert calls == [True, False] * 40
    out = capsys.readouterr().out
    assert out.startswith("crosscheck vllm-0.33 (vLLM 0.33.0): 40 batches x 2 hash forms")
    assert "BlockStored" in out and "seed 2" in out
    assert "kvcheck's EventPublisher sends vLLM's ZmqEventPublisher's frames" in out


def test_a_publisher_difference_fails_the_crosscheck(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    _fake_vllm(monkeypatch, None, publishers="live messages differ at message 3")
    assert crosscheck.main(["--batches", "5"]) == 1
    out = capsys.readouterr().out
    assert "publishers: live messages differ at message 3" in out
    assert "sends vLLM's ZmqEventPublisher's frames" not in out


def test_the_first_differing_batch_is_named(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    calls = _fake_vllm(monkeypatch, 6)  # batch 2, bytes form
    assert crosscheck.main(["--batches", "40", "--seed", "2"]) == 1
    assert len(calls) == 6
    assert "batch 2 (seed 2, bytes hashes," in capsys.readouterr().out


def test_without_vllm_it_exits_2_saying_so() -> None:
    # sys.modules[name] = None makes that import fail, as where vLLM is not installed.
    code = ("import sys; sys.modules['vllm'] = None; from kvcheck.events.crosscheck import main;"
            " sys.exit(main(['--batches', '1']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 2
    assert "needs vLLM installed (scripts/vllm-cpu-env.sh" in proc.stderr


def test_without_msgspec_the_import_names_the_fix() -> None:
    code = "import sys; sys.modules['msgspec'] = None; import kvcheck.events"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 1
    assert "ImportError: kvcheck.events needs msgspec: pip install 'kvcheck[events]'" \
        in proc.stderr
