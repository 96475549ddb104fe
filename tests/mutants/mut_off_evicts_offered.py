"""Bug (offload_lru.py, offload_arc.py): the same-offer key evicted: the policies' victim scan
ignores the ``protected`` set.

An offer that re-lists a ready chunk (a request offering its whole prefix again, with one new
block at the end) can have that chunk evicted to make room for its new block: the tier
drops the very prefix it was just asked to keep, and announces its removal. vLLM's manager
passes ``protected = set(keys)`` to ``CachePolicy.evict`` and both policies skip those keys
(spec kv-connector-and-offload.md §3).
"""

from __future__ import annotations

from _offload_mutant_base import build_offload

from kvcheck.reference_impl.offload_arc import ARCCachePolicy
from kvcheck.reference_impl.offload_lru import LRUCachePolicy
from kvcheck.reference_impl.offload_policy import ChunkStatus, OffloadKey


class LRUNoProtect(LRUCachePolicy):
    def evict(self, n: int,
              protected: set[OffloadKey]) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        return super().evict(n, set())  # BUG: the offer's own keys are fair game


class ARCNoProtect(ARCCachePolicy):
    def evict(self, n: int,
              protected: set[OffloadKey]) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        return super().evict(n, set())  # BUG: the offer's own keys are fair game


IMPL_INFO, make_kv_cache_manager, make_block_pool, make_offloading_manager = build_offload(
    "mut_off_evicts_offered", lru=LRUNoProtect, arc=ARCNoProtect)
