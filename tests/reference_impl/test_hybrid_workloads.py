"""Random scheduler-like workloads on the grouped manager over the layouts of
docs/semantics.md#kv-cache-groups-hybrid-models: no call raises, the pool's invariants hold after
every call, a refused
allocation changes nothing but the blocks a window skipped, and every hit is a cached block
whose key is the request's hash at that position in that group."""

from __future__ import annotations

import random

import pytest

from kvcheck.reference_impl.block import get_block_hash, get_group_id
from kvcheck.reference_impl.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    SlidingWindowSpec,
)
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager
from kvcheck.reference_impl.request import Request
from kvcheck.reference_impl.single_type_kv_cache_manager import resolve_block_hashes

LAYOUTS: dict[str, tuple[list[KVCacheSpec], tuple[str, ...]]] = {
    "full+swa4": ([FullAttentionSpec(2), SlidingWindowSpec(2, 4)], ("vllm-0.33", "vllm-0.10")),
    "full+swa3-bs1": ([FullAttentionSpec(1), SlidingWindowSpec(1, 3)],
                      ("vllm-0.33", "vllm-0.10")),
    "swa5": ([SlidingWindowSpec(4, 5)], ("vllm-0.33", "vllm-0.10")),
    "chunk4": ([ChunkedLocalAttentionSpec(2, 4)], ("vllm-0.33", "vllm-0.10")),
    "full+chunk8": ([FullAttentionSpec(4), ChunkedLocalAttentionSpec(4, 8)],
                    ("vllm-0.33", "vllm-0.10")),
    "2full+2swa": ([FullAttentionSpec(2), FullAttentionSpec(2), SlidingWindowSpec(2, 4),
                    SlidingWindowSpec(2, 4)], ("vllm-0.33", "vllm-0.10")),
    "full+swa4+swa8": ([FullAttentionSpec(2), SlidingWindowSpec(2, 4),
                        SlidingWindowSpec(2, 8)], ("vllm-0.33",)),
    "full2+swa8-bs4": ([FullAttentionSpec(2), SlidingWindowSpec(4, 8)], ("vllm-0.33",)),
    "swa+chunk": ([SlidingWindowSpec(2, 4), ChunkedLocalAttentionSpec(2, 4)], ("vllm-0.33",)),
}
CASES = [(name, profile, retention)
         for name, (_, profiles) in LAYOUTS.items() for profile in profiles
         for retention in ((None, 0) if profile == "vllm-0.33" and "swa" in name else (None,))]


def check_hits(m: KVCacheManager, req: Request, hits: tuple[list, ...]) -> None:
    for gid, blocks in enumerate(hits):
        if not blocks:
            continue
        view = resolve_block_hashes(req.block_hashes, m.hash_block_size,
                                    m.kv_cache_specs[gid].block_size)
        for i, block in enumerate(blocks):
            if block.is_null:
                continue
            key = block.block_hash
            assert key is not None, (gid, i)
            assert get_group_id(key) == gid and get_block_hash(key) == view[i], (gid, i)


def run(name: str, profile: str, retention: int | None, seed: int) -> None:
    specs = LAYOUTS[name][0]
    rng = random.Random(seed)
    m = KVCacheManager(rng.randint(10, 40), kv_cache_specs=specs, profile=profile,
                       pythonhashseed="0", prefix_cache_retention_interval=retention,
                       enable_caching=rng.random() < 0.85)
    prefixes = [[rng.randint(0, 3) for _ in range(rng.randint(0, 16))] for _ in range(3)]
    live: dict[str, Request] = {}
    for step in range(80):
        if live and rng.random() < 0.2:
            rid = rng.choice(sorted(live))
            m.free(rid)
            del live[rid]
        elif len(live) < 4 and rng.random() < 0.4:
            rid = f"r{step}"
            req = m.make_request(rid, rng.choice(prefixes)
                                 + [rng.randint(0, 3) for _ in range(rng.randint(1, 12))])
            hits, num = m.get_computed_blocks(req)
            check_hits(m, req, hits)
            assert num <= req.num_tokens - 1
            n = min(req.num_tokens - num, rng.randint(1, 8))
            before = [b.block_id for b in m.block_pool.free_block_queue]
            if m.allocate_slots(req, n, num, hits if num or any(hits) else None) is None:
                assert [b.block_id for b in m.block_pool.free_block_queue] == before
                assert m.get_block_ids(rid) == tuple([] for _ in specs)
            else:
                req.num_computed_tokens = num + n
                live[rid] = req
        elif live:
            req = live[rng.choice(sorted(live))]
            if req.num_computed_tokens >= req.num_tokens:
                req.append_output_token_ids(rng.randint(0, 3))
            n = min(req.num_tokens - req.num_computed_tokens, rng.randint(1, 4))
            if m.allocate_slots(req, n) is not None:
                req.num_computed_tokens += n
                for gid, spec in enumerate(specs):
                    table = m.get_block_ids(req.request_id)[gid]
                    assert len(table) * spec.block_size >= req.num_computed_tokens
        m.check_invariants()
    for rid in list(live):
        m.free(rid)
    m.check_invariants()
    assert m.num_free_blocks == m.block_pool.num_gpu_blocks - 1
    assert m.reset_prefix_cache()


@pytest.mark.parametrize(("name", "profile", "retention"), CASES,
                         ids=[f"{n}-{p}-R{r}" for n, p, r in CASES])
@pytest.mark.parametrize("seed", range(4))
def test_random_workload(name: str, profile: str, retention: int | None, seed: int) -> None:
    run(name, profile, retention, seed)
