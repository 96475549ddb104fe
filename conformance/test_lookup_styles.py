"""Lookup styles and ref-count conventions (issue 24 items 5 and 6).

A design's ``get_computed_blocks`` either has no side effects (vLLM's style) or, with the
capability ``pinning_lookup``, pins its hits as radix and trie caches do
(``kvcheck.conformance.pinning``): the suite then follows every lookup with ``allocate_slots``
or ``release_computed(request_id)``, and the laws count a pinned block as held by the request
that looked it up. These scenarios make sure the questions are asked, in a few ops each: a
pinned hit is neither free nor lost, a refused admission and a lookup the scheduler does not
follow give their pins back, two lookups pin the same blocks twice, and a pinned block is
never evicted to make room for another request.

``ref_cnt`` counts the requests holding a block, and with ``ImplInfo.ref_cnt_counts_cache``
maybe the cache's own reference (``kvcheck.conformance.cache_refs``); in both conventions a
cached block nobody holds is free.

Every scenario lets a first request finish before its blocks are looked up, so it holds for a
design that caches only at finish (without ``caches_running_requests``), and states its
workload in blocks at the design's own block size (``kv_pair``, ``tokens``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from kvcheck.conformance.cache_refs import allowed_ref_cnts
from kvcheck.conformance.groups import one_group
from kvcheck.conformance.laws import check_laws
from kvcheck.conformance.ops import add, free, lookup, schedule
from kvcheck.conformance.sizes import tokens

if TYPE_CHECKING:
    from kvcheck.conformance.differential import Pair, PairFactory

#: Full blocks of the cached prompt (it has one token more: a full hit is all of them).
NUM_FULL = 3


def _cache_prompt(pair: Pair, rid: str = "a") -> list[int]:
    """A request of ``NUM_FULL`` full blocks and one token runs and finishes: its full blocks
    are cached (also in a design that caches at finish) and nobody holds them. Returns its
    prompt."""
    prompt = list(range(1, tokens(NUM_FULL, pair.spec.block_size, 1) + 1))
    pair.run([add(rid, prompt), schedule(rid), free(rid)])
    return prompt


def _laws(pair: Pair, when: str) -> None:
    """The laws hold now (between calls the Pair does not check by itself)."""
    __tracebackhide__ = True
    problems = check_laws(pair.impl)
    assert not problems, f"{when}: " + "; ".join(problems) + "\n" + pair.impl.snippet()


@pytest.mark.kv_generic
@pytest.mark.kv_capability("pinning_lookup", "prefix_caching")
def test_pinned_hits_are_held_until_released(kv_pair: PairFactory) -> None:
    """Between a lookup and ``release_computed`` the hits are held by the request that looked
    them up (``num_free_blocks()`` leaves them out); the release gives them back, and they
    still hit."""
    pair = kv_pair(num_blocks=10, block_size=4, with_oracle=False)
    bs, mgr = pair.spec.block_size, pair.impl.manager
    prompt = _cache_prompt(pair)
    pair.apply(add("b", prompt))
    before = mgr.num_free_blocks()
    hits, num = mgr.get_computed_blocks(pair.impl.views["b"])
    assert (len(hits), num) == (NUM_FULL, tokens(NUM_FULL, bs)), (
        f"b should hit a's {NUM_FULL} cached blocks, got {(list(hits), num)}")
    _laws(pair, "after the lookup (its hits pinned)")
    assert mgr.num_free_blocks() == before - NUM_FULL, (
        f"num_free_blocks() is {mgr.num_free_blocks()} with b's {NUM_FULL} hits pinned, "
        f"{before} before: a pinned block is held, not free")
    mgr.release_computed("b")
    _laws(pair, "after release_computed('b')")
    assert mgr.num_free_blocks() == before, (
        f"num_free_blocks() is {mgr.num_free_blocks()} after release_computed('b'), {before} "
        "before the lookup: the pins were not all dropped")
    got = one_group(pair.apply(schedule("b")))
    assert got["hits"] == (list(hits), num), (
        f"after the release b hits {got['hits']}, before it {(list(hits), num)}: releasing "
        "pins must not drop cached blocks\n" + pair.impl.snippet())


@pytest.mark.kv_generic
@pytest.mark.kv_capability("pinning_lookup", "prefix_caching")
def test_refused_admission_releases_its_pins(kv_pair: PairFactory) -> None:
    """A request that hits cached blocks but does not fit is refused; the suite releases its
    lookup (``release_computed``) and the pool is as before, however often it is tried. The
    cached blocks still hit for a request that fits."""
    pair = kv_pair(num_blocks=8, block_size=4, with_oracle=False)
    bs, mgr = pair.spec.block_size, pair.impl.manager
    prompt = _cache_prompt(pair)
    before = mgr.num_free_blocks()
    prefix = prompt[:tokens(NUM_FULL, bs)]
    pair.apply(add("big", prefix + [7] * tokens(pair.spec.num_blocks + 1, bs)))
    for attempt in range(3):
        got = one_group(pair.apply(schedule("big")))
        assert got["new"] is None and got["hits"][1] == tokens(NUM_FULL, bs), (
            f"attempt {attempt}: big (more blocks than the pool) should hit {NUM_FULL} blocks "
            f"and be refused, got {got}\n" + pair.impl.snippet())
        assert mgr.num_free_blocks() == before, (
            f"attempt {attempt}: num_free_blocks() is {mgr.num_free_blocks()} after a refused "
            f"admission and release_computed, {before} before\n" + pair.impl.snippet())
    pair.apply(add("c", prefix + [9]))
    got = one_group(pair.apply(schedule("c")))
    assert got["new"] is not None and got["hits"][1] == tokens(NUM_FULL, bs), (
        f"c should be admitted on a's {NUM_FULL} cached blocks, got {got}")


@pytest.mark.kv_generic
@pytest.mark.kv_capability("pinning_lookup", "prefix_caching")
def test_lookup_without_allocation_is_released(kv_pair: PairFactory) -> None:
    """A scheduler that looks a request up and then schedules nothing for it (a ``lookup`` op:
    the lookup, then ``release_computed``) changes nothing, however often it does."""
    pair = kv_pair(num_blocks=10, block_size=4, with_oracle=False)
    bs, mgr = pair.spec.block_size, pair.impl.manager
    prompt = _cache_prompt(pair)
    before = mgr.num_free_blocks()
    pair.apply(add("b", prompt))
    for attempt in range(3):
        got = one_group(pair.apply(lookup("b")))
        assert got["hits"][1] == tokens(NUM_FULL, bs), (
            f"attempt {attempt}: b should hit {NUM_FULL} blocks, got {got}")
        assert mgr.num_free_blocks() == before, (
            f"attempt {attempt}: num_free_blocks() is {mgr.num_free_blocks()} after a lookup "
            f"and release_computed, {before} before\n" + pair.impl.snippet())
    got = one_group(pair.apply(schedule("b")))
    assert got["new"] is not None and got["hits"][1] == tokens(NUM_FULL, bs), got


@pytest.mark.kv_generic
@pytest.mark.kv_capability("pinning_lookup", "prefix_caching")
def test_two_lookups_pin_the_same_blocks(kv_pair: PairFactory) -> None:
    """Two outstanding lookups of one prefix pin its blocks twice (``ref_cnt`` counts both,
    with ``ref_counts``); each release drops its own pins only."""
    pair = kv_pair(num_blocks=10, block_size=4, with_oracle=False)
    mgr = pair.impl.manager
    prompt = _cache_prompt(pair)
    before = mgr.num_free_blocks()
    pair.run([add("b", prompt), add("c", prompt)])
    hits_b, _ = mgr.get_computed_blocks(pair.impl.views["b"])
    hits_c, _ = mgr.get_computed_blocks(pair.impl.views["c"])
    assert list(hits_b) == list(hits_c) and len(hits_b) == NUM_FULL, (hits_b, hits_c)
    _laws(pair, "with b's and c's lookups outstanding")
    assert mgr.num_free_blocks() == before - NUM_FULL, (
        f"num_free_blocks() is {mgr.num_free_blocks()}: {NUM_FULL} distinct blocks are pinned "
        f"(by two lookups), {before} were free before")
    mgr.release_computed("b")
    _laws(pair, "after release_computed('b'), c's lookup outstanding")
    assert mgr.num_free_blocks() == before - NUM_FULL, (
        "release_computed('b') freed blocks c's lookup still pins")
    mgr.release_computed("c")
    _laws(pair, "after both releases")
    assert mgr.num_free_blocks() == before


@pytest.mark.kv_generic
@pytest.mark.kv_capability("pinning_lookup", "prefix_caching")
def test_pinned_block_is_never_evicted(kv_pair: PairFactory) -> None:
    """While b's lookup pins a's cached blocks, another request that takes every free block
    gets none of them (the guard refuses a pinned block handed out anew) and one more request
    is refused; once b is released and the pool drained, its blocks still hit."""
    pair = kv_pair(num_blocks=10, block_size=4, with_oracle=False)
    bs, mgr = pair.spec.block_size, pair.impl.manager
    prompt = _cache_prompt(pair)
    pair.apply(add("b", prompt))
    hits, num = mgr.get_computed_blocks(pair.impl.views["b"])
    room = mgr.num_free_blocks()
    pair.apply(add("hog", [100_000 + i for i in range(tokens(room, bs))]))
    # The laws and the guard judge it with b's pins outstanding.
    got = one_group(pair.apply(schedule("hog")))
    assert got["new"] is not None and not set(got["new"]) & set(hits), (
        f"hog asked for the {room} free blocks with b's hits {list(hits)} pinned: got {got}")
    pair.apply(add("late", [200_000]))
    assert one_group(pair.apply(schedule("late")))["new"] is None, (
        "the pool is full but for pinned blocks: a new request must be refused")
    mgr.release_computed("b")
    pair.run([free("hog"), free("late")])
    _laws(pair, "after the release and the drain")
    assert one_group(pair.apply(schedule("b")))["hits"] == (list(hits), num), (
        f"b's hits {list(hits)} were evicted while pinned\n" + pair.impl.snippet())


@pytest.mark.kv_generic
@pytest.mark.kv_capability("ref_counts", "prefix_caching")
def test_cached_blocks_nobody_holds_are_free(kv_pair: PairFactory) -> None:
    """A finished request's cached full blocks are free (``num_free_blocks()`` is back to the
    fresh pool's) with ``ref_cnt`` 0, or 1 where ``ImplInfo.ref_cnt_counts_cache`` says the
    cache's own reference is counted; its partial last block has ref_cnt 0 either way. While
    it runs, each block it holds counts it once (plus the cache's reference where allowed)."""
    pair = kv_pair(num_blocks=10, block_size=4)
    mgr, info = pair.impl.manager, pair.impl.impl.info
    initial = mgr.num_free_blocks()
    prompt = list(range(1, tokens(NUM_FULL, pair.spec.block_size, 1) + 1))
    pair.run([add("a", prompt), schedule("a")])
    table = pair.impl.tables()["a"][0]
    full, partial = table[:NUM_FULL], table[NUM_FULL]
    running = allowed_ref_cnts(info, 1, cached=True)
    got = [mgr.ref_cnt(b) for b in full]
    assert all(rc in running for rc in got), (
        f"a's full blocks {full} while a runs: ref_cnt {got}, expected each in "
        f"{sorted(running)}")
    assert mgr.ref_cnt(partial) == 1, f"a's partial block {partial}: ref_cnt {mgr.ref_cnt(partial)}"
    pair.apply(free("a"))
    assert mgr.num_free_blocks() == initial, (
        f"num_free_blocks() is {mgr.num_free_blocks()} after a finished, {initial} fresh: "
        "cached blocks nobody holds are free (evictable), whatever ref_cnt counts")
    idle = allowed_ref_cnts(info, 0, cached=True)
    got = [mgr.ref_cnt(b) for b in full]
    assert all(rc in idle for rc in got), (
        f"a's cached blocks {full} after a finished: ref_cnt {got}, expected each in "
        f"{sorted(idle)} (ImplInfo.ref_cnt_counts_cache={info.ref_cnt_counts_cache})")
    assert mgr.ref_cnt(partial) == 0, (
        f"a's partial block {partial} after a finished: ref_cnt {mgr.ref_cnt(partial)}, "
        "expected 0 (a partial block is never cached)")
