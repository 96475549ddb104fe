"""Invariants: the profile-independent laws (conservation of blocks, no block held twice by
one request, the null block never handed out, free <=> unreferenced, ref counts = holders, the
implementation's own check_invariants) after every op of random workloads, with no oracle.

These are the only checks that run under ``--kv-profile=generic`` besides the other
``kv_generic`` tests, so radix-tree engines get a meaningful verdict too.
"""

from __future__ import annotations

import pytest

from kvcheck.conformance.ops import add, decode, free, reset, schedule
from kvcheck.conformance.workload_machine import run_workload_machine


@pytest.mark.kv_generic
def test_laws_hold_under_random_workloads(kv_impl, kv_pair, kv_settings, kv_seed) -> None:
    """Conservation and ownership laws hold after every step of random workloads."""

    def laws_only(**fields):
        return kv_pair(with_oracle=False, **fields)

    run_workload_machine(laws_only, kv_settings, kv_seed, extras=False, events=False)


@pytest.mark.kv_generic
def test_laws_hold_through_a_full_drain(kv_pair) -> None:
    """Fill the pool, free everything, reset: the free count returns to its initial value."""
    pair = kv_pair(num_blocks=9, block_size=4, with_oracle=False)
    initial = pair.impl.manager.num_free_blocks()
    ops = []
    for i in range(4):
        ops += [add(f"r{i}", range(i, i + 7)), schedule(f"r{i}"), decode(f"r{i}", 2)]
    pair.run(ops)
    pair.run([free(f"r{i}") for i in range(4)] + [reset()])
    assert pair.impl.manager.num_free_blocks() == initial, (
        f"after freeing everything num_free_blocks() is {pair.impl.manager.num_free_blocks()}, "
        f"initially {initial}: a leak\n" + pair.impl.snippet())


@pytest.mark.kv_generic
def test_failed_allocation_leaks_nothing(kv_pair) -> None:
    """Repeated failed allocations leave the free count unchanged (no ref-count leak)."""
    pair = kv_pair(num_blocks=6, block_size=4, with_oracle=False)
    pair.run([add("a", range(8)), schedule("a"), free("a"), add("big", list(range(8)) + [1] * 40)])
    before = pair.impl.manager.num_free_blocks()
    for _ in range(3):
        pair.apply(schedule("big"))
    assert pair.impl.manager.num_free_blocks() == before
    assert "big" not in pair.impl.running
