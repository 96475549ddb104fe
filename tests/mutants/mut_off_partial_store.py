"""Bug (offload_manager.py): a partial ``prepare_store``: when the room for every new key
cannot be made, the tier evicts what it can and stores the prefix of the keys that fits,
instead of refusing the offer with nothing changed.

The connector treats a non-None answer as the offer accepted: it schedules the stores it was
given, while chunks it never asked to drop are gone (the evictions it was told about were for
an offer the tier could not take). vLLM's ``CPUOffloadingManager.prepare_store`` is all or
nothing: the policy's ``evict`` chooses every victim before removing any, and None means no
state changed (spec kv-connector-and-offload.md §3, ``lru.py`` ``evict``).
"""

from __future__ import annotations

from collections.abc import Collection

from _offload_mutant_base import build_offload

from kvcheck.reference_impl.offload_manager import (
    CPUOffloadingManager,
    LoadStoreSpec,
    OffloadingEvent,
    PrepareStoreOutput,
)
from kvcheck.reference_impl.offload_policy import OffloadKey, ReqContext


class StoresWhatFits(CPUOffloadingManager):
    def prepare_store(self, keys: Collection[OffloadKey],
                      req_context: ReqContext) -> PrepareStoreOutput | None:
        out = super().prepare_store(keys, req_context)
        if out is not None:
            return out
        # BUG: refused (not enough room): evict what can be evicted, store what then fits.
        keys = list(keys)
        to_store = [key for key in keys if self._policy.get(key) is None]
        if self.counts is not None:
            counts = self.counts
            to_store = [key for key in to_store if counts.get(key, 0) >= self.store_threshold]
        evicted: list[OffloadKey] = []
        n = min(len(to_store) - self._num_free(), self._num_evictable)
        victims = None
        while n > 0 and (victims := self._policy.evict(n, set(keys))) is None:
            n -= 1
        for key, chunk in victims or []:
            self._num_evictable -= 1
            self._free.append(chunk.chunk_id)
            evicted.append(key)
        if evicted and self.events is not None:
            self.events.append(OffloadingEvent(evicted, self.medium, removed=True))
        to_store = to_store[:self._num_free()]
        if not to_store and not evicted:
            return None
        chunks = self._allocate(len(to_store))
        for key, chunk in zip(to_store, chunks, strict=True):
            self._policy.insert(key, chunk, req_context)
        self._num_pending += len(to_store)
        self._access(req_context).inserted.update(to_store)
        return PrepareStoreOutput(to_store, LoadStoreSpec(tuple(c.chunk_id for c in chunks)),
                                  evicted)


IMPL_INFO, make_kv_cache_manager, make_block_pool, make_offloading_manager = build_offload(
    "mut_off_partial_store", manager_cls=StoresWhatFits)
