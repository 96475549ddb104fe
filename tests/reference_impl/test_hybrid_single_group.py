"""A grouped spec with one full-attention group behaves exactly like the single-group
``KVCacheManager``: same hits, same new block ids, same tables, same free queue, same
events, on random scheduler-like workloads (both profiles)."""

from __future__ import annotations

import random

import pytest

from kvcheck.reference_impl.events import KVCacheEvent
from kvcheck.reference_impl.hybrid_kv_cache_manager import HybridKVCacheManager
from kvcheck.reference_impl.kv_cache_interface import FullAttentionSpec
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager
from kvcheck.reference_impl.request import Request


def event_key(e: KVCacheEvent) -> tuple[object, ...]:
    return (type(e).__name__, getattr(e, "block_hashes", ()),
            getattr(e, "parent_block_hash", None), getattr(e, "token_ids", ()))


def run(seed: int, profile: str, block_size: int, caching: bool) -> int:
    rng = random.Random(seed)
    num_blocks = rng.randint(8, 40)
    single = KVCacheManager(num_blocks, block_size, enable_caching=caching, profile=profile,
                            enable_kv_cache_events=True, pythonhashseed="0")
    grouped = HybridKVCacheManager(num_blocks, [FullAttentionSpec(block_size)],
                                   enable_caching=caching, profile=profile,
                                   enable_kv_cache_events=True, pythonhashseed="0")
    prefixes = [[rng.randint(0, 5) for _ in range(rng.randint(0, 12))] for _ in range(3)]
    live: dict[str, tuple[Request, Request, int]] = {}  # rid -> (single, grouped, prompt)
    checked = 0
    for step in range(60):
        if live and rng.random() < 0.2:
            rid = rng.choice(sorted(live))
            single.free(rid)
            grouped.free(rid)
            del live[rid]
        elif len(live) < 4 and rng.random() < 0.4:
            rid = f"r{step}"
            prompt = rng.choice(prefixes) + [rng.randint(0, 5) for _ in range(rng.randint(1, 9))]
            a = single.make_request(rid, prompt)
            b = grouped.make_request(rid, prompt)
            hits_a, num_a = single.get_computed_blocks(a)
            hits_b, num_b = grouped.get_computed_blocks(b)
            assert ([x.block_id for x in hits_a], num_a) == (
                [x.block_id for x in hits_b[0]], num_b), (seed, rid)
            n = min(len(prompt) - num_a, rng.randint(1, 8))
            new_a = single.allocate_slots(a, n, num_a, hits_a)
            new_b = grouped.allocate_slots(b, n, num_b, [hits_b[0]] if hits_b[0] else None)
            assert (new_a is None) == (new_b is None), (seed, rid)
            if new_a is not None and new_b is not None:
                assert [x.block_id for x in new_a] == [x.block_id for x in new_b[0]]
                a.num_computed_tokens = b.num_computed_tokens = num_a + n
                live[rid] = (a, b, len(prompt))
        elif live:
            rid = rng.choice(sorted(live))
            a, b, _ = live[rid]
            if a.num_computed_tokens >= a.num_tokens:
                token = rng.randint(0, 5)
                a.append_output_token_ids(token)
                b.append_output_token_ids(token)
            n = min(a.num_tokens - a.num_computed_tokens, rng.randint(1, 4))
            new_a = single.allocate_slots(a, n)
            new_b = grouped.allocate_slots(b, n)
            assert (new_a is None) == (new_b is None), (seed, rid)
            if new_a is not None and new_b is not None:
                assert [x.block_id for x in new_a] == [x.block_id for x in new_b[0]]
                a.num_computed_tokens += n
                b.num_computed_tokens += n
        for rid in live:
            assert (single.get_block_ids(rid),) == grouped.get_block_ids(rid), (seed, rid)
        assert ([x.block_id for x in single.block_pool.free_block_queue]
                == [x.block_id for x in grouped.block_pool.free_block_queue]), (seed, step)
        assert ([event_key(e) for e in single.take_events()]
                == [event_key(e) for e in grouped.take_events()]), (seed, step)
        grouped.check_invariants()
        checked += 1
    return checked


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.10"])
@pytest.mark.parametrize("seed", range(12))
def test_one_full_group_matches_kv_cache_manager(profile: str, seed: int) -> None:
    block_size = (1, 2, 4)[seed % 3]
    assert run(seed, profile, block_size, caching=seed % 4 != 3) == 60
