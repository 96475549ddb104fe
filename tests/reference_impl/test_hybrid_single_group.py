"""One full-attention group: the fast paths (``UnitaryKVCacheCoordinator``,
``FullAttentionManager``'s overrides, ``BlockPool.cache_full_blocks``) behave exactly like the
generic per-group code (``KVCacheCoordinator``'s loops, ``SingleTypeKVCacheManager``'s
methods, ``BlockPool.get_cached_block`` and ``cache_full_blocks`` given a hash view): same hits,
same new block ids, same tables, same free queue, same events, on random scheduler-like
workloads (both profiles, caching on and off)."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from kvcheck.reference_impl.block import KVCacheBlock
from kvcheck.reference_impl.events import KVCacheEvent
from kvcheck.reference_impl.kv_cache_coordinator import (
    KVCacheCoordinator,
    KVCacheCoordinatorNoPrefixCache,
    UnitaryKVCacheCoordinator,
)
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager
from kvcheck.reference_impl.request import Request
from kvcheck.reference_impl.single_type_kv_cache_manager import SingleTypeKVCacheManager


class GenericFullAttention(SingleTypeKVCacheManager):
    """Full attention through the base class's skip-aware code and the pool's per-group
    lookup: no one-group shortcut."""

    def find_longest_cache_hit(self, block_hashes: Sequence[bytes], max_length: int,
                               group_ids: Sequence[int], alignment_tokens: int,
                               ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        computed: tuple[list[KVCacheBlock], ...] = tuple([] for _ in group_ids)
        for block_hash in block_hashes[:max_length // self.block_size]:
            hit = self.block_pool.get_cached_block(block_hash, group_ids)  # type: ignore[arg-type]
            if hit is None:
                break
            for out, block in zip(computed, hit, strict=True):
                out.append(block)
        return computed, len(computed[0]) * self.block_size


class GenericCoordinator(KVCacheCoordinator):
    """The base coordinator's group loops, with the generic search for the one group."""

    def find_longest_cache_hit(self, request: Request, max_cache_hit_length: int,
                               ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        blocks, length = self.single_type_managers[0].find_longest_cache_hit(
            self.group_hashes(request, 0), max_cache_hit_length, [0], self.scheduler_block_size)
        return (blocks if any(blocks) else self.empty_blocks()), (length if any(blocks) else 0)


def generic_manager(num_blocks: int, block_size: int, caching: bool,
                    profile: str) -> KVCacheManager:
    m = KVCacheManager(num_blocks, block_size, enable_caching=caching, profile=profile,
                       enable_kv_cache_events=True, pythonhashseed="0")
    coordinator = GenericCoordinator(
        m.kv_cache_specs, num_blocks, profile=m.profile, enable_caching=caching,
        enable_kv_cache_events=True, scheduler_block_size=block_size,
        hash_block_size=block_size, retention_interval=None)
    generic = coordinator.single_type_managers[0]
    generic.__class__ = GenericFullAttention
    # FullAttentionManager keeps it behind a property, which the generic class does not have.
    generic.hash_block_size = block_size
    coordinator.skips_blocks = True  # run remove_skipped_blocks too (it must skip nothing)
    m.coordinator = coordinator
    m.block_pool = coordinator.block_pool
    return m


def event_key(e: KVCacheEvent) -> tuple[object, ...]:
    return (type(e).__name__, getattr(e, "block_hashes", ()),
            getattr(e, "parent_block_hash", None), getattr(e, "token_ids", ()),
            getattr(e, "extra_keys", None), getattr(e, "group_idx", None))


def ids(groups: Sequence[Sequence[KVCacheBlock]] | None) -> list[list[int]] | None:
    return None if groups is None else [[b.block_id for b in g] for g in groups]


def run(seed: int, profile: str, block_size: int, caching: bool) -> int:
    rng = random.Random(seed)
    num_blocks = rng.randint(8, 40)
    fast = KVCacheManager(num_blocks, block_size, enable_caching=caching, profile=profile,
                          enable_kv_cache_events=True, pythonhashseed="0")
    assert type(fast.coordinator) is (UnitaryKVCacheCoordinator if caching
                                      else KVCacheCoordinatorNoPrefixCache)
    generic = generic_manager(num_blocks, block_size, caching, profile)
    prefixes = [[rng.randint(0, 5) for _ in range(rng.randint(0, 12))] for _ in range(3)]
    live: dict[str, tuple[Request, Request]] = {}  # rid -> (fast, generic)
    checked = 0
    for step in range(60):
        if live and rng.random() < 0.2:
            rid = rng.choice(sorted(live))
            fast.free(rid)
            generic.free(rid)
            del live[rid]
        elif len(live) < 4 and rng.random() < 0.4:
            rid = f"r{step}"
            prompt = rng.choice(prefixes) + [rng.randint(0, 5) for _ in range(rng.randint(1, 9))]
            a = fast.make_request(rid, prompt)
            b = generic.make_request(rid, prompt)
            hits_a, num_a = fast.get_computed_blocks(a)
            hits_b, num_b = generic.get_computed_blocks(b)
            assert (ids(hits_a), num_a) == (ids(hits_b), num_b), (seed, rid)
            n = min(len(prompt) - num_a, rng.randint(1, 8))
            lookahead = rng.choice((0, 0, 2))
            new_a = fast.allocate_slots(a, n, num_a, hits_a, lookahead)
            new_b = generic.allocate_slots(b, n, num_b, hits_b, lookahead)
            assert ids(new_a) == ids(new_b), (seed, rid)
            if new_a is not None:
                a.num_computed_tokens = b.num_computed_tokens = num_a + n
                live[rid] = (a, b)
        elif live:
            rid = rng.choice(sorted(live))
            a, b = live[rid]
            if a.num_computed_tokens >= a.num_tokens:
                token = rng.randint(0, 5)
                a.append_output_token_ids(token)
                b.append_output_token_ids(token)
            n = min(a.num_tokens - a.num_computed_tokens, rng.randint(1, 4))
            new_a = fast.allocate_slots(a, n)
            new_b = generic.allocate_slots(b, n)
            assert ids(new_a) == ids(new_b), (seed, rid)
            if new_a is not None:
                a.num_computed_tokens += n
                b.num_computed_tokens += n
        for rid in live:
            assert fast.get_block_ids(rid) == generic.get_block_ids(rid), (seed, rid)
        assert ([x.block_id for x in fast.block_pool.free_block_queue]
                == [x.block_id for x in generic.block_pool.free_block_queue]), (seed, step)
        assert ([event_key(e) for e in fast.take_events()]
                == [event_key(e) for e in generic.take_events()]), (seed, step)
        fast.check_invariants()
        generic.check_invariants()
        checked += 1
    return checked


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.10"])
@pytest.mark.parametrize("seed", range(12))
def test_one_full_group_fast_paths_match_the_generic_code(profile: str, seed: int) -> None:
    block_size = (1, 2, 4)[seed % 3]
    assert run(seed, profile, block_size, caching=seed % 4 != 3) == 60
