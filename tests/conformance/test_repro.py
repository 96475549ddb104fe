"""A failing differential check writes ``<trace>.py`` beside its JSON trace: a standalone
program that replays the calls, compares the diverging value with the expected one, prints
both and exits non-zero (a broken law: prints it and exits non-zero)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from kvcheck.conformance.differential import ConformanceMismatch, Pair
from kvcheck.conformance.loader import load_impl
from kvcheck.conformance.ops import add, free, schedule
from kvcheck.conformance.protocol import KVCacheSpec

TESTS = Path(__file__).resolve().parents[1]
MUTANTS, NANO = TESTS / "mutants", TESTS / "nano"


def fail_and_run_repro(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, impl: str,
                       folder: Path, ops: list, profile: str = "vllm-0.33",
                       drop: frozenset[str] = frozenset(),
                       ) -> tuple[str, subprocess.CompletedProcess[str]]:
    """Drive ``impl`` (a module in ``folder``, minus the ``drop`` capabilities) until the
    pair fails; run the repro it wrote."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(folder))
    handle = load_impl(impl, search=[folder])
    handle = replace(handle, info=replace(handle.info,
                                          capabilities=handle.info.capabilities - drop))
    oracle = None if profile == "generic" else load_impl("reference")
    pair = Pair(handle, oracle, KVCacheSpec(num_blocks=10, block_size=4, profile=profile))
    pair.trace_name = "test_x[" + impl + "]"
    with pytest.raises(ConformanceMismatch) as info:
        pair.run(ops)
    (repro,) = (tmp_path / ".kvcheck" / "repro").glob("*.py")
    assert repro.with_suffix(".json").is_file(), "the repro sits beside its trace"
    assert f"repro: python {repro.relative_to(tmp_path)}" in str(info.value)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), *sys.path])}
    proc = subprocess.run([sys.executable, str(repro)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    return str(info.value), proc


def test_observable_divergence_is_asserted(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    _, proc = fail_and_run_repro(tmp_path, monkeypatch, "mut_forward_free_order", MUTANTS,
                                 [add("a", range(12)), schedule("a"), free("a")])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    # Blocks 1-3 of the freed request go back last block first (the reference) or in
    # forward order (the mutant).
    assert proc.stderr.splitlines()[-3:] == [
        "kvcheck repro: free queue (head first) differs:",
        "  expected [4, 5, 6, 7, 8, 9, 3, 2, 1]",
        "  got      [4, 5, 6, 7, 8, 9, 1, 2, 3]"]


def test_answer_divergence_is_asserted(tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the free-queue observation, forward free order shows in the next answer: a
    request taking every free block gets them in another order."""
    _, proc = fail_and_run_repro(
        tmp_path, monkeypatch, "mut_forward_free_order", MUTANTS,
        [add("a", range(12)), schedule("a"), free("a"), add("b", range(100, 136)),
         schedule("b")], drop=frozenset({"free_queue_order", "ref_counts"}))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.splitlines()[-3:] == [
        "kvcheck repro: allocate_slots answer differs:",
        "  expected [4, 5, 6, 7, 8, 9, 3, 2, 1]",
        "  got      [4, 5, 6, 7, 8, 9, 1, 2, 3]"]


def test_broken_law_ends_the_repro_non_zero(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    message, proc = fail_and_run_repro(
        tmp_path, monkeypatch, "mut_leak_on_free", NANO,
        [add("a", range(12)), schedule("a"), free("a")], profile="generic")
    assert "conservation" in message
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("kvcheck repro: conservation")
