"""The continuous-batching loop on the reference, with traces small enough to count by hand."""

from __future__ import annotations

import pytest

from kvcheck.adapters.reference import make_kv_cache_manager
from kvcheck.bench.replay.scheduler import run_workload
from kvcheck.bench.workload.scenarios import RequestSpec, Workload
from kvcheck.conformance.protocol import KVCacheSpec
from kvcheck.errors import KVCheckFailure


def _workload(requests: list[RequestSpec], num_blocks: int, block_size: int,
              max_num_seqs: int = 8, budget: int = 2048) -> Workload:
    return Workload("hand", 0, 1.0, block_size, tuple(requests), num_blocks, max_num_seqs,
                    budget, working_set_blocks=0, pool_fraction=1.0)


def _run(workload: Workload):
    manager = make_kv_cache_manager(KVCacheSpec(num_blocks=workload.num_blocks,
                                                block_size=workload.block_size))
    return run_workload(manager, workload)


def test_prefix_hit_counts_and_steps_by_hand() -> None:
    """r0 (32 shared + 4 tokens, 3 outputs) runs steps 0-2; r1 (same 32 + 4 others) arrives
    at step 5, hits the 2 cached blocks and runs steps 5-7.

    Scheduled: r0 36 + 1 + 1, r1 (36 - 32 hit) + 1 + 1 = 44. Admitted tokens 36 + 36 = 72,
    hits 32. allocate_slots: 3 per request. Peak: r0's 3 blocks of 10 usable.
    """
    shared = tuple(range(1, 33))
    w = _workload([RequestSpec("r0", 0, shared + (101, 102, 103, 104), (7, 8, 9)),
                   RequestSpec("r1", 5, shared + (201, 202, 203, 204), (7, 8, 9))], 11, 16)
    run = _run(w)
    assert (run.scheduled_tokens, run.hit_tokens, run.queried_tokens) == (44, 32, 72)
    assert (len(run.allocate_ns), len(run.lookup_ns), len(run.free_ns)) == (6, 2, 2)
    assert (run.finished, run.steps, run.preemptions) == (2, 8, 0)
    assert run.prefix_hit_rate == pytest.approx(32 / 72)
    assert run.peak_usage == pytest.approx(0.3)
    assert run.impl_ns > 0


def test_preemption_and_recompute_by_hand() -> None:
    """Block 4, 4 usable blocks; two 7-token prompts with 6 outputs each fill the pool.

    Step 2: r0 needs a third block, r1 (last admitted) is preempted and freed, r0 retries.
    r1 is refused at steps 3-5 (r0 holds 3 blocks), re-admitted at step 6 with 1 block still
    cached (4 hit tokens of its 9), and finishes at step 9. Scheduled: 14 + 2 + 1+1+1+1 + 5 + 3
    = 28; allocate_slots 2 per step for steps 0-5, 1 at 6, 1 each at 7-9 = 16; lookups: r0
    once, r1 at steps 0, 3, 4, 5, 6 = 6; frees: the preemption and two finishes.
    """
    w = _workload([RequestSpec("r0", 0, tuple(range(1, 8)), tuple(range(50, 56))),
                   RequestSpec("r1", 0, tuple(range(11, 18)), tuple(range(60, 66)))], 5, 4)
    run = _run(w)
    assert run.preemptions == 1
    assert (run.scheduled_tokens, run.hit_tokens, run.queried_tokens) == (28, 4, 23)
    assert (len(run.allocate_ns), len(run.lookup_ns), len(run.free_ns)) == (16, 6, 3)
    assert (run.finished, run.steps, run.peak_used_blocks) == (2, 10, 4)


def test_chunked_prefill_respects_the_token_budget() -> None:
    """A 5000-token prompt under a 2048-token budget: chunks 2048, 2048, 904, then 3 decodes
    (4 outputs; the last is sampled, never computed)."""
    w = _workload([RequestSpec("long", 0, tuple(range(1, 5001)), (1, 2, 3, 4))], 400, 16)
    run = _run(w)
    assert len(run.allocate_ns) == 3 + 3
    assert run.scheduled_tokens == 5000 + 3
    assert run.steps == 6


def test_dependent_turn_waits_for_its_predecessor() -> None:
    """A turn with ``after`` arrives ``arrival_step`` steps after its predecessor finished."""
    first = RequestSpec("t0", 0, (1, 2, 3), (4, 5))  # steps 0-1, freed at the end of step 1
    second = RequestSpec("t1", 2, (1, 2, 3, 4, 5, 6), (7,), after="t0")  # arrives at step 4
    run = _run(_workload([first, second], 8, 4))
    assert run.finished == 2
    assert run.steps == 5  # t1 is admitted and finishes at step 4


def test_a_request_larger_than_the_pool_is_reported() -> None:
    """No amount of waiting admits a request bigger than the whole pool: a clear error."""
    w = _workload([RequestSpec("big", 0, tuple(range(1, 100)), (1,))], 4, 4)
    with pytest.raises(KVCheckFailure, match="cannot be admitted into an idle pool of 4 blocks"):
        _run(w)


def test_a_leaking_implementation_is_reported() -> None:
    """An adapter whose free() releases nothing soon cannot admit anything into an idle pool:
    the loop says so instead of spinning."""

    class Leaky:
        def __init__(self) -> None:
            self.inner = make_kv_cache_manager(KVCacheSpec(num_blocks=5, block_size=4))

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def free(self, request_id: str) -> None:  # forgets to release the blocks
            pass

    w = _workload([RequestSpec(f"r{i}", 0, (i + 1, i + 2, i + 3), (9, 9)) for i in range(8)],
                  5, 4)
    with pytest.raises(KVCheckFailure, match=r"r4 .* cannot be admitted into an idle pool"):
        run_workload(Leaky(), w)


def test_the_step_limit_stops_a_replay() -> None:
    """``max_steps`` bounds a replay; the message counts what finished."""
    w = _workload([RequestSpec("late", 1000, (1, 2, 3), (4,))], 8, 4)
    with pytest.raises(KVCheckFailure, match=r"no progress after 50 steps .0 of 1 requests"):
        run_workload(make_kv_cache_manager(KVCacheSpec(num_blocks=8, block_size=4)), w,
                     max_steps=50)
