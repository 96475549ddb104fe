"""The hybrid allocator benchmark (``bench/workload/hybrid.py`` over the scheduler loop of
``bench/replay/scheduler.py``, its tables observed per group): the replay on the reference at a tiny
scale, the one-group case of the observation, determinism, the skip of an implementation
without the capability, and the ``--kv-bench -k hybrid`` run from the command line."""

from __future__ import annotations

import os
import textwrap
from typing import Any

import numpy as np  # noqa: F401  (pytester drops modules it imported: see test_plugin.py)
import pytest

import kvcheck.adapters.reference
import kvcheck.bench.bench_allocator
import kvcheck.bench.bench_kernels
from kvcheck.bench.replay.scheduler import SchedulerRun, run_workload
from kvcheck.bench.workload.hybrid import (
    HYBRID_GROUPS,
    HYBRID_SCENARIOS,
    hybrid_spec,
    make_hybrid_workload,
    request_peak_blocks,
)
from kvcheck.bench.workload.scenarios import make_workload
from kvcheck.conformance.protocol import KVCacheGroupSpec, KVCacheSpec
from kvcheck.errors import KVCheckFailure, KVCheckInputError

# pytester's in-process runs drop the modules they imported when they end, and torch refuses
# to be imported twice in one process (bench_kernels.py imports it when collected).
try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton's first import
    import triton  # noqa: F401
except ImportError:
    pass

# The scale of the in-process replays: 12 requests of hybrid_shared_prompt (< 1 s).
TINY_SCALE = 0.25


def _replay(manager: Any, scenario: str = "hybrid_shared_prompt", seed: int = 0,
            scale: float = TINY_SCALE) -> SchedulerRun:
    hybrid = make_hybrid_workload.__wrapped__(scenario, seed, scale)  # a fresh build
    return run_workload(manager, hybrid.workload, observe=hybrid_spec(hybrid))


def _reference(scenario: str = "hybrid_shared_prompt", seed: int = 0,
               scale: float = TINY_SCALE) -> Any:
    hybrid = make_hybrid_workload(scenario, seed, scale)
    return kvcheck.adapters.reference.make_kv_cache_manager(hybrid_spec(hybrid))


def test_layout_is_one_full_group_and_five_sliding_groups() -> None:
    kinds = [g.kind for g in HYBRID_GROUPS]
    assert kinds == ["full_attention"] + ["sliding_window"] * 5
    assert {g.sliding_window for g in HYBRID_GROUPS[1:]} == {1024, 4096}


def test_reference_replay_produces_pressure_hits_and_nulls() -> None:
    """At a tiny scale the trace still preempts, hits shared system prompts, and every
    sliding group frees blocks by its window (full attention never does)."""
    hybrid = make_hybrid_workload("hybrid_shared_prompt", 0, TINY_SCALE)
    run = _replay(_reference())
    assert run.finished == len(hybrid.workload.requests)
    assert run.preemptions >= 2
    assert run.prefix_hit_rate >= 0.05
    assert run.peak_usage >= 0.9
    # Group 0 is full attention: never a null, never a window free.
    assert run.null_block_steps[0] == 0 and run.window_freed_blocks[0] == 0
    for g in range(1, len(HYBRID_GROUPS)):
        assert run.null_block_steps[g] > 0, g
        assert run.window_freed_blocks[g] >= 100, g
        # A window holds at most what full attention holds.
        assert run.peak_live_blocks[g] <= run.peak_live_blocks[0], g
    # The 1024-token window frees more and keeps fewer blocks than the 4096-token one.
    assert run.window_freed_blocks[1] > run.window_freed_blocks[2]
    assert run.peak_live_blocks[1] < run.peak_live_blocks[2]
    # Groups with equal specs see the same tables' shapes.
    for a, b in ((1, 3), (1, 5), (2, 4)):
        assert run.live_block_steps[a] == run.live_block_steps[b]
        assert run.null_block_steps[a] == run.null_block_steps[b]
    # Hits on the sliding groups are padded with nulls (readmitted requests and prompts).
    assert run.hit_null_blocks[1] > 0 and run.hit_null_blocks[0] == 0


def test_long_context_scenario_replays_on_the_reference() -> None:
    run = _replay(_reference("hybrid_long_context", 0, 0.5), "hybrid_long_context", 0, 0.5)
    assert run.finished == 4
    assert all(run.window_freed_blocks[g] > 0 for g in range(1, len(HYBRID_GROUPS)))


class _Recorder:
    """A manager proxy that records every call and its result."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self.calls: list[tuple[Any, ...]] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.manager, name)

        def call(*args: Any) -> Any:
            result = method(*args)
            summary = tuple((a.request_id, a.num_tokens, a.num_computed_tokens)
                            if hasattr(a, "request_id") else a for a in args)
            self.calls.append((name, summary, result))
            return result

        return call


def test_call_sequence_is_deterministic_for_a_seed() -> None:
    runs = []
    for seed in (0, 0, 1):
        recorder = _Recorder(_reference(seed=seed))
        _replay(recorder, seed=seed)
        runs.append(recorder.calls)
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]
    names = {c[0] for c in runs[0]}
    assert {"get_computed_blocks", "allocate_slots", "free", "get_block_ids"} <= names


def test_workload_is_deterministic_and_the_pool_fits_the_largest_request() -> None:
    for scenario in HYBRID_SCENARIOS:
        a = make_hybrid_workload.__wrapped__(scenario, 3, 0.5)
        b = make_hybrid_workload.__wrapped__(scenario, 3, 0.5)
        assert a.workload.digest() == b.workload.digest()
        w = a.workload
        largest = max(request_peak_blocks(r.num_tokens, a.groups, w.block_size,
                                          w.max_num_batched_tokens) for r in w.requests)
        assert w.num_blocks - 1 >= largest
        # Several thousand tokens per prompt: the windows skip blocks.
        assert max(len(r.prompt_token_ids) for r in w.requests) > 4096


def test_unknown_scenario_is_an_input_error() -> None:
    with pytest.raises(KVCheckInputError, match="hybrid_shared_prompt"):
        make_hybrid_workload("nope")


def test_tables_not_one_list_per_group_are_reported() -> None:
    """An adapter whose ``get_block_ids`` drops a group fails the observed replay, naming the
    request and both counts."""

    class DropsAGroup:
        def __init__(self, manager: Any) -> None:
            self.manager = manager

        def __getattr__(self, name: str) -> Any:
            return getattr(self.manager, name)

        def get_block_ids(self, request_id: str) -> Any:
            return self.manager.get_block_ids(request_id)[1:]

    hybrid = make_hybrid_workload("hybrid_shared_prompt", 0, TINY_SCALE)
    with pytest.raises(KVCheckFailure, match=r"get_block_ids\('hssp-00000'\) returned 5 lists "
                                             r"on a spec of 6 KV-cache groups"):
        run_workload(DropsAGroup(_reference()), hybrid.workload, observe=hybrid_spec(hybrid))


def test_one_group_is_the_one_entry_case_of_the_observation() -> None:
    """A single-group spec (flat tables) observed gives one entry per count, and the same
    replay as a one-group grouped spec (per-group tables) of the same pool: the same calls'
    counts and the same entry. Full attention never has a null entry, so never a window
    free. Unobserved, the run has no entries and the
    same scheduler counts. Entries count a shared prefix block once per table holding it,
    read before the step's frees: never fewer than the blocks in use after the step."""
    workload = make_workload("shared_system_prompt", seed=0, scale=0.05)
    flat = KVCacheSpec(num_blocks=workload.num_blocks, block_size=workload.block_size)
    grouped = KVCacheSpec(num_blocks=workload.num_blocks, block_size=workload.block_size,
                          kv_cache_groups=(KVCacheGroupSpec("full_attention"),))
    make = kvcheck.adapters.reference.make_kv_cache_manager
    runs = [run_workload(make(spec), workload, observe=spec) for spec in (flat, grouped)]
    plain = run_workload(make(flat), workload)

    def counts(run: SchedulerRun) -> tuple[object, ...]:
        return (run.steps, run.finished, run.preemptions, run.hit_tokens,
                run.scheduled_tokens, run.peak_used_blocks, len(run.allocate_ns))

    assert counts(runs[0]) == counts(runs[1]) == counts(plain)
    for run in runs:
        assert run.null_block_steps == [0] and run.window_freed_blocks == [0]
        assert run.hit_null_blocks == [0] and run.null_fractions == [0.0]
        assert run.live_block_steps[0] > 0
        assert run.peak_live_blocks[0] >= run.peak_used_blocks > 0
    assert runs[0].live_block_steps == runs[1].live_block_steps
    assert runs[0].peak_live_blocks == runs[1].peak_live_blocks
    assert (plain.live_block_steps, plain.null_fractions) == ([], [])


# ---------------------------------------------------------------------------- command line
@pytest.fixture(autouse=True)
def _not_an_xdist_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest-benchmark disables itself when it sees PYTEST_XDIST_WORKER."""
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)


_ADAPTER = """
    from kvcheck.adapters.reference import make_kv_cache_manager as _make
    from kvcheck.conformance.protocol import ImplInfo, UnsupportedSpec

    IMPL_INFO = ImplInfo(name={name!r}, version="1", capabilities=frozenset({caps!r}),
                         profile="vllm-0.33", hash_algos=("sha256",))


    def make_kv_cache_manager(spec):
        if spec.kv_cache_groups and {decline!r}:
            raise UnsupportedSpec({decline!r})
        return _make(spec)
"""


def test_missing_capability_or_declined_spec_skips_with_the_reason(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        no_groups_kv=textwrap.dedent(_ADAPTER).format(
            name="no_groups", caps={"manager", "prefix_caching"}, decline=""),
        declines_kv=textwrap.dedent(_ADAPTER).format(
            name="declines", caps={"manager", "prefix_caching", "kv_cache_groups",
                                   "sliding_window"},
            decline="no hybrid layouts here"))
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--kv-impl=no_groups_kv,declines_kv", "--kv-bench",
        "--kv-bench-scale=0.03", "--kv-bench-rounds=1", "--kv-bench-warmup=0",
        "-k", "hybrid", "-rs")
    result.assert_outcomes(skipped=2 * len(HYBRID_SCENARIOS))
    result.stdout.fnmatch_lines([
        "*no_groups does not declare capability 'kv_cache_groups'*hybrid*",
        "*declines declines the hybrid spec of hybrid_*: no hybrid layouts here*",
    ])


def test_kv_bench_hybrid_runs_on_the_reference(pytester: pytest.Pytester) -> None:
    """`pytest --kv-impl=reference --kv-bench --kv-bench-scale=0.05 -k hybrid` passes and
    prints the scheduler table with both hybrid scenarios."""
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--kv-impl=reference", "--kv-bench",
        "--kv-bench-scale=0.05", "--kv-bench-rounds=2", "--kv-bench-warmup=0", "-k", "hybrid")
    result.assert_outcomes(passed=len(HYBRID_SCENARIOS))
    result.stdout.fnmatch_lines([
        "*kvcheck bench: scheduler loop through the adapter protocol*",
        "*reference*hybrid_sha*1.00x*",
        "*reference*hybrid_lon*1.00x*",
    ])


def test_hybrid_results_carry_no_manager_level_figures() -> None:
    """The manager-level hook covers single-group pools only: a hybrid benchmark must not be
    timed there on the single-group spec of its workload (``HybridBench`` is a
    ``SchedulerBench``, so the session asks the bench, not its type)."""
    from kvcheck.bench.session import _manager_level
    from kvcheck.bench.workload.hybrid import HybridBench
    from kvcheck.conformance.loader import load_impl

    reference = load_impl("reference", call_timeout=None)
    bench = HybridBench(reference, make_hybrid_workload("hybrid_shared_prompt", 0, 0.05))
    assert _manager_level(bench, reference, reference, 1, 0) == ([], {})
