"""Bug (offload_manager.py): eviction of a pinned chunk: a load's pin is dropped when
``prepare_load`` hands out the slots instead of when the load completes.

While the copy from the tier is in flight the chunk's ``ref_cnt`` is back to 0, so an offer
that needs room can evict it and hand its slot to another key under the reader. This is the
TOCTOU of vLLM #39702 (fixed by PR #42289): the CPU offload tier's hits were not pinned
between the lookup and the load, the CPU LRU evicted them once eviction started, and the
scheduler's ``hit_length == num_external_tokens`` assertion failed in production. vLLM's
``CPUOffloadingManager`` keeps the pin until ``complete_load``.
"""

from __future__ import annotations

from collections.abc import Collection

from _offload_mutant_base import build_offload

from kvcheck.reference_impl.offload_manager import CPUOffloadingManager, LoadStoreSpec
from kvcheck.reference_impl.offload_policy import OffloadKey, ReqContext


class UnpinsAtPrepare(CPUOffloadingManager):
    def prepare_load(self, keys: Collection[OffloadKey],
                     req_context: ReqContext) -> LoadStoreSpec:
        spec = super().prepare_load(keys, req_context)
        super().complete_load(keys, req_context)  # BUG: unpinned before the load is done
        return spec

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self._check_keys(keys, "complete_load")  # the pin is already gone


IMPL_INFO, make_kv_cache_manager, make_block_pool, make_offloading_manager = build_offload(
    "mut_off_evicts_pinned", manager_cls=UnpinsAtPrepare)
