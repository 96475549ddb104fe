"""LRU for the offload tier, with request-scoped recency, as vLLM 0.33's
``v1/kv_offload/cpu/policies/lru.py`` orders it (docs/semantics.md#the-offload-tier).

Every chunk has a rank ``(r, -end_position)``; the evictable chunk with the smallest
``(rank, key)`` goes first. A plain use (a touch, or a store without a position) gives a key a
fresh ``r`` from one counter, so later means newer. The keys of one request share one ``r`` (drawn
the first time the request reads or stores), ordered by ``-end_position``: a request's tail
blocks are evicted before its head. When the request finishes, its keys are touched tail to
head, which puts its head last in line.

Recency and pinning are independent: a pinned chunk keeps being re-ranked, and enters the
eviction order with its current rank when its last load completes. The evictable set is a
min-heap with lazy invalidation: an entry counts only while its key is evictable and its rank
is the key's current one.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from kvcheck.reference_impl.offload_policy import (
    CachePolicy,
    ChunkStatus,
    OffloadKey,
    ReqContext,
    order_request_keys,
)

__all__ = ["LRUCachePolicy"]

_Rank = tuple[int, int]
_Entry = tuple[_Rank, OffloadKey]


class _RequestRank:
    """The rank one request's keys share, valid for one policy and one cache generation."""

    __slots__ = ("generation", "owner", "rank")

    def __init__(self, owner: object, generation: int, rank: int) -> None:
        self.owner, self.generation, self.rank = owner, generation, rank


class LRUCachePolicy(CachePolicy):
    """See the module docstring."""

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.chunks: dict[OffloadKey, ChunkStatus] = {}
        self._rank: dict[OffloadKey, _Rank] = {}
        self._evictable: set[OffloadKey] = set()
        self._heap: list[_Entry] = []
        self._counter = 0
        self._generation = 0

    # --- ranks -----------------------------------------------------------------------------

    def _fresh(self) -> int:
        self._counter += 1
        return self._counter

    def _request_rank(self, req_context: ReqContext) -> int:
        state = req_context.get_state(_RequestRank)
        if state is None or state.owner is not self or state.generation != self._generation:
            state = _RequestRank(self, self._generation, self._fresh())
            req_context.set_state(state)
        return state.rank

    def _push(self, keys: Sequence[OffloadKey]) -> None:
        """New current entries for ``keys`` (evictable, just re-ranked)."""
        if not keys:
            return
        if len(keys) >= max(64, len(self._evictable) // 4):
            self._rebuild()  # linear, cheaper than many pushes for a long prefix
            return
        for key in keys:
            heapq.heappush(self._heap, (self._rank[key], key))
        self._compact()

    def _rebuild(self) -> None:
        self._heap = [(self._rank[key], key) for key in self._evictable]
        heapq.heapify(self._heap)

    def _compact(self) -> None:
        if len(self._heap) >= max(64, 2 * len(self._evictable)):
            self._rebuild()

    def _renew(self, keys: Iterable[OffloadKey]) -> None:
        """A fresh plain rank for each present key, in the order given (the last is newest)."""
        moved = []
        for key in keys:
            if key in self.chunks:
                self._rank[key] = (self._fresh(), 0)
                if key in self._evictable:
                    moved.append(key)
        self._push(moved)

    # --- CachePolicy -----------------------------------------------------------------------

    def get(self, key: OffloadKey) -> ChunkStatus | None:
        return self.chunks.get(key)

    def insert(self, key: OffloadKey, chunk: ChunkStatus, req_context: ReqContext) -> None:
        self.chunks[key] = chunk
        position = req_context.get_offload_key_position(key)
        self._rank[key] = ((self._fresh(), 0) if position is None
                           else (self._request_rank(req_context), -position))
        if chunk.ref_cnt == 0:
            self._evictable.add(key)
            heapq.heappush(self._heap, (self._rank[key], key))

    def remove(self, key: OffloadKey) -> None:
        del self.chunks[key]
        self._rank.pop(key, None)
        self._evictable.discard(key)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        self._renew(reversed(list(keys)))  # the head ends newest

    def on_request_access(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        request_rank = self._request_rank(req_context)
        moved = []
        for key in keys:
            position = req_context.get_offload_key_position(key)
            if position is None or key not in self.chunks:
                continue
            rank = (request_rank, -position)
            if self._rank[key] >= rank:
                continue  # already as new (a later request, or a plain use since)
            self._rank[key] = rank
            if key in self._evictable:
                moved.append(key)
        self._push(moved)

    def on_request_finished(self, key_groups: Sequence[Sequence[OffloadKey]],
                            insertion_only_keys: set[OffloadKey], reused_keys: set[OffloadKey],
                            req_context: ReqContext) -> None:
        del insertion_only_keys, reused_keys
        self._renew(reversed(order_request_keys(key_groups, req_context)))

    def clear(self) -> None:
        self.chunks.clear()
        self._rank.clear()
        self._evictable.clear()
        self._heap.clear()
        self._counter = 0
        self._generation += 1

    def evict(self, n: int,
              protected: set[OffloadKey]) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        if n == 0:
            return []
        chosen: list[_Entry] = []
        chosen_keys: set[OffloadKey] = set()
        skipped: list[_Entry] = []
        heap = self._heap
        while heap and len(chosen) < n:
            entry = heapq.heappop(heap)
            rank, key = entry
            if key not in self._evictable or self._rank.get(key) != rank or key in chosen_keys:
                continue  # stale, or a duplicate of a current entry
            if key in protected:
                skipped.append(entry)
                continue
            chosen.append(entry)
            chosen_keys.add(key)
        for entry in skipped:
            heapq.heappush(heap, entry)
        if len(chosen) < n:
            for entry in chosen:  # all or nothing
                heapq.heappush(heap, entry)
            return None
        evicted = []
        for _, key in chosen:
            self._evictable.remove(key)
            del self._rank[key]
            evicted.append((key, self.chunks.pop(key)))
        self._compact()
        return evicted

    def mark_evictable(self, key: OffloadKey) -> None:
        self._evictable.add(key)
        heapq.heappush(self._heap, (self._rank[key], key))
        self._compact()

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self._evictable.remove(key)
