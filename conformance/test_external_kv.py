"""KV from outside the pool (capabilities ``external_kv`` and ``evict_blocks``): a KV
connector's tokens, caching after an asynchronous load, failed loads and ``evict_blocks``
(docs/semantics.md#external-kv-connector-tokens).

``allocate_slots(..., num_external_computed_tokens=E, delay_cache_blocks=...)`` gives the E
tokens after a request's local hit fresh blocks; an asynchronous load (``delay_cache_blocks``)
caches nothing until ``cache_blocks``. The laws are vLLM 0.33.0's (and 0.10.2's, whose
scheduler passes external tokens as new ones), read from its ``kv_cache_manager.py``,
``kv_cache_coordinator.py`` and scheduler and checked against both releases through the vLLM
adapter (``--kv-impl=vllm``, or ``--kv-oracle=vllm`` for the reference):

* a delayed allocation caches nothing, emits no ``BlockStored`` and changes no other request's
  hits until ``cache_blocks``; then exactly the full blocks of ``[0, L+E)`` are cached, in one
  ``BlockStored`` whose parent is the last block cached before;
* a synchronous load caches its blocks in the same call;
* all or nothing: a refused call changes nothing;
* the external tokens' blocks are fresh: never one of the request's own hits, in any group
  (vLLM #43884, fixed by the two-phase allocation of PR #44409), and the free count drops by
  exactly the blocks taken (vLLM PR #46892);
* ``evict_blocks``: the keys go (one ``BlockRemoved`` each), nothing else changes;
* recovery after a failed load: the valid prefix is cached, or (none valid) everything freed;
* random workloads with external hits, asynchronous loads, failures and evictions match the
  oracle after every call (``test_random_external_kv_workloads_match_reference``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcheck.conformance.groups import NULL_BLOCK, one_group
from kvcheck.conformance.guard import read_ref_cnts
from kvcheck.conformance.ops import Op, add, cache, decode, evict, free, schedule
from kvcheck.conformance.protocol import (
    VLLM_PROFILES,
    KVCacheGroupSpec,
    KVEvent,
    effective_capabilities,
)

if TYPE_CHECKING:
    from hypothesis import settings as Settings

    from kvcheck.conformance.differential import Pair, PairFactory
    from kvcheck.conformance.loader import ImplHandle

pytestmark = [pytest.mark.kv_capability("manager", "external_kv"), pytest.mark.kv_generic]

#: A full-attention group and a sliding-window group of the same block size (4 tokens, a
#: window of 8): both releases accept it with caching and events.
_WINDOWED = (KVCacheGroupSpec("full_attention", 4), KVCacheGroupSpec("sliding_window", 4,
                                                                     sliding_window=8))


def _events(pair: Pair) -> list[KVEvent]:
    """The implementation's events since the last drain ([] without the capability)."""
    if "events" not in pair.impl.capabilities:
        return []
    return list(pair.impl.manager.take_events())


def _stored(events: list[KVEvent]) -> list[KVEvent]:
    return [e for e in events if e["type"] == "BlockStored"]


def _hit_tokens(pair: Pair, prompt: list[int], rid: str) -> int:
    """Tokens a fresh request with ``prompt`` would hit now (a lookup that is not
    followed by an allocation)."""
    pair.apply(add(rid, prompt))
    return pair.impl.manager.get_computed_blocks_per_group(pair.impl.views[rid])[1]


def _need_events(pair: Pair) -> None:
    if "events" not in pair.impl.capabilities:
        pytest.skip("needs the events capability to see what was cached")


def test_delayed_load_caches_nothing_until_cache_blocks(kv_pair: PairFactory) -> None:
    """Law 1-2: ``delay_cache_blocks=True`` caches nothing and changes no other request's
    hits; ``cache_blocks(L+E)`` then caches exactly the full blocks of ``[0, L+E)`` in one
    ``BlockStored`` whose parent is the last block cached before (here the local hit's)."""
    pair = kv_pair(num_blocks=24, block_size=4, enable_kv_cache_events=True, with_oracle=False)
    _need_events(pair)
    bs = pair.spec.block_size
    prompt = list(range(1, 8 * bs + 3))
    pair.run([add("local", prompt[:2 * bs + 1]), schedule("local"), free("local")])
    before = _stored(_events(pair))
    assert before, "a computed prompt of 2 full blocks must be cached (BlockStored)"
    parent = before[-1]["block_hashes"][-1]
    pair.apply(add("a", prompt))
    got = one_group(pair.apply(schedule("a", external=4 * bs, delay=True)))
    assert got["hits"][1] == 2 * bs, f"the local hit must be the 2 cached blocks, got {got}"
    assert got["new"] is not None and len(got["new"]) == 4, (
        f"4 fresh blocks for 4 blocks of external tokens, got {got['new']}\n"
        + pair.impl.snippet())
    assert not _stored(_events(pair)), (
        "a delayed (asynchronous-load) allocation must store nothing\n" + pair.impl.snippet())
    assert _hit_tokens(pair, prompt, "probe") == 2 * bs, (
        "another request must still hit only the local 2 blocks while the load is pending\n"
        + pair.impl.snippet())
    pair.apply(cache("a", 6 * bs))
    stored = _stored(_events(pair))
    assert len(stored) == 1 and len(stored[0]["block_hashes"]) == 4, (
        f"cache_blocks(6 blocks of tokens) must store the 4 loaded blocks in one BlockStored,"
        f" got {stored}\n" + pair.impl.snippet())
    assert stored[0]["parent_block_hash"] == parent, (
        "the stored blocks' parent must be the last block cached before (the local hit's "
        f"last), got {stored[0]['parent_block_hash']!r}, expected {parent!r}")
    assert _hit_tokens(pair, prompt, "probe2") == 6 * bs, (
        "after cache_blocks a request with the same prompt hits the loaded blocks\n"
        + pair.impl.snippet())


def test_sync_load_caches_in_the_same_call(kv_pair: PairFactory) -> None:
    """Law 3: a synchronous load (no delay) caches the external tokens' full blocks, and the
    new tokens', in the allocation itself."""
    pair = kv_pair(num_blocks=24, block_size=4, enable_kv_cache_events=True, with_oracle=False)
    bs = pair.spec.block_size
    prompt = list(range(1, 6 * bs + 2))
    pair.apply(add("a", prompt))
    got = one_group(pair.apply(schedule("a", external=3 * bs)))
    assert got["new"] is not None and len(got["new"]) == 7, (
        f"7 blocks for {len(prompt)} tokens, got {got['new']}")
    stored = _stored(_events(pair))
    if "events" in pair.impl.capabilities:
        assert sum(len(e["block_hashes"]) for e in stored) == 6, (
            f"the 6 full blocks must be stored in the call, got {stored}\n" + pair.impl.snippet())
    assert _hit_tokens(pair, prompt, "probe") == 6 * bs, (
        "a request with the same prompt hits all 6 full blocks at once\n" + pair.impl.snippet())


def test_zero_new_tokens_legal_with_external_tokens(kv_pair: PairFactory) -> None:
    """vLLM 0.33 raises only when nothing at all is to be adopted: an asynchronous load
    allocates for its external tokens with ``num_new_tokens=0``."""
    pair = kv_pair(num_blocks=16, block_size=4, with_oracle=False)
    bs = pair.spec.block_size
    pair.apply(add("a", list(range(1, 3 * bs + 1))))
    new = pair.impl.manager.allocate_slots_per_group(
        pair.impl.views["a"], 0, 0, [[]], num_external_computed_tokens=2 * bs,
        delay_cache_blocks=True)
    assert new is not None and len(new[0]) == 2, f"2 blocks for 2 blocks of external tokens, {new}"


def test_refused_external_allocation_changes_nothing(kv_pair: PairFactory) -> None:
    """Law 4: all or nothing with external tokens: when the pool cannot hold the external and
    new tokens the call returns None and no count, reference or queue position changed."""
    pair = kv_pair(num_blocks=10, block_size=4, with_oracle=False)
    bs = pair.spec.block_size
    prompt = list(range(1, 4 * bs + 2))
    pair.run([add("warm", prompt[:2 * bs + 1]), schedule("warm"), free("warm")])
    pair.run([add("hog", list(range(500, 500 + 5 * bs))), schedule("hog")])
    m = pair.impl.manager
    ids = list(pair.impl.ordinary_block_ids)
    queue = (list(m.free_block_ids()) if "free_queue_order" in pair.impl.capabilities else None)
    free_before, refs = m.num_free_blocks(), (read_ref_cnts(m, ids) if "ref_counts" in
                                               pair.impl.capabilities else None)
    pair.apply(add("a", prompt))
    got = one_group(pair.apply(schedule("a", external=2 * bs)))
    assert got["hits"][1] == 2 * bs and got["new"] is None, (
        f"2 hit blocks + 3 more do not fit 2 free ones: expected None, got {got}\n"
        + pair.impl.snippet())
    assert m.num_free_blocks() == free_before, "a refused call must free or take nothing"
    if refs is not None:
        assert read_ref_cnts(m, ids) == refs, "a refused call must touch no hit"
    if queue is not None:
        assert list(m.free_block_ids()) == queue, "a refused call must not reorder the queue"


def test_external_blocks_are_fresh_and_counted(kv_pair: PairFactory) -> None:
    """Law 4-5 (vLLM PR #46892): the external tokens' blocks are none of the request's hits
    nor another request's, and the free count drops by exactly the blocks taken: the new ones
    plus the hits that were sitting in the free queue."""
    pair = kv_pair(num_blocks=20, block_size=4, with_oracle=False)
    bs = pair.spec.block_size
    prompt = list(range(1, 7 * bs + 2))
    pair.run([add("warm", prompt[:3 * bs + 1]), schedule("warm"), free("warm"),
              add("other", list(range(900, 900 + 2 * bs))), schedule("other")])
    m = pair.impl.manager
    free_before = m.num_free_blocks()
    pair.apply(add("a", prompt))
    got = one_group(pair.apply(schedule("a", external=2 * bs)))
    hits, new = got["hits"][0], got["new"]
    assert new is not None and not set(new) & set(hits), (
        f"external blocks {new} must be fresh, not the hits {hits}\n" + pair.impl.snippet())
    assert not set(new) & set(pair.impl.tables()["other"][0]), (
        "external blocks must not be another request's")
    assert free_before - m.num_free_blocks() == len(new) + len(hits), (
        f"free count dropped by {free_before - m.num_free_blocks()}, but {len(new)} new blocks"
        f" and {len(hits)} queued hits were taken\n" + pair.impl.snippet())


@pytest.mark.kv_capability("kv_cache_groups", "sliding_window")
def test_two_phase_allocation_never_evicts_another_groups_hits(kv_pair: PairFactory) -> None:
    """vLLM #43884 / PR #44409 (recurrence #50454): with several groups, one group's
    external blocks are taken only after every group touched its hits. Here the queue head
    holds the sliding-window group's hits: a one-phase allocation would evict them for the
    full-attention group's external blocks and hand out the same block twice."""
    pair = kv_pair(num_blocks=27, block_size=4, kv_cache_groups=_WINDOWED, with_oracle=True)
    prompt = list(range(1, 41))
    # 'warm' caches 8 blocks per group; freed, they queue as group 0's (reversed) then group
    # 1's (reversed); 'hog' takes every other free block. 'a' then hits all 8 of group 0's
    # and the window's last ones of group 1's, which sit at the queue head once group 0's
    # hits are touched: group 0's one external block must not be popped from among them.
    pair.run([add("warm", prompt[:32]), schedule("warm"), free("warm"),
              add("hog", list(range(700, 700 + 20))), schedule("hog")])
    pair.apply(add("a", prompt))
    got = pair.apply(schedule("a", external=4, delay=True))
    assert got["new"] is not None, f"the pool holds 'a' (11 of 16 free blocks): {got}"
    held = [b for g in pair.impl.tables()["a"] for b in g if b]
    assert len(held) == len(set(held)), (
        f"request 'a' holds a block twice across its groups: {pair.impl.tables()['a']}\n"
        + pair.impl.snippet())


@pytest.mark.kv_profiles(*VLLM_PROFILES)
@pytest.mark.kv_capability("kv_cache_groups", "sliding_window")
@pytest.mark.parametrize("num_external", [1, 3])
def test_external_blocks_of_every_group_come_before_new_blocks(
        kv_pair: PairFactory, kv_profile: str, num_external: int) -> None:
    """0.33 (PR #44409): every group takes its external tokens' blocks (phase two), even for
    a single external token, before any group takes the blocks of the new tokens (phase
    three); on a fresh pool (blocks handed out in id order) group 0 gets blocks 1 and 3, the
    window's group 2 and 4. 0.10.2's scheduler passes external tokens as new ones: one
    allocation per group, group 0 blocks 1 and 2, group 1 blocks 3 and 4."""
    pair = kv_pair(num_blocks=12, block_size=4, kv_cache_groups=_WINDOWED, with_oracle=True)
    pair.apply(add("a", list(range(1, 9))))  # 2 blocks of 4 tokens per group
    got = pair.apply(schedule("a", external=num_external))
    assert got["new"] is not None, f"a fresh pool of 11 blocks holds 'a': {got}"
    want = [[1, 3], [2, 4]] if kv_profile == "vllm-0.33" else [[1, 2], [3, 4]]
    assert pair.impl.tables()["a"] == want, (
        f"{num_external} external token(s), then {8 - num_external} new ones: tables "
        f"{pair.impl.tables()['a']}, vLLM {kv_profile[5:]}: {want}\n" + pair.impl.snippet())


@pytest.mark.kv_profiles("vllm-0.33")
@pytest.mark.kv_capability("kv_cache_groups", "sliding_window")
def test_a_window_drops_the_hits_external_tokens_pass(kv_pair: PairFactory) -> None:
    """0.33, a model of one sliding-window group (window 8, blocks of 4): the window is
    counted from the end of the local hit plus the external tokens. 'a' hits 24 cached
    tokens (4 nulls, then the window's 2 blocks) and a connector has the next 12: at 36
    computed tokens the window skips 29, so all 6 hit entries and a seventh block are nulls
    (the 2 cached blocks are not adopted), the external tokens the window still reads get 2
    fresh blocks, and the 4 new tokens 1 more."""
    groups = (KVCacheGroupSpec("sliding_window", 4, sliding_window=8),)
    pair = kv_pair(num_blocks=16, block_size=4, kv_cache_groups=groups, with_oracle=True)
    prompt = list(range(1, 41))
    pair.run([add("warm", prompt[:24]), schedule("warm"), free("warm"), add("a", prompt)])
    got = pair.apply(schedule("a", external=12))
    assert got["hits"][1] == 24, f"'a' hits the 24 tokens 'warm' cached: {got}"
    (table,) = pair.impl.tables()["a"]
    assert table[:7] == [NULL_BLOCK] * 7 and len(table) == 10 and NULL_BLOCK not in table[7:], (
        f"table {table}: 7 nulls (the window skips 29 of 36 computed tokens), then 3 fresh "
        "blocks\n" + pair.impl.snippet())


@pytest.mark.kv_profiles("vllm-0.33")
@pytest.mark.kv_capability("kv_cache_groups", "sliding_window")
def test_hits_a_window_drops_cost_no_block(kv_pair: PairFactory) -> None:
    """0.33's admission count for one sliding-window group: the blocks the window skips at
    local + external computed tokens need no block, and skipped hits that sit in the free
    queue are not counted as taken from it. 'warm' (24 tokens) decodes a token (its window
    frees its first 4 blocks) and is freed; 'hog' takes every free block but warm's last 3,
    two of which (tokens 16-23) are 'a''s hits. 'a' hits 24 tokens, a connector has 12 more
    and 4 are new: 10 slots' blocks, 7 skipped by the window, so 3 new blocks and no hit
    adopted: 3 free blocks are enough. (Counting the skipped hits in the queue asks for 5;
    0.10.2's formula, 10 - 6 + 2, for 6.)"""
    groups = (KVCacheGroupSpec("sliding_window", 4, sliding_window=8),)
    pair = kv_pair(num_blocks=12, block_size=4, kv_cache_groups=groups, with_oracle=True)
    prompt = list(range(1, 41))
    pair.run([add("warm", prompt[:24]), schedule("warm"), decode("warm", 1), free("warm"),
              add("hog", list(range(700, 732))), schedule("hog"), add("a", prompt)])
    assert pair.impl.manager.num_free_blocks() == 3
    got = pair.apply(schedule("a", external=12))
    assert got["hits"][1] == 24, f"'a' hits warm's 24 tokens: {got}"
    assert got["new"] is not None, (
        f"'a' needs 3 blocks and 3 are free: refused ({got})\n" + pair.impl.snippet())


@pytest.mark.kv_profiles("vllm-0.33")
@pytest.mark.kv_capability("kv_cache_groups", "chunked_local_attention")
def test_a_table_of_nulls_only_is_freed(kv_pair: PairFactory) -> None:
    """0.33, one chunked-local group (chunks of 8 tokens, blocks of 4): an asynchronous load
    of 16 external tokens with ``num_new_tokens=0`` (as vLLM's scheduler allocates a request
    waiting for remote KV) ends both chunks, so every block is skipped: the table is 4 nulls,
    taken from a pool with no free block left (it needs none), and freeing it (the load
    failed, the request is dropped) frees nothing."""
    groups = (KVCacheGroupSpec("chunked_local_attention", 4, attention_chunk_size=8),)
    pair = kv_pair(num_blocks=8, block_size=4, kv_cache_groups=groups, with_oracle=False)
    # Three requests of 7 tokens (2 blocks, their chunk unfinished) and one of 3 hold the
    # pool's 7 blocks.
    hogs = [(f"hog{i}", list(range(100 + 10 * i, 100 + 10 * i + n)))
            for i, n in enumerate((7, 7, 7, 3))]
    pair.run([op for rid, prompt in hogs for op in (add(rid, prompt), schedule(rid))]
             + [add("a", list(range(1, 18)))])
    m = pair.impl.manager
    free_before = m.num_free_blocks()
    assert free_before == 0, f"the other requests hold the pool's 7 blocks: {free_before} free"
    new = m.allocate_slots_per_group(pair.impl.views["a"], 0, 0, [[]],
                                     num_external_computed_tokens=16, delay_cache_blocks=True)
    table = m.get_block_ids_per_group("a")
    assert new == [[]] and table == [[NULL_BLOCK] * 4], (
        f"16 external tokens in 2 finished chunks: new {new}, table {table}")
    m.free("a")
    assert m.num_free_blocks() == free_before


@pytest.mark.kv_capability("evict_blocks")
def test_evict_blocks_drops_keys_only(kv_pair: PairFactory, kv_profile: str) -> None:
    """Law 7: ``evict_blocks`` removes every key on the blocks (one ``BlockRemoved`` each),
    held or free; ref counts, the free queue and tables stay; later lookups miss them."""
    if kv_profile == "vllm-0.10":
        pytest.skip("vLLM 0.10.2 has no evict_blocks")
    pair = kv_pair(num_blocks=16, block_size=4, enable_kv_cache_events=True, with_oracle=False)
    bs = pair.spec.block_size
    prompt = list(range(1, 4 * bs + 2))
    pair.run([add("a", prompt), schedule("a")])
    _events(pair)
    table = pair.impl.tables()["a"][0]
    m = pair.impl.manager
    refs = read_ref_cnts(m, table) if "ref_counts" in pair.impl.capabilities else None
    free_before = m.num_free_blocks()
    pair.apply(evict(table[2:4]))
    removed = [e for e in _events(pair) if e["type"] == "BlockRemoved"]
    if "events" in pair.impl.capabilities:
        assert sum(len(e["block_hashes"]) for e in removed) == 2, (
            f"evicting 2 cached blocks must remove 2 keys, got {removed}\n" + pair.impl.snippet())
    assert pair.impl.tables()["a"][0] == table, "evict_blocks must not change a table"
    assert m.num_free_blocks() == free_before, "evict_blocks must not free a held block"
    if refs is not None:
        assert read_ref_cnts(m, table) == refs, "evict_blocks must not change ref counts"
    assert _hit_tokens(pair, prompt, "probe") == 2 * bs, (
        "a lookup must stop at the first evicted block\n" + pair.impl.snippet())


@pytest.mark.parametrize("valid_blocks", [0, 2])
def test_failed_load_recovery(kv_pair: PairFactory, valid_blocks: int) -> None:
    """Law 8: after a failed asynchronous load the scheduler caches the valid prefix (then
    recomputes the rest with the same blocks), or frees everything when nothing is valid (a
    retry may then hit locally)."""
    pair = kv_pair(num_blocks=20, block_size=4, with_oracle=False)
    bs = pair.spec.block_size
    prompt = list(range(1, 5 * bs + 2))
    free_before = pair.impl.manager.num_free_blocks()
    pair.apply(add("a", prompt))
    got = one_group(pair.apply(schedule("a", external=4 * bs, delay=True)))
    assert got["new"] is not None and len(got["new"]) == 4
    pair.apply(cache("a", valid_blocks * bs))
    if valid_blocks == 0:
        assert "a" not in pair.impl.running
        assert pair.impl.manager.num_free_blocks() == free_before, (
            "with no valid prefix every block of the request must be freed")
        return
    assert _hit_tokens(pair, prompt, "probe") == valid_blocks * bs, (
        "only the valid prefix may be cached after a failed load\n" + pair.impl.snippet())
    pair.apply(schedule("a"))
    assert pair.impl.tables()["a"][0][:4] == got["new"], "the recompute keeps its blocks"
    assert _hit_tokens(pair, prompt, "probe2") == 5 * bs, (
        "once recomputed, the whole prompt is cached\n" + pair.impl.snippet())


# ---------------------------------------------------------------------- golden scenario
def _golden_ops(evicts: bool) -> list[Op]:
    """A warm-up that caches 2 blocks, an asynchronous load on top of that local hit, a
    synchronous load, the load's arrival, a decode, a load that fails after 2 blocks and its
    recompute, (0.33) ``evict_blocks`` of the local hit and a lookup that then misses, frees."""
    prompt = list(range(1, 27))
    ops: list[Op] = [add("warm", prompt[:9]), schedule("warm"), free("warm"),
           add("async", prompt), schedule("async", external=12, delay=True),
           add("sync", list(range(100, 118))), schedule("sync", external=8),
           cache("async", 20), schedule("async"), decode("async"),
           add("fail", list(range(200, 222))), schedule("fail", external=16, delay=True),
           cache("fail", 8), schedule("fail")]
    if evicts:
        ops += [evict([1, 2]), add("probe", prompt), schedule("probe")]
    return ops + [free("sync"), free("async"), free("fail")]


#: Per profile and layout: each allocation as [request, hit tokens (None: running), the
#: answer], then the free queue at the end. Recorded from vLLM 0.33.0's and 0.10.2's own
#: KVCacheManager through the vLLM adapter (the reference gives the same); block size 4, a
#: pool of 30 blocks.
GOLDEN: dict[str, dict[str, list[list[object]]]] = {
    "vllm-0.33": {
        "one_group": [
            ["warm", 0, [[1, 2, 3]]],
            ["async", 8, [[3, 4, 5]]],
            ["sync", 0, [[6, 7, 8, 9, 10]]],
            ["async", None, [[11, 12]]],
            ["async", None, [[]]],
            ["fail", 0, [[13, 14, 15, 16]]],
            ["fail", None, [[17, 18]]],
            ["probe", 0, [[19, 20, 21, 22, 23, 24, 25]]],
            ["free queue", [18, 12, 2, 1, 10, 26, 27, 28, 29, 9, 8, 7, 6, 11, 5, 4, 3, 17, 16,
             15, 14, 13]],
        ],
        "windowed": [
            ["warm", 0, [[1, 2, 3], [4, 5, 6]]],
            ["async", 8, [[6, 3, 7], [8, 9]]],
            ["sync", 0, [[10, 11, 14, 15, 16], [12, 13, 17, 18, 19]]],
            ["async", None, [[20, 21], [22, 23]]],
            ["async", None, [[], []]],
            ["fail", 0, [[24, 25, 26, 27], [28, 29]]],
            ["fail", None, None],
            ["probe", 0, None],
            ["free queue", [29, 28, 27, 26, 23, 21, 2, 1, 19, 16, 5, 4, 8, 15, 14, 11, 10, 18,
             17, 13, 12, 20, 7, 3, 6, 22, 9, 25, 24]],
        ],
    },
    "vllm-0.10": {
        "one_group": [
            ["warm", 0, [[1, 2, 3]]],
            ["async", 8, [[4, 5, 6]]],
            ["sync", 0, [[7, 8, 9, 10, 11]]],
            ["async", None, [[12, 13]]],
            ["async", None, [[]]],
            ["fail", 0, [[14, 15, 16, 17]]],
            ["fail", None, [[18, 19]]],
            ["free queue", [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 3, 11, 10, 9, 8, 7, 13, 12,
             6, 5, 4, 2, 1, 19, 18, 17, 16, 15, 14]],
        ],
        "windowed": [
            ["warm", 0, [[1, 2, 3], [4, 5, 6]]],
            ["async", 8, [[7, 8, 9], [10, 11, 12]]],
            ["sync", 0, [[13, 14, 15, 16, 17], [18, 19, 20, 21, 22]]],
            ["async", None, [[23, 24], [25, 26]]],
            ["async", None, [[], []]],
            ["fail", 0, [[27, 28, 29, 3], [6, 10, 5, 4]]],
            ["fail", None, None],
            ["free queue", [11, 17, 16, 15, 14, 13, 22, 21, 20, 19, 18, 24, 23, 9, 8, 7, 2, 1,
             26, 25, 12, 3, 29, 28, 27, 4, 5, 10, 6]],
        ],
    },
}


def _run_golden(kv_pair: PairFactory, kv_profile: str, layout: str) -> None:
    groups = _WINDOWED if layout == "windowed" else ()
    pair = kv_pair(num_blocks=30, block_size=4, kv_cache_groups=groups, with_oracle=False)
    steps: list[list[object]] = []
    for op in _golden_ops(kv_profile == "vllm-0.33"):
        got = pair.apply(op)
        if "new" in got and (op["op"] == "schedule" or op["op"] == "decode"):
            steps.append([op["rid"], got["hits"][1] if "hits" in got else None, got["new"]])
    if "free_queue_order" in pair.impl.capabilities:
        steps.append(["free queue", list(pair.impl.manager.free_block_ids())])
    want = GOLDEN[kv_profile][layout][:len(steps)]
    for i, (mine, theirs) in enumerate(zip(steps, want, strict=True)):
        assert mine == theirs, (
            f"golden step {i} ({theirs[0]}): got {mine}, vLLM gives {theirs}\n"
            + pair.impl.snippet())


@pytest.mark.kv_profiles(*VLLM_PROFILES)
def test_golden_external_kv_scenario(kv_pair: PairFactory, kv_profile: str) -> None:
    """vLLM's own answers, step by step, to external tokens (asynchronous and synchronous
    loads, a failed load, evict_blocks) on one full-attention group."""
    _run_golden(kv_pair, kv_profile, "one_group")


@pytest.mark.kv_capability("kv_cache_groups", "sliding_window")
@pytest.mark.kv_profiles(*VLLM_PROFILES)
def test_golden_external_kv_scenario_with_a_window(kv_pair: PairFactory,
                                                  kv_profile: str) -> None:
    """The same over a full-attention and a sliding-window group (external positions the
    window skips are nulls, the two-phase allocation's order of pops)."""
    _run_golden(kv_pair, kv_profile, "windowed")


# ---------------------------------------------------------------------- random workloads
_PREFIXES = (tuple(range(1, 21)), tuple(range(100, 113)), tuple(range(200, 229)))
#: One action of a random workload: (kind, a, b), read against the workload's state.
_ACTIONS = st.lists(st.tuples(st.integers(0, 7), st.integers(0, 1 << 16),
                              st.integers(0, 1 << 16)), min_size=8, max_size=40)


def _workload(actions: list[tuple[int, int, int]], block_size: int, num_blocks: int,
              evicts: bool, zeroed_groups: int = 0) -> list[Op]:
    """Ops for ``actions``: admissions with and without external tokens (synchronous or
    asynchronous), loads that arrive or fail (a valid prefix of whole blocks, or none),
    decodes, chunked prefills, frees and, with ``evicts``, ``evict_blocks`` of a few ids.
    ``zeroed_groups`` (the spec's group count, with ``needs_kv_cache_zeroing``; 0: none): an
    asynchronous admission names some of its groups, possibly none, in
    ``skip_zeroing_group_ids``, as vLLM 0.33's scheduler does for the groups its connector
    loads into (their external blocks are not recorded for zeroing)."""
    ops: list[Op] = []
    running: dict[str, int] = {}  # rid -> prompt length
    loading: dict[str, int] = {}  # rid -> tokens computed at its asynchronous admission
    n = 0
    for kind, a, b in actions:
        idle = [r for r in running if r not in loading]
        if kind <= 1 or not running:
            rid = f"r{n}"
            n += 1
            prompt = list(_PREFIXES[a % 3]) + [300 + (b + i) % 50 for i in range(b % 9)]
            ops.append(add(rid, prompt))
            external = (b % len(prompt)) if kind == 0 else 0
            delay = kind == 0 and a % 2 == 0
            chunk = None if a % 3 else block_size + 1
            skip = [g for g in range(zeroed_groups) if delay and external and b >> (9 + g) & 1]
            ops.append(schedule(rid, chunk, external=external, delay=delay,
                                gates={"skip_zeroing_group_ids": skip} if skip else None))
            running[rid] = len(prompt)
            if delay:
                loading[rid] = external
        elif kind == 2 and idle:
            ops.append(decode(idle[a % len(idle)], 1 + b % 2))
        elif kind == 3 and idle:
            ops.append(schedule(idle[a % len(idle)]))
        elif kind in (4, 5) and loading:
            rid = sorted(loading)[a % len(loading)]
            loading.pop(rid)
            # Arrived: all of it (the driver caps at the computed tokens); failed: a prefix.
            valid = running[rid] if kind == 4 else (b % 4) * block_size
            ops.append(cache(rid, valid))
        elif kind == 6:
            rid = sorted(running)[a % len(running)]
            running.pop(rid)
            loading.pop(rid, None)
            ops.append(free(rid))
        elif kind == 7 and evicts:
            ops.append(evict(sorted({1 + (a + i * b) % (num_blocks - 1) for i in range(3)})))
    return ops


def _random_external(pair_for: PairFactory, settings: Settings, evicts: bool,
                     grouped: bool, zeroing: bool) -> None:
    """``zeroing``: one run in two also has vLLM 0.33's worker-side block zeroing
    (``needs_kv_cache_zeroing``, drawn last so the other draws keep their examples), with
    skipped groups on asynchronous loads; the driver drains ``take_new_block_ids`` after each
    allocation, records a failed load's blocks again, and the guard judges every drain."""
    @settings
    @given(actions=_ACTIONS, pool=st.integers(10, 30),
           zeroed=st.booleans() if zeroing else st.just(False))
    def run(actions: list[tuple[int, int, int]], pool: int, zeroed: bool) -> None:
        fields = {"needs_kv_cache_zeroing": True} if zeroed else {}
        if grouped:
            pair = pair_for(num_blocks=pool + 10, block_size=4, kv_cache_groups=_WINDOWED,
                            enable_kv_cache_events=True, **fields)
        else:
            pair = pair_for(num_blocks=pool, block_size=4, enable_kv_cache_events=True,
                            **fields)
        pair.run(_workload(actions, pair.spec.group_block_size(0), pair.spec.num_blocks,
                           evicts, len(pair.spec.groups) if zeroed else 0))

    run()


def _evicts(kv_impl: ImplHandle, kv_profile: str) -> bool:
    return kv_profile != "vllm-0.10" and "evict_blocks" in effective_capabilities(
        kv_impl.info, kv_profile)


def _zeroes(kv_impl: ImplHandle, kv_oracle: ImplHandle, kv_profile: str) -> bool:
    """Whether the random workloads draw block zeroing: a vLLM 0.33 feature both sides
    declare (the oracle answers every drain too)."""
    return (kv_profile == "vllm-0.33" and kv_impl.has("block_zeroing")
            and kv_oracle.has("block_zeroing"))


def test_random_external_kv_workloads_match_reference(kv_impl: ImplHandle, kv_profile: str,
                                                      kv_oracle: ImplHandle,
                                                      kv_pair: PairFactory,
                                                      kv_settings: Settings) -> None:
    """Random workloads with external hits, asynchronous loads that arrive or fail, and
    evictions (and, under ``vllm-0.33`` with ``block_zeroing``, worker-side zeroing with
    skipped groups): every answer and observable equals the oracle's after every call (laws
    only under ``generic``)."""
    _random_external(kv_pair, kv_settings, _evicts(kv_impl, kv_profile), grouped=False,
                     zeroing=_zeroes(kv_impl, kv_oracle, kv_profile))


@pytest.mark.kv_capability("kv_cache_groups", "sliding_window")
def test_random_external_kv_workloads_with_groups_match_reference(
        kv_impl: ImplHandle, kv_profile: str, kv_oracle: ImplHandle, kv_pair: PairFactory,
        kv_settings: Settings) -> None:
    """The same over a full-attention and a sliding-window group: the external blocks of
    both groups, the window's skipped external tokens (null blocks), two-phase allocation,
    zeroing skipped in either group, both or neither."""
    _random_external(kv_pair, kv_settings, _evicts(kv_impl, kv_profile), grouped=True,
                     zeroing=_zeroes(kv_impl, kv_oracle, kv_profile))
