"""The hybrid golden scenarios (docs/semantics.md#kv-cache-groups-hybrid-models,
``kvcheck.conformance.hybrid_golden``)
replayed on ``KVCacheManager``: every recorded column after every row.

Columns: the call's result, every request's block tables, the free queue, the prefix-cache map
(hash number and group -> block ids, in lookup order), the row's events (type, group, hash
numbers; 0.33 also the kind / window annotation), and under 0.10.2 the null block's ref_cnt.
"""

from __future__ import annotations

import pytest

from kvcheck.conformance.hybrid_golden import SCENARIOS, GoldenRow, GoldenScenario
from kvcheck.reference_impl.block import KVCacheBlock, get_block_hash, get_group_id
from kvcheck.reference_impl.block_hasher import hash_request_tokens
from kvcheck.reference_impl.events import BlockRemoved, BlockStored
from kvcheck.reference_impl.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    SlidingWindowSpec,
)
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager
from kvcheck.reference_impl.request import Request

Groups = tuple[tuple[int, ...], ...]


def reference_specs(sc: GoldenScenario) -> list[KVCacheSpec]:
    out: list[KVCacheSpec] = []
    for i, g in enumerate(sc.spec.kv_cache_groups):
        bs = sc.spec.group_block_size(i)
        if g.kind == "sliding_window":
            assert g.sliding_window is not None
            out.append(SlidingWindowSpec(bs, g.sliding_window))
        elif g.kind == "chunked_local_attention":
            assert g.attention_chunk_size is not None
            out.append(ChunkedLocalAttentionSpec(bs, g.attention_chunk_size))
        else:
            out.append(FullAttentionSpec(bs))
    return out


def make_manager(sc: GoldenScenario) -> KVCacheManager:
    spec = sc.spec
    return KVCacheManager(
        spec.num_blocks, kv_cache_specs=reference_specs(sc), enable_caching=spec.enable_caching,
        profile=sc.profile, enable_kv_cache_events=spec.enable_kv_cache_events,
        pythonhashseed=spec.pythonhashseed,
        prefix_cache_retention_interval=spec.prefix_cache_retention_interval)


def hash_numbers(sc: GoldenScenario, manager: KVCacheManager) -> dict[bytes, int]:
    """Each request's hashes (whole token list, hash block size) named by the scenario's
    numbers; one number per distinct hash."""
    by_bytes: dict[bytes, int] = {}
    by_number: dict[int, bytes] = {}
    for req in sc.requests:
        tokens = list(req.prompt_token_ids + req.output_token_ids)
        hashes = hash_request_tokens(manager.block_hasher, tokens)
        if not sc.spec.enable_caching:
            continue
        assert len(hashes) == len(req.hash_numbers), req
        for number, value in zip(req.hash_numbers, hashes, strict=True):
            assert by_number.setdefault(number, value) == value, f"H{number} bound twice"
            assert by_bytes.setdefault(value, number) == number, f"H{number} equals another"
    return by_bytes


def ids(groups: tuple[list[KVCacheBlock], ...] | None) -> Groups | None:
    if groups is None:
        return None
    return tuple(tuple(b.block_id for b in g) for g in groups)


def cache_map(manager: KVCacheManager, names: dict[bytes, int]) -> dict:
    out = {}
    for key, blocks in manager.block_pool.cached_block_hash_to_block.items():
        number = names[get_block_hash(key)]
        out[(number, get_group_id(key))] = tuple(b.block_id for b in blocks)
    return out


def event_view(manager: KVCacheManager, names: dict[bytes, int], profile: str,
               ) -> list[tuple[str, int | None, tuple[int, ...]]]:
    out = []
    for e in manager.take_events():
        assert isinstance(e, BlockStored | BlockRemoved), e
        group = e.group_idx if profile == "vllm-0.33" else None
        out.append((type(e).__name__, group, tuple(names[h] for h in e.block_hashes)))
        if isinstance(e, BlockStored):
            spec = manager.kv_cache_specs[e.group_idx]
            assert len(e.token_ids) % spec.block_size == 0
            assert len(e.token_ids) >= len(e.block_hashes) * spec.block_size
    return out


def check_row(sc: GoldenScenario, row: GoldenRow, manager: KVCacheManager,
              names: dict[bytes, int], result: object) -> None:
    where = f"{sc.profile} {sc.name} row {row.index} {row.op}({row.request_id})"
    if row.op == "get_computed_blocks":
        assert result == (row.hit_blocks, row.hit_tokens), where
    elif row.op == "allocate_slots":
        assert result == (None if row.refused else row.new_blocks), where
    for req in sc.requests:
        got = tuple(tuple(g) for g in manager.get_block_ids(req.request_id))
        assert got == row.block_ids(req.request_id, sc.num_groups), f"{where}: {req.request_id}"
    assert tuple(b.block_id for b in manager.block_pool.free_block_queue) == row.free_queue, where
    expected_cache = {(n, g): blocks for n, g, blocks in row.cache}
    assert cache_map(manager, names) == expected_cache, where
    expected_events = [(e.type, e.group_idx, e.hashes) for e in row.events]
    if sc.spec.enable_kv_cache_events:
        assert event_view(manager, names, sc.profile) == expected_events, where
    if row.null_ref_cnt is not None:
        assert manager.block_pool.null_block.ref_cnt == row.null_ref_cnt, where
    manager.check_invariants()


def replay(sc: GoldenScenario) -> None:
    manager = make_manager(sc)
    names = hash_numbers(sc, manager)
    requests: dict[str, Request] = {}
    computed: dict[str, int] = {}
    last_hits: tuple[Groups, int] | None = None
    for row in sc.rows:
        golden = sc.request(row.request_id)
        req = requests.get(row.request_id)
        if req is None:
            req = requests[row.request_id] = manager.make_request(
                golden.request_id, golden.prompt_token_ids)
        result: object = None
        if row.op == "get_computed_blocks":
            blocks, num = manager.get_computed_blocks(req)
            result = (ids(blocks), num)
            last_hits = (ids(blocks) or (), num)
        elif row.op == "allocate_slots":
            # The scripted state agrees with what the scheduler advanced.
            assert row.num_computed_tokens == computed.get(row.request_id, 0), row
            missing = golden.output_token_ids[len(req.output_token_ids):row.num_output_tokens]
            if missing:
                req.append_output_token_ids(list(missing))
            req.num_computed_tokens = row.num_computed_tokens
            hit_tokens = 0
            hit_blocks = None
            if row.with_hits:
                assert last_hits is not None
                hit_ids, hit_tokens = last_hits
                pool = manager.block_pool.blocks
                hit_blocks = [[pool[i] for i in g] for g in hit_ids]
            new = manager.allocate_slots(req, row.num_new_tokens, hit_tokens, hit_blocks)
            result = ids(new)
            if new is not None:
                computed[row.request_id] = (
                    row.num_computed_tokens + hit_tokens + row.num_new_tokens)
        else:
            manager.free(row.request_id)
            requests.pop(row.request_id)
        check_row(sc, row, manager, names, result)


@pytest.mark.parametrize("sc", SCENARIOS, ids=lambda s: f"{s.profile}-{s.name}")
def test_golden_scenario(sc: GoldenScenario) -> None:
    replay(sc)


def test_every_scenario_of_the_spec_is_present() -> None:
    names = {(s.profile, s.name) for s in SCENARIOS}
    assert names == {("vllm-0.33", f"G{i}") for i in range(1, 10)} | {
        ("vllm-0.10", n) for n in ("G1", "G2", "G3", "G4", "G5", "G6'", "G9")}


def test_event_annotation_033() -> None:
    """0.33 annotates BlockStored with the group's kind and window (G1 row 2)."""
    sc = next(s for s in SCENARIOS if s.profile == "vllm-0.33" and s.name == "G1")
    manager = make_manager(sc)
    req = manager.make_request("A", sc.request("A").prompt_token_ids)
    manager.allocate_slots(req, 10)
    stored = [e for e in manager.take_events() if isinstance(e, BlockStored)]
    assert [manager.kv_cache_event_metadata[e.group_idx] for e in stored] == [
        ("full_attention", None), ("sliding_window", 4)]
    assert [e.parent_block_hash for e in stored] == [None, None]
