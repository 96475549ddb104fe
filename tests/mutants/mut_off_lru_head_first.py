"""Bug (offload_lru.py): LRU head before tail: a request's keys are ranked by ``+position``
instead of ``-position``, so among one request's chunks the head blocks are evicted first.

A request's prefix is only useful from its head: a later request can load block i only if it
also has blocks 0..i-1. Evicting the head first strands the whole tail (still in the tier,
never loadable again) while the tier reports it as cached. vLLM's LRU ranks a request's keys
``(rank, -position)`` so its tail goes first (``lru.py``; spec kv-connector-and-offload.md §3).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from _offload_mutant_base import build_offload

from kvcheck.reference_impl.offload_lru import LRUCachePolicy
from kvcheck.reference_impl.offload_policy import ChunkStatus, OffloadKey, ReqContext


class HeadFirst(LRUCachePolicy):
    def insert(self, key: OffloadKey, chunk: ChunkStatus, req_context: ReqContext) -> None:
        self.chunks[key] = chunk
        position = req_context.get_offload_key_position(key)
        self._rank[key] = ((self._fresh(), 0) if position is None
                           else (self._request_rank(req_context), position))  # BUG: +position
        if chunk.ref_cnt == 0:
            self._evictable.add(key)
            heapq.heappush(self._heap, (self._rank[key], key))

    def on_request_access(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        request_rank = self._request_rank(req_context)
        moved = []
        for key in keys:
            position = req_context.get_offload_key_position(key)
            if position is None or key not in self.chunks:
                continue
            rank = (request_rank, position)  # BUG: +position, the head ranks oldest
            if self._rank[key] >= rank:
                continue
            self._rank[key] = rank
            if key in self._evictable:
                moved.append(key)
        self._push(moved)


IMPL_INFO, make_kv_cache_manager, make_block_pool, make_offloading_manager = build_offload(
    "mut_off_lru_head_first", lru=HeadFirst)
