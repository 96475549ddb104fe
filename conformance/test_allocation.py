"""Allocation: capacity, the null block, initial order, all-or-nothing, ref counts.

Every test drives the implementation and the reference in lockstep (``kv_pair``), so any
divergence in answers or declared observables fails with a runnable repro. Capacities are
sized from the fresh pool's ``num_free_blocks()``, never from ``num_blocks - 1``: only the
blocks a design declares reserved (``reserved_block_ids``) are missing from it. Workloads are
stated in blocks (``kvcheck.conformance.sizes.tokens``): each test runs at the block size the
implementation declares (``kv_sizes``), the sizes written here under the vLLM profiles.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from kvcheck.conformance.cache_refs import allowed_ref_cnts
from kvcheck.conformance.groups import one_group, one_group_tables
from kvcheck.conformance.ops import add, decode, free, one_token_decodes, schedule
from kvcheck.conformance.pinning import probe_computed_blocks
from kvcheck.conformance.protocol import RequestView, effective_capabilities, reserved_block_ids
from kvcheck.conformance.sizes import tokens

if TYPE_CHECKING:
    from kvcheck.conformance.differential import PairFactory
    from kvcheck.conformance.loader import ImplHandle
    from kvcheck.conformance.sizes import DeclaredSizes


@pytest.mark.kv_generic
def test_first_allocation(kv_pair: PairFactory) -> None:
    """A fresh pool hands out block ids from 1 in ascending order (block 0 is the null block)."""
    pair = kv_pair(num_blocks=10, block_size=4)
    pair.run([add("r0", range(tokens(3, pair.spec.block_size, 2))), schedule("r0")])
    if pair.spec.profile != "generic":
        assert one_group_tables(pair.impl.tables()) == {"r0": [1, 2, 3, 4]}, (
            "expected the first allocation to be [1, 2, 3, 4]\n" + pair.impl.snippet())


@pytest.mark.kv_generic
def test_initial_free_count(kv_impl: ImplHandle, kv_profile: str,
                            kv_sizes: DeclaredSizes) -> None:
    """num_free_blocks() of a fresh pool is num_blocks minus the reserved blocks (vLLM: the
    null block; under generic only the ids IMPL_INFO.reserved_block_ids declares)."""
    reserved = reserved_block_ids(kv_impl.info, kv_profile)
    pools = sorted({kv_sizes.num_blocks(n) for n in (2, 7, 64)})
    specs = [kv_sizes.spec(num_blocks=n, block_size=16, profile=kv_profile) for n in pools]
    # Only under a vLLM profile, where the sizes written here stay, can none be declared.
    specs = [spec for spec in specs if kv_impl.info.supports(spec)]
    if not specs:
        pytest.skip("IMPL_INFO declares none of the pool sizes 2, 7, 64 of 16-token blocks")
    for spec in specs:
        num_blocks = spec.num_blocks
        got = kv_impl.make_manager(spec).num_free_blocks()
        want = num_blocks - len([b for b in reserved if b < num_blocks])
        assert got == want, (
            f"a fresh {num_blocks}-block pool reports num_free_blocks()={got}, expected "
            f"{want} (every block but the reserved ones, {list(reserved)}; declare "
            f"IMPL_INFO.reserved_block_ids if the design reserves others)")


@pytest.mark.kv_generic
def test_capacity_exact_fit_then_none(kv_pair: PairFactory) -> None:
    """A request needing exactly every free block of the fresh pool fits; one more token
    returns None."""
    pair = kv_pair(num_blocks=6, block_size=4)
    capacity, bs = pair.impl.initial_free, pair.spec.block_size
    pair.run([add("big", range(tokens(capacity, bs))), schedule("big"), add("one", [99, 98]),
              schedule("one")])
    assert "big" in pair.impl.running, (
        f"a request of {tokens(capacity, bs)} tokens must fit a fresh pool of {capacity} free "
        f"blocks of {bs}\n" + pair.impl.snippet())
    assert "one" not in pair.impl.running, "allocation into a full pool must return None"
    assert pair.impl.manager.num_free_blocks() == 0


def test_a_step_needing_no_block_runs_in_a_full_pool(kv_pair: PairFactory) -> None:
    """With no free block left, a running request's decode that fits in its last block still
    runs: it needs no block (vLLM 0.33 clamps a running request's count at 0; 0.10.2's is 0)."""
    pair = kv_pair(num_blocks=6, block_size=4)
    capacity, bs = pair.impl.initial_free, pair.spec.block_size
    # 'r' holds 2 blocks with room for 3 more tokens in the last; 'hog' takes the rest.
    pair.run([add("r", range(tokens(2, bs, -3))), schedule("r"),
              add("hog", range(100, 100 + tokens(capacity - 2, bs))), schedule("hog")])
    assert pair.impl.manager.num_free_blocks() == 0
    got = one_group(pair.apply(decode("r")))
    assert got["new"] == [], (
        f"a decode inside the last block of a full pool returned {got['new']} (None: refused)"
        "\n" + pair.impl.snippet())


@pytest.mark.kv_generic
def test_all_or_nothing(kv_pair: PairFactory) -> None:
    """allocate_slots returns None and changes nothing when the pool is short, even for a
    request whose prefix hits sit in the free queue."""
    pair = kv_pair(num_blocks=8, block_size=4)
    others, bs = pair.impl.initial_free - 4, pair.spec.block_size  # vLLM: 7 free blocks, so 3
    pair.run([
        add("a", range(tokens(3, bs))), schedule("a"), free("a"),  # 3 cached blocks, now free
        add("b", range(100, 100 + tokens(others, bs))), schedule("b"),  # all but 4 free blocks
        # 3 free hits + 3 new blocks consume 6 free blocks; only 4 are free.
        add("c", list(range(tokens(3, bs))) + list(range(200, 200 + tokens(3, bs)))),
    ])
    before = (pair.impl.manager.num_free_blocks(), one_group_tables(pair.impl.tables()))
    pair.apply(schedule("c"))
    assert (pair.impl.manager.num_free_blocks(), one_group_tables(pair.impl.tables())) == before, (
        "a failed allocate_slots changed the pool\n" + pair.impl.snippet())
    assert "c" not in pair.impl.running
    # The same request fits once "b" is gone, and its hits were not disturbed.
    pair.run([free("b"), schedule("c")])
    assert "c" in pair.impl.running


def test_null_block_never_handed_out(kv_pair: PairFactory) -> None:
    """Draining and refilling the pool never hands out block 0."""
    pair = kv_pair(num_blocks=5, block_size=2)
    for round_ in range(3):
        pair.run([add(f"x{round_}", range(round_, round_ + 8)), schedule(f"x{round_}")])
        assert 0 not in pair.impl.tables()[f"x{round_}"][0]
        pair.apply(free(f"x{round_}"))


@pytest.mark.kv_generic
def test_returns_only_new_blocks(kv_pair: PairFactory) -> None:
    """allocate_slots returns the newly allocated blocks only, not the prefix hits (of a
    running request, or of a finished one without caches_running_requests)."""
    pair = kv_pair(num_blocks=12, block_size=4)
    bs = pair.spec.block_size
    pair.run([add("a", range(tokens(2, bs, 2))), schedule("a")])
    if "caches_running_requests" not in pair.impl.capabilities:
        pair.apply(free("a"))  # a design caching at finish: a's blocks are cached now
    pair.apply(add("b", list(range(tokens(2, bs))) + [77, 78, 79]))
    got = one_group(pair.apply(schedule("b")))
    hits, _ = got["hits"]
    assert got["new"] is not None and not set(got["new"]) & set(hits), (
        f"hits {hits} must not be returned as new blocks {got['new']}")


@pytest.mark.kv_generic
def test_decode_within_block_allocates_nothing(kv_pair: PairFactory,
                                               kv_sizes: DeclaredSizes) -> None:
    """Decode tokens that fit in the last block need no new block; the next one does (at the
    declared block size and a larger one)."""
    for block_size in kv_sizes.block_sizes_for(4):
        pair = kv_pair(num_blocks=10, block_size=block_size)
        # The last block holds all but 3 tokens: 3 decodes fill it.
        pair.run([add("r", range(tokens(2, block_size, -3))), schedule("r")])
        for _ in range(3):
            got = one_group(pair.apply(decode("r")))
            assert got["new"] == [], (
                f"block size {block_size}: a decode inside block 2 allocated {got['new']}")
        got = one_group(pair.apply(decode("r")))
        assert got["new"] is not None and len(got["new"]) == 1, (
            f"block size {block_size}: the decode past block 2 allocated {got['new']}")


@pytest.mark.kv_generic
def test_chunked_prefill_matches(kv_pair: PairFactory) -> None:
    """A prompt scheduled in chunks allocates the same blocks, in the same order (under
    generic: the laws hold through chunked prefill and decode)."""
    pair = kv_pair(num_blocks=16, block_size=4)
    bs = pair.spec.block_size
    # Chunks ending one and three tokens into a block, then the rest (5 + 7 + 11 at 4).
    pair.run(one_token_decodes([add("r", range(tokens(5, bs, 3))), schedule("r", bs + 1),
                                schedule("r", bs + 3), schedule("r", tokens(3, bs, -1)),
                                decode("r", 3)],
                               "multi_token_decode" in pair.impl.capabilities))


@pytest.mark.kv_generic
@pytest.mark.kv_capability("ref_counts", "prefix_caching")
def test_ref_counts_follow_sharing(kv_pair: PairFactory) -> None:
    """Full blocks shared by a prefix hit have ref_cnt 2; private blocks 1; freed ones 0.
    Without caches_running_requests the shared blocks are those a finished request cached."""
    pair = kv_pair(num_blocks=12, block_size=4)
    common = list(range(tokens(3, pair.spec.block_size)))
    if "caches_running_requests" not in pair.impl.capabilities:
        pair.run([add("w", common + [5]), schedule("w"), free("w")])  # cached at finish
    pair.run([add("a", common + [1, 2]), schedule("a"), add("b", common + [3]), schedule("b")])
    mgr = pair.impl.manager
    a, b = pair.impl.tables()["a"][0], pair.impl.tables()["b"][0]
    assert a[:3] == b[:3], "b should reuse a's three full blocks"
    # A design whose ref_cnt counts its cache's reference (ImplInfo.ref_cnt_counts_cache)
    # may add one to the full blocks, which it may still cache: kvcheck.conformance.cache_refs.
    info = pair.impl.impl.info
    shared, alone = (allowed_ref_cnts(info, n, cached=True) for n in (2, 1))
    got = [mgr.ref_cnt(x) for x in a[:3]]
    assert all(rc in shared for rc in got), f"shared full blocks: ref_cnt {got}, {set(shared)}"
    assert mgr.ref_cnt(a[3]) == 1 and mgr.ref_cnt(b[3]) == 1
    pair.apply(free("a"))
    got = [mgr.ref_cnt(x) for x in a[:3]]
    assert all(rc in alone for rc in got), f"b's full blocks: ref_cnt {got}, {set(alone)}"
    assert mgr.ref_cnt(a[3]) == 0


@pytest.mark.kv_generic
@pytest.mark.kv_capability("lookahead", "prefix_caching")
def test_lookahead_slots(kv_impl: ImplHandle, kv_profile: str,
                        kv_sizes: DeclaredSizes) -> None:
    """Lookahead slots are allocated but their tokens are never cached (looked up while the
    request runs, or once it finished without caches_running_requests)."""
    spec = kv_sizes.spec(num_blocks=10, block_size=4, profile=kv_profile)
    bs = spec.block_size
    mgr = kv_impl.make_manager(spec)
    view = RequestView("r", tuple(range(tokens(1, bs))))
    new = mgr.allocate_slots(view, bs, 0, [], bs - 1)
    assert new is not None and len(new) == 2, (
        f"{bs} tokens + {bs - 1} lookahead need 2 blocks, got {new}")
    if "caches_running_requests" not in effective_capabilities(kv_impl.info, kv_profile):
        mgr.free("r")  # a design caching at finish: r's computed blocks are cached now
    other = RequestView("o", tuple(range(tokens(1, bs))) + (9,))
    hits, num = probe_computed_blocks(mgr, other)  # looked up only (pins released)
    assert num == bs and list(hits) == list(new[:1]), (
        f"the full first block is cached, the lookahead one not: got {(list(hits), num)}")
