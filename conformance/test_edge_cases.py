"""Edge cases found by mutation testing (docs/mutation.md): bugs no other area's scripted test
reached and the random workloads reached rarely or never, each pinned by one scenario:
multimodal items at block edges (and at the first block completed by decode), one of two
blocks cached under the same key evicted, lookahead slots during a chunked prefill, events
while events are disabled, prefix hits allocated with no new tokens, and hybrid layouts'
paths no other golden reached (``kvcheck.conformance.hybrid_edge_golden``: sparse retention
with EAGLE, Mamba copy-on-write, checkpoints and preemption, external tokens beside windows,
fine-grained hits after evictions, admission caps; most recorded from vLLM 0.33.0, two from
vLLM 0.10.2, each run under its own profile).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from kvcheck.conformance.driver import Driver
from kvcheck.conformance.fine_grained import CAPABILITY as FINE_GRAINED
from kvcheck.conformance.fine_grained import fine_grained_hits
from kvcheck.conformance.golden_answers import (
    assert_answers,
    assert_free_queue,
    skip_unless_declared,
)
from kvcheck.conformance.groups import one_group, one_group_tables
from kvcheck.conformance.hybrid_edge_golden import HYBRID_EDGE_SCENARIOS, HybridEdgeScenario
from kvcheck.conformance.ops import Op, add, decode, free, one_token_decodes, reset, schedule
from kvcheck.conformance.protocol import (
    VLLM_PROFILES,
    KVCacheSpec,
    RequestView,
    group_capabilities,
)
from kvcheck.conformance.sizes import tokens

if TYPE_CHECKING:
    from kvcheck.conformance.differential import PairFactory
    from kvcheck.conformance.loader import ImplHandle
    from kvcheck.conformance.sizes import DeclaredSizes


#: (prompt length, multimodal items (identifier, offset, length)): where the items sit
#: relative to the blocks of 4 tokens and to the first block completed by decode.
MM_EDGE_CASES: dict[str, tuple[int, list[tuple[str, int, int]]]] = {
    # img0 covers [2, 8) and ends where block 2 starts; img1 covers [12, 16) and ends with the
    # prompt, where the first decode block starts.
    "items-end-on-block-starts": (16, [("img0", 2, 6), ("img1", 12, 4)]),
    # The first item runs past the prompt's last full block into the first decode block.
    "first-item-in-decode-block": (18, [("img0", 14, 4)]),
    # img0 ends where the first decode block starts, img1 starts there (0.10.2 keys both).
    "items-meet-at-decode-block": (18, [("img0", 12, 4), ("img1", 16, 2)]),
}


@pytest.mark.kv_capability("block_hashes", "extra_keys")
@pytest.mark.kv_profiles(*VLLM_PROFILES)
@pytest.mark.parametrize("block_size", [4, 1])
@pytest.mark.parametrize("case", list(MM_EDGE_CASES))
def test_mm_items_at_block_edges(kv_pair: PairFactory, case: str, block_size: int) -> None:
    """Images at block edges: each block carries the keys vLLM gives it, through a chunked
    prefill and the decode that completes the next block. 0.33 overlaps half-open ranges, so
    a block starting at an item's end has no key for it; the first block completed by decode
    rescans the items from the first (0.33) or from the last (0.10.2, whose scan also keeps an
    item ending exactly at the block's start) (docs/semantics.md#extra-keys)."""
    prompt_len, mm = MM_EDGE_CASES[case]
    pair = kv_pair(num_blocks=64, block_size=block_size)
    pair.run(one_token_decodes(
        [add("x", range(1, prompt_len + 1), mm=mm), schedule("x", 9), schedule("x"),
         decode("x", 20 - prompt_len)],
        "multi_token_decode" in pair.impl.capabilities))
    assert pair.oracle is not None
    mine = [bytes(h).hex() for h in pair.impl.manager.block_hashes("x")]
    theirs = [bytes(h).hex() for h in pair.oracle.manager.block_hashes("x")]
    assert mine == theirs and len(mine) == 20 // block_size, (
        f"{case}: block_hashes {mine}, reference {theirs}\n" + pair.impl.snippet())


@pytest.mark.kv_capability("prefix_caching")
@pytest.mark.kv_profiles(*VLLM_PROFILES)
def test_evicting_one_of_two_duplicate_blocks_keeps_the_other(kv_pair: PairFactory) -> None:
    """A block-aligned prompt run twice caches its last block twice under one key (vLLM does
    not deduplicate). Evicting the first copy must leave the second findable: a later prompt
    still hits the whole prefix, through the surviving copy."""
    pair = kv_pair(num_blocks=10, block_size=4)
    pair.run([add("a", range(8)), schedule("a"), add("b", range(8)), schedule("b")])
    a, b = pair.impl.tables()["a"][0], pair.impl.tables()["b"][0]
    assert a[0] == b[0] and a[1] != b[1], (
        f"b should hit a's first block and recompute its second: tables a={a}, b={b}\n"
        + pair.impl.snippet())
    # Freed last-block-first, a's copy of block 1 is queued before b's: after the blocks
    # never used, it is the first cached block a full pool hands out again.
    pair.run([free("a"), free("b")])
    keep = 2  # b's copy of block 1 and the shared block 0 stay in the queue
    fill = pair.impl.manager.num_free_blocks() - keep
    pair.run([add("fill", range(1000, 1000 + 4 * fill)), schedule("fill")])
    assert a[1] in pair.impl.tables()["fill"][0], (
        f"filling {fill} blocks should evict a's copy {a[1]}: "
        f"{one_group_tables(pair.impl.tables())}\n"
        + pair.impl.snippet())
    pair.apply(add("c", list(range(8)) + [99]))
    got = one_group(pair.apply(schedule("c")))
    assert got["hits"] == ([a[0], b[1]], 8), (
        f"c must hit block {a[0]} and the surviving copy {b[1]} (8 tokens), got "
        f"{got['hits']}\n" + pair.impl.snippet())


@pytest.mark.kv_generic
@pytest.mark.kv_capability("prefix_caching", "lookahead")
def test_lookahead_slots_in_a_chunked_prefill_are_not_cached(kv_pair: PairFactory) -> None:
    """Lookahead slots of a prefill chunk cover prompt tokens of the *next* chunk, whose KV is
    not computed yet: the block holding them must not be cached (so never hit) until a later
    chunk computes it. (A one-shot prefill hides this: its lookahead lies past the prompt.)"""
    pair = kv_pair(num_blocks=16, block_size=4)
    bs = pair.spec.block_size
    # A block and a token computed, a block of lookahead slots: the tokens after them in
    # blocks 1 and 2 are not computed (5 computed and 5..8 lookahead at 4).
    pair.run([add("a", range(tokens(5, bs))), schedule("a", tokens(1, bs, 1), lookahead=bs)])
    a_blocks = pair.impl.tables()["a"][0]
    if "caches_running_requests" not in pair.impl.capabilities:
        pair.apply(free("a"))  # a design caching at finish caches a's computed blocks now
    pair.apply(add("b", range(tokens(5, bs))))
    got = one_group(pair.apply(schedule("b")))
    assert got["hits"][1] <= bs, (
        f"only a's first block is computed; b hit {got['hits']}\n" + pair.impl.snippet())
    if pair.spec.profile != "generic":
        assert got["hits"] == (a_blocks[:1], bs), (
            f"b must hit a's first block only, got {got['hits']}\n" + pair.impl.snippet())


@pytest.mark.kv_generic
@pytest.mark.kv_capability("manager", "events")
def test_no_events_while_events_are_disabled(kv_impl: ImplHandle, kv_profile: str,
                                             kv_sizes: DeclaredSizes) -> None:
    """With ``enable_kv_cache_events`` off nothing is queued: ``take_events()`` stays empty
    through caching, eviction and a reset (vLLM records events only when they are enabled;
    a queue filled anyway grows without bound, as nobody drains it)."""
    spec = kv_sizes.spec(num_blocks=6, block_size=4, enable_kv_cache_events=False,
                         profile=kv_profile)
    driver = Driver(kv_impl, spec)
    bs = spec.block_size
    every_block = tokens(driver.initial_free, bs)
    ops: list[Op] = [add("a", range(tokens(3, bs, 1))), schedule("a"), free("a"),  # caches
           add("b", range(100, 100 + every_block)), schedule("b"), free("b")]  # evicts them
    if "reset_prefix_cache" in driver.capabilities:
        ops.append(reset())
    driver.run(ops)
    events = driver.manager.take_events()
    assert list(events) == [], (
        f"events are disabled, yet take_events() returned {events}\n" + driver.snippet())


@pytest.mark.kv_profiles("vllm-0.33")
@pytest.mark.kv_capability("prefix_caching")
def test_hits_with_no_new_tokens(kv_impl: ImplHandle, kv_profile: str) -> None:
    """vLLM 0.33 takes ``allocate_slots(request, 0, n, hits)``: a request whose other tokens
    come from elsewhere (a KV connector loading them, as in prefill/decode disaggregation) pins
    its prefix hits and gets no new block. 0.10.2 refuses any ``num_new_tokens == 0``."""
    mgr = kv_impl.make_manager(KVCacheSpec(num_blocks=10, block_size=4, profile=kv_profile))
    assert mgr.allocate_slots(RequestView("a", tuple(range(13))), 13) is not None
    mgr.free("a")  # its 3 full blocks stay cached, in the free queue
    b = RequestView("b", tuple(range(13)))
    hits, num = mgr.get_computed_blocks(b)
    assert num == 12, f"b should hit a's 3 cached blocks, got {(list(hits), num)}"
    free_before = mgr.num_free_blocks()
    new = mgr.allocate_slots(b, 0, num, hits)
    assert new is not None and list(new) == [], (
        f"allocate_slots(b, 0, 12, {list(hits)}) returned {new}: expected no new block")
    assert list(mgr.get_block_ids("b")) == list(hits)
    assert mgr.num_free_blocks() == free_before - 3, "the 3 hits leave the free queue"


def _hybrid_edge_needs(sc: HybridEdgeScenario, spec: KVCacheSpec) -> list[str]:
    """The capabilities ``sc`` needs: its groups' (``group_capabilities``), and ``eagle``,
    ``prefill_lookahead``, ``fine_grained_hits``, ``external_kv``, ``lookahead``,
    ``multi_token_decode``, ``admission_gates``, ``async_scheduling`` (tokens in flight),
    ``reset_prefix_cache``, ``evict_blocks`` and ``caching_off`` where it uses them (an
    admission cap's ``max_in_flight_tokens``: ``admission_gates``)."""
    needs = set(group_capabilities(spec))
    if sc.use_eagle:
        needs.add("eagle")
    if sc.num_prefill_lookahead > 1:
        needs.add("prefill_lookahead")
    if fine_grained_hits(spec):
        needs.add(FINE_GRAINED)
    for op in sc.ops:
        if op.get("external"):
            needs.add("external_kv")
        if op.get("lookahead"):
            needs.add("lookahead")
        if op["op"] == "decode" and op.get("num_tokens", 1) > 1:
            needs.add("multi_token_decode")
        gates = op.get("gates")
        if isinstance(gates, dict):
            if "num_in_flight_tokens" in gates:
                needs.add("async_scheduling")
            if gates.keys() - {"num_in_flight_tokens"}:
                needs.add("admission_gates")
        if op["op"] == "reset":
            needs.add("reset_prefix_cache")
        if op["op"] == "evict":
            needs.add("evict_blocks")
    if not sc.caching:
        needs.add("caching_off")
    if sc.max_in_flight_tokens is not None:
        needs.add("admission_gates")
    return sorted(needs)


@pytest.mark.kv_capability("prefix_caching")
@pytest.mark.parametrize("sc", [pytest.param(sc, marks=pytest.mark.kv_profiles(sc.profile))
                                for sc in HYBRID_EDGE_SCENARIOS], ids=lambda sc: sc.name)
def test_hybrid_edge_golden(kv_impl: ImplHandle, kv_pair: PairFactory, kv_oracle: ImplHandle,
                            sc: HybridEdgeScenario) -> None:
    """Each op's answer as vLLM's own ``KVCacheManager`` gave it (0.33.0, or 0.10.2 for a
    scenario of that profile, each run under its own), the copies drained and the free queue
    after the last op, on a hybrid layout's path no other golden reached
    (``kvcheck.conformance.hybrid_edge_golden``); every answer also equals the oracle's when
    it declares what the scenario needs."""
    spec = sc.spec()
    needs = _hybrid_edge_needs(sc, spec)
    skip_unless_declared(kv_impl, needs)
    pair = kv_pair(spec, with_oracle=all(kv_oracle.has(c) for c in needs))
    where = f"{sc.name} ({sc.why})"
    assert_answers(pair, where, sc.ops, sc.recorded.answers, source=sc.source)
    assert tuple(pair.impl.drained) == sc.recorded.copies, (
        f"{where}: copies drained {pair.impl.drained}, {sc.source} "
        f"{list(sc.recorded.copies)} ((src, dst) pairs of take_kv_cache_block_copies, in "
        "order)\n" + pair.impl.snippet())
    assert_free_queue(pair, sc.name, sc.recorded.free_queue, source=sc.source)
