"""Worked examples of docs/semantics.md#kv-cache-sizing and the errors of
docs/semantics.md#allocation-caching-freeing-and-events-with-several-groups, on the
reference's grouped manager (expected values are the spec's)."""

from __future__ import annotations

import pytest

from kvcheck.reference_impl.block import KVCacheBlock
from kvcheck.reference_impl.errors import KVCacheMisuseError
from kvcheck.reference_impl.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    SlidingWindowSpec,
    get_kv_cache_spec_kind,
    get_kv_cache_spec_sliding_window,
)
from kvcheck.reference_impl.kv_cache_manager import (
    KVCacheManager,
    resolve_kv_cache_block_sizes,
)
from kvcheck.reference_impl.profiles import get_profile
from kvcheck.reference_impl.request import Request

V033, V010 = "vllm-0.33", "vllm-0.10"
FULL2 = FullAttentionSpec(2)
SWA4 = SlidingWindowSpec(2, 4)


def manager(specs: list[KVCacheSpec], profile: str = V033, num_blocks: int = 32,
            **kwargs: object) -> KVCacheManager:
    return KVCacheManager(num_blocks, kv_cache_specs=specs, profile=profile,
                          pythonhashseed="0", **kwargs)  # type: ignore[arg-type]


def ids(groups: tuple[list[KVCacheBlock], ...]) -> list[list[int]]:
    return [[b.block_id for b in g] for g in groups]


def prefill(m: KVCacheManager, rid: str, n: int) -> Request:
    req = m.make_request(rid, list(range(100, 100 + n)))
    hits, num = m.get_computed_blocks(req)
    assert m.allocate_slots(req, n - num, num, hits) is not None
    req.num_computed_tokens = n
    return req


# -- docs/semantics.md#kv-cache-sizing / docs/semantics.md#kv-cache-sizing -------------------------

def test_spec_kinds_and_windows() -> None:
    assert get_kv_cache_spec_kind(FULL2) == "full_attention"
    assert get_kv_cache_spec_kind(SWA4) == "sliding_window"
    assert get_kv_cache_spec_kind(ChunkedLocalAttentionSpec(2, 4)) == "chunked_local_attention"
    assert get_kv_cache_spec_sliding_window(SWA4) == 4
    assert get_kv_cache_spec_sliding_window(FULL2) is None
    assert SlidingWindowSpec(2, 4) == SWA4 and SlidingWindowSpec(2, 8) != SWA4
    assert FullAttentionSpec(2) != ChunkedLocalAttentionSpec(2, 2)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_spec_fields_must_be_positive_ints(bad: object) -> None:
    with pytest.raises(KVCacheMisuseError, match="must be an int >= 1"):
        SlidingWindowSpec(2, bad)  # type: ignore[arg-type]


def test_lcm_scheduler_and_gcd_hash_block_sizes() -> None:
    """docs/semantics.md#kv-cache-sizing: full bs 2 + SWA bs 4 -> scheduler 4, hash 2; caching off
    -> hash = scheduler;
    one group -> its block size."""
    p033 = get_profile(V033)
    assert resolve_kv_cache_block_sizes([FULL2, SlidingWindowSpec(4, 8)], True, p033) == (4, 2)
    assert resolve_kv_cache_block_sizes([FULL2, SlidingWindowSpec(4, 8)], False, p033) == (4, 4)
    assert resolve_kv_cache_block_sizes([SlidingWindowSpec(4, 8)], True, p033) == (4, 4)
    assert resolve_kv_cache_block_sizes([FULL2, SlidingWindowSpec(3, 8)], True, p033) == (6, 1)


# -- docs/semantics.md#skipped-tokens-and-null-blocks remove_skipped_blocks ------------------------

@pytest.mark.parametrize("profile", [V033, V010])
def test_swa_skipped_blocks_worked_example(profile: str) -> None:
    """w 4, bs 2: n=10 nulls indices 0-2 (freed highest index first), n=11 nulls index 3."""
    m = manager([SWA4], profile)
    req = prefill(m, "A", 10)
    assert m.get_block_ids("A") == ([1, 2, 3, 4, 5],)
    req.append_output_token_ids(110)
    m.allocate_slots(req, 1)
    assert m.get_block_ids("A") == ([0, 0, 0, 4, 5, 6],)
    assert [b.block_id for b in m.block_pool.free_block_queue][-3:] == [3, 2, 1]
    req.num_computed_tokens = 11
    req.append_output_token_ids(111)
    m.allocate_slots(req, 1)
    assert m.get_block_ids("A") == ([0, 0, 0, 0, 5, 6],)


@pytest.mark.parametrize(("profile", "table"), [
    (V033, [0, 0, 0, 0, 0, 0, 7]),   # frees every block of the finished chunks
    (V010, [0, 0, 0, 0, 0, 6, 7]),   # keeps the last cached block (index 5)
])
def test_chunked_local_skipped_blocks_worked_example(profile: str, table: list[int]) -> None:
    """c 4, bs 2, a 12-token prompt then a decode step: n=12 nulls indices 4-5 in 0.33, only
    index 4 in 0.10.2 (G4 row 4)."""
    m = manager([ChunkedLocalAttentionSpec(2, 4)], profile)
    req = m.make_request("A", list(range(100, 112)))
    assert m.allocate_slots(req, 12) is not None
    req.num_computed_tokens = 12
    req.append_output_token_ids(112)
    m.allocate_slots(req, 1)
    assert m.get_block_ids("A") == (table,)


def test_remove_skipped_blocks_runs_even_when_allocation_fails() -> None:
    """docs/semantics.md#skipped-tokens-and-null-blocks (0.33): the skipped blocks are freed
    before the capacity check."""
    m = manager([SWA4], num_blocks=7)
    req = prefill(m, "A", 10)  # 5 blocks, 1 free
    req.append_output_token_ids(list(range(110, 120)))
    assert m.allocate_slots(req, 10) is None
    assert m.get_block_ids("A") == ([0, 0, 0, 4, 5],)
    assert m.num_free_blocks == 4


# -- docs/semantics.md#hits-per-group-and-the-common-hit-length hit search -------------------------

def test_swa_hit_right_to_left_worked_example() -> None:
    """Hashes cached for blocks 0-4, w 4, bs 2, max 9 tokens -> [0, 0, 8, 9], 8 tokens
    (G2 row 4: the SWA group's blocks 6-10)."""
    m = manager([FULL2, SWA4], num_blocks=16)
    prefill(m, "A", 10)
    m.free("A")
    b = m.make_request("B", list(range(100, 110)))
    hits, num = m.get_computed_blocks(b)
    assert (ids(hits), num) == ([[1, 2, 3, 4], [0, 0, 8, 9]], 8)


def test_chunked_local_empty_cache_still_hits_finished_chunks() -> None:
    """G4 row 1: an empty cache returns 8 tokens of nulls for an 11-token prompt."""
    m = manager([ChunkedLocalAttentionSpec(2, 4)])
    req = m.make_request("A", list(range(100, 111)))
    hits, num = m.get_computed_blocks(req)
    assert (ids(hits), num) == ([[0, 0, 0, 0]], 8)


def test_fixed_point_three_spec_groups() -> None:
    """docs/semantics.md#hits-per-group-and-the-common-hit-length G6: full 5 blocks -> SWA w4
    [0,0,0,10,11] -> SWA w8 [0,14,15,16,17], 10 tokens."""
    m = manager([FULL2, SWA4, SlidingWindowSpec(2, 8)], num_blocks=24)
    prefill(m, "A", 12)
    m.free("A")
    hits, num = m.get_computed_blocks(m.make_request("B", list(range(100, 112))))
    assert (ids(hits), num) == (
        [[1, 2, 3, 4, 5], [0, 0, 0, 10, 11], [0, 14, 15, 16, 17]], 10)


def test_v010_other_group_first() -> None:
    """G6': SWA group 0 + full group 1 -> [0,0,3,4] . [6,7,8,9] under 0.10.2."""
    m = manager([SWA4, FULL2], V010, num_blocks=16)
    prefill(m, "A", 10)
    m.free("A")
    hits, num = m.get_computed_blocks(m.make_request("B", list(range(100, 110))))
    assert (ids(hits), num) == ([[0, 0, 3, 4], [6, 7, 8, 9]], 8)


def test_v010_hits_touch_the_null_block() -> None:
    """docs/semantics.md#allocation-caching-freeing-and-events-with-several-groups: 0.10.2
    increments the null block's ref_cnt per null hit entry and decrements it
    per null freed; 0.33 never touches it."""
    for profile, after_alloc, after_free in ((V010, 2, 0), (V033, 0, 0)):
        m = manager([FULL2, SWA4], profile, num_blocks=16)
        prefill(m, "A", 10)
        m.free("A")
        req = m.make_request("B", list(range(100, 110)))
        hits, num = m.get_computed_blocks(req)
        m.allocate_slots(req, 2, num, hits)
        assert m.block_pool.null_block.ref_cnt == after_alloc, profile
        m.free("B")
        assert m.block_pool.null_block.ref_cnt == after_free, profile


def test_swa_mask_retention_zero_keeps_the_replay_tail() -> None:
    """docs/semantics.md#allocation-caching-freeing-and-events-with-several-groups / G8: with
    retention 0 a 10-token prompt caches only SWA blocks 2 and 3."""
    m = manager([FULL2, SWA4], num_blocks=16, prefix_cache_retention_interval=0,
                enable_kv_cache_events=True)
    prefill(m, "A", 10)
    swa_cached = [b.block_id for b in m.get_blocks("A")[1] if b.block_hash is not None]
    assert swa_cached == [8, 9]
    stored = [e for e in m.take_events() if e.group_idx == 1]
    assert len(stored) == 1 and len(stored[0].block_hashes) == 2
    assert len(stored[0].token_ids) == 10  # the whole range, masked blocks included


def test_empty_block_stored_033_only() -> None:
    """docs/semantics.md#allocation-caching-freeing-and-events-with-several-groups: 0.33 emits a
    BlockStored even when every block of the range is masked."""
    m = manager([FULL2, SWA4], num_blocks=16, prefix_cache_retention_interval=0,
                enable_kv_cache_events=True)
    req = prefill(m, "A", 10)
    m.take_events()
    req.append_output_token_ids([110, 111])
    m.allocate_slots(req, 2)
    stored = [(e.group_idx, len(e.block_hashes)) for e in m.take_events()]
    assert stored == [(0, 1), (1, 0)]


# -- docs/semantics.md#allocation-caching-freeing-and-events-with-several-groups errors ------------

def test_retention_without_sliding_window() -> None:
    with pytest.raises(KVCacheMisuseError, match="no sliding-window"):
        manager([FULL2, ChunkedLocalAttentionSpec(2, 4)], prefix_cache_retention_interval=4)
    manager([FULL2], prefix_cache_retention_interval=0)  # 0 is allowed


@pytest.mark.parametrize("retention", [-2, 3])
def test_retention_must_be_a_non_negative_multiple(retention: int) -> None:
    with pytest.raises(KVCacheMisuseError, match="multiple of scheduler_block_size"):
        manager([FULL2, SWA4], prefix_cache_retention_interval=retention)


def test_v010_one_block_size_with_caching() -> None:
    with pytest.raises(KVCacheMisuseError, match="one block size"):
        manager([FULL2, SlidingWindowSpec(4, 8)], V010)
    manager([FULL2, SlidingWindowSpec(4, 8)], V010, enable_caching=False)


@pytest.mark.parametrize("specs", [
    [FULL2, SWA4, SlidingWindowSpec(2, 8)],
    [SWA4, ChunkedLocalAttentionSpec(2, 4)],
])
def test_v010_one_full_and_one_other_spec(specs: list[KVCacheSpec]) -> None:
    with pytest.raises(KVCacheMisuseError, match="one full-attention spec and one other"):
        manager(specs, V010)
    manager(specs, V033)  # 0.33's fixed point takes any spec groups


def test_v010_interleaved_groups() -> None:
    with pytest.raises(KVCacheMisuseError, match="do not interleave"):
        manager([FULL2, SWA4, FULL2], V010)


def test_v010_events_with_null_parents_refused() -> None:
    """docs/semantics.md#allocation-caching-freeing-and-events-with-several-groups last row: 0.10.2
    crashes on a null parent with events on; the reference refuses
    the layout up front instead of reproducing the crash."""
    with pytest.raises(KVCacheMisuseError, match=r"run .* with enable_kv_cache_events=False"):
        manager([ChunkedLocalAttentionSpec(2, 4)], V010, enable_kv_cache_events=True)
    with pytest.raises(KVCacheMisuseError, match="null block"):
        manager([FULL2, SlidingWindowSpec(2, 2)], V010, enable_kv_cache_events=True)
    manager([ChunkedLocalAttentionSpec(2, 4)], V010)


def test_chunked_local_block_size_must_equal_alignment() -> None:
    m = manager([ChunkedLocalAttentionSpec(2, 4), SlidingWindowSpec(4, 8)])
    with pytest.raises(KVCacheMisuseError, match="equal to the hit alignment"):
        m.get_computed_blocks(m.make_request("A", list(range(100, 120))))


@pytest.mark.parametrize("profile", [V033, V010])
def test_allocate_nothing_to_compute(profile: str) -> None:
    m = manager([FULL2, SWA4], profile)
    with pytest.raises(KVCacheMisuseError, match="num_new_tokens must be greater than 0"):
        m.allocate_slots(m.make_request("A", [1, 2, 3]), 0)


def test_hits_for_a_running_request() -> None:
    m = manager([FULL2, SWA4])
    prefill(m, "A", 10)
    req = prefill(m, "B", 10)  # a hit on A's blocks: B is running
    hits, num = m.get_computed_blocks(m.make_request("C", list(range(100, 110))))
    with pytest.raises(KVCacheMisuseError, match="holds no blocks yet"):
        m.allocate_slots(req, 1, num, hits)


def test_hit_lists_must_match_the_groups() -> None:
    m = manager([FULL2, SWA4])
    req = m.make_request("A", list(range(100, 110)))
    with pytest.raises(KVCacheMisuseError, match="1 hit lists for 2 groups"):
        m.allocate_slots(req, 2, 2, [[m.block_pool.blocks[1]]])
