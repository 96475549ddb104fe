"""ARC (adaptive replacement) for the offload tier, as vLLM 0.33's
``v1/kv_offload/cpu/policies/arc.py`` runs it (docs/semantics.md#the-offload-tier).

* ``T1`` holds chunks seen once, ``T2`` chunks reused; both in LRU order (oldest first).
  ``B1`` / ``B2`` remember keys recently evicted from each (ghosts, no data), at most
  ``cache_capacity`` each.
* A new chunk enters ``T1`` (and leaves the ghost lists). A request that *reuses* a ready chunk
  promotes it to ``T2`` once, when the request finishes; chunks it only inserted keep their
  list and move to its newest end. An explicit ``touch`` promotes a ready ``T1`` chunk too, and
  keeps a pending one in ``T1``.
* A store miss on a ghost adapts ``target_t1_size`` once per request: a ``B1`` hit grows it by
  ``max(1, |B2| / |B1|)`` (up to the capacity), a ``B2`` hit shrinks it by
  ``max(1, |B1| / |B2|)`` (down to 0).
* Eviction takes from ``T1`` while its (simulated) size is at least ``int(target_t1_size)``,
  else from ``T2``, falling back to the other list; each list is scanned once, oldest first,
  for unpinned, ready, unprotected chunks. Evicted keys join the ghost list of their list.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence

from kvcheck.reference_impl.offload_policy import (
    CachePolicy,
    ChunkStatus,
    OffloadKey,
    ReqContext,
    order_request_keys,
)

__all__ = ["ARCCachePolicy"]

_Items = Iterator[tuple[OffloadKey, ChunkStatus]]


class ARCCachePolicy(CachePolicy):
    """See the module docstring."""

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.target_t1_size = 0.0
        self.t1: OrderedDict[OffloadKey, ChunkStatus] = OrderedDict()
        self.t2: OrderedDict[OffloadKey, ChunkStatus] = OrderedDict()
        self.b1: OrderedDict[OffloadKey, None] = OrderedDict()
        self.b2: OrderedDict[OffloadKey, None] = OrderedDict()

    def get(self, key: OffloadKey) -> ChunkStatus | None:
        chunk = self.t1.get(key)
        return chunk if chunk is not None else self.t2.get(key)

    def insert(self, key: OffloadKey, chunk: ChunkStatus, req_context: ReqContext) -> None:
        self.t1[key] = chunk
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def remove(self, key: OffloadKey) -> None:
        if self.t1.pop(key, None) is None:
            self.t2.pop(key, None)

    def _ghost_hit(self, key: OffloadKey) -> None:
        """Adapt the target to a miss on a ghost (a key evicted recently)."""
        if key in self.b1:
            grow = max(1, len(self.b2) / len(self.b1))
            self.target_t1_size = min(self.target_t1_size + grow, self.cache_capacity)
            self.b1.move_to_end(key)
        elif key in self.b2:
            shrink = max(1, len(self.b1) / len(self.b2))
            self.target_t1_size = max(self.target_t1_size - shrink, 0)
            self.b2.move_to_end(key)

    def on_store_miss(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        for key in reversed(list(keys)):
            self._ghost_hit(key)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        for key in reversed(list(keys)):
            if key in self.t1:
                chunk = self.t1.pop(key)
                # A chunk still being written was not really used twice: it stays in T1.
                (self.t2 if chunk.is_ready else self.t1)[key] = chunk
            elif key in self.t2:
                self.t2.move_to_end(key)
            else:
                self._ghost_hit(key)

    def on_request_finished(self, key_groups: Sequence[Sequence[OffloadKey]],
                            insertion_only_keys: set[OffloadKey], reused_keys: set[OffloadKey],
                            req_context: ReqContext) -> None:
        for key in reversed(order_request_keys(key_groups, req_context)):
            if key in insertion_only_keys:
                # Storing is not a reuse: newest end of whichever list holds it.
                if key in self.t1:
                    self.t1.move_to_end(key)
                elif key in self.t2:
                    self.t2.move_to_end(key)
            elif key in reused_keys:
                if key in self.t1:
                    self.t2[key] = self.t1.pop(key)
                elif key in self.t2:
                    self.t2.move_to_end(key)

    def clear(self) -> None:
        for table in (self.t1, self.t2, self.b1, self.b2):
            table.clear()
        self.target_t1_size = 0.0

    def evict(self, n: int,
              protected: set[OffloadKey]) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        if n == 0:
            return []

        def next_victim(items: _Items) -> tuple[OffloadKey, ChunkStatus] | None:
            for key, chunk in items:
                if chunk.ref_cnt == 0 and key not in protected:
                    return key, chunk
            return None

        # Choose all n first (each list scanned once, oldest first), then apply: a failure
        # changes nothing.
        t1_items, t2_items = iter(self.t1.items()), iter(self.t2.items())
        t1_size = len(self.t1)
        chosen: list[tuple[OffloadKey, ChunkStatus, bool]] = []
        for _ in range(n):
            victim = None
            from_t1 = True
            if t1_size >= int(self.target_t1_size):
                victim = next_victim(t1_items)
                from_t1 = True
            if victim is None:
                victim = next_victim(t2_items)
                from_t1 = False
            if victim is None:
                victim = next_victim(t1_items)
                from_t1 = True
                if victim is None:
                    return None
            if from_t1:
                t1_size -= 1
            chosen.append((*victim, from_t1))

        evicted = []
        for key, chunk, from_t1 in chosen:
            if from_t1:
                del self.t1[key]
                self.b1[key] = None
            else:
                del self.t2[key]
                self.b2[key] = None
            evicted.append((key, chunk))
        for ghosts in (self.b1, self.b2):
            for _ in range(len(ghosts) - self.cache_capacity):
                ghosts.popitem(last=False)
        return evicted
