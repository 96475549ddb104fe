"""Invariants: the profile-independent laws of ``kvcheck.conformance.laws`` (conservation of
blocks, no block held twice by one request, reserved blocks never handed out, free <=>
unreferenced, ref counts = holders, hit caps, hit correctness against the record of what was
written into each block, the implementation's own check_invariants) after every op of random
workloads, with no oracle.

They run under every profile, ``--kv-profile=generic`` included (with the other ``kv_generic``
tests), so designs other than vLLM's get a meaningful verdict too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from kvcheck.conformance.ops import Op, add, decode, free, one_token_decodes, reset, schedule
from kvcheck.conformance.protocol import effective_capabilities, extra_key_kinds
from kvcheck.conformance.sizes import tokens
from kvcheck.conformance.workload_machine import declared_features, run_workload_machine

if TYPE_CHECKING:
    from hypothesis import settings as Settings

    from kvcheck.conformance.differential import Pair, PairFactory
    from kvcheck.conformance.loader import ImplHandle


@pytest.mark.kv_generic
def test_laws_hold_under_random_workloads(kv_impl: ImplHandle, kv_profile: str,
                                          kv_pair: PairFactory, kv_settings: Settings,
                                          kv_seed: int | None) -> None:
    """Conservation, ownership, hit-cap and hit-correctness laws hold after every step of
    random workloads (with LoRA / salt / multimodal requests of the kinds declared)."""

    def laws_only(**fields: object) -> Pair:
        return kv_pair(with_oracle=False, **fields)

    # Only the extra-key kinds the design declares (lora, multimodal, cache_salt).
    extras = extra_key_kinds(effective_capabilities(kv_impl.info, kv_profile))
    # No oracle, so nothing compares hashes across managers: PYTHONHASHSEED may be unset
    # even where NONE_HASH is then random.
    run_workload_machine(laws_only, kv_settings, kv_seed, extras=extras, events=False,
                         impl=kv_impl, profile=kv_profile, random_roots=True,
                         features=declared_features(kv_impl, names=(
                             "eagle", "prefill_lookahead", "hash_lookahead",
                             "admission_gates", "block_zeroing")))


@pytest.mark.kv_generic
def test_laws_hold_through_a_full_drain(kv_pair: PairFactory) -> None:
    """Fill the pool, free everything (and reset, with reset_prefix_cache): the free count
    returns to its initial value."""
    pair = kv_pair(num_blocks=9, block_size=4, with_oracle=False)
    caps, bs = pair.impl.capabilities, pair.spec.block_size
    initial = pair.impl.manager.num_free_blocks()
    ops: list[Op] = []
    for i in range(4):  # prompts of a block and 3 tokens
        ops += [add(f"r{i}", range(i, i + tokens(1, bs, 3))), schedule(f"r{i}"),
                decode(f"r{i}", 2)]
    pair.run(one_token_decodes(ops, "multi_token_decode" in caps))
    pair.run([free(f"r{i}") for i in range(4)])
    if "reset_prefix_cache" in caps:
        assert pair.apply(reset()) == {"reset": True}, (
            "reset_prefix_cache() with every request freed must succeed\n" + pair.impl.snippet())
    assert pair.impl.manager.num_free_blocks() == initial, (
        f"after freeing everything num_free_blocks() is {pair.impl.manager.num_free_blocks()}, "
        f"initially {initial}: a leak\n" + pair.impl.snippet())


@pytest.mark.kv_generic
def test_failed_allocation_leaks_nothing(kv_pair: PairFactory) -> None:
    """Repeated failed allocations leave the free count unchanged (no ref-count leak)."""
    pair = kv_pair(num_blocks=6, block_size=4, with_oracle=False)
    bs = pair.spec.block_size
    # big: 2 cached blocks, then more blocks than the whole pool.
    pair.run([add("a", range(tokens(2, bs))), schedule("a"), free("a"),
              add("big", list(range(tokens(2, bs)))
                  + [1] * tokens(max(10, pair.spec.num_blocks), bs))])
    before = pair.impl.manager.num_free_blocks()
    for _ in range(3):
        pair.apply(schedule("big"))
    assert pair.impl.manager.num_free_blocks() == before
    assert "big" not in pair.impl.running
