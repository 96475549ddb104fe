"""kvcheck's bytes against vLLM's own encoder and decoder, where vLLM is installed (CI's vLLM
stages; scripts/vllm-cpu-env.sh). ``python -m kvcheck.events.crosscheck`` runs the same on
thousands of batches."""

from __future__ import annotations

import pytest

pytest.importorskip("msgspec")
pytest.importorskip("vllm.distributed.kv_events", reason="needs vLLM installed")

from kvcheck.events.crosscheck import compare_batch, installed_release, main
from kvcheck.events.workload import random_batches


@pytest.mark.parametrize("int_hashes", [True, False], ids=["int-hashes", "bytes-hashes"])
def test_bytes_equal_vllms_encoder(int_hashes: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1")  # restored after the test
    release, _ = installed_release()
    problems = [(n, p) for n, batch in enumerate(random_batches(release, seed=7, count=300))
                if (p := compare_batch(batch, release, ts=1.0 + n, data_parallel_rank=n % 3,
                                       int_hashes=int_hashes))]
    assert problems[:1] == []


def test_the_crosscheck_command_reports(capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1")
    assert main(["--batches", "50", "--seed", "3"]) == 0
    assert "50 batches x 2 hash forms identical to vLLM's encoder" in capsys.readouterr().out
