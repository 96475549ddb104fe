"""Bug: ``allocate_slots`` frees the blocks a sliding window (or a finished chunk, or a Mamba
group) skips at the optimistic computed count, ignoring ``num_in_flight_tokens``: under
asynchronous scheduling the step still in flight reads those blocks, and they may already be
handed to another request (vLLM 0.33 frees on the processed-token basis, ``computed -
num_in_flight_tokens``; docs/semantics.md#asynchronous-scheduling). What every engine that
copied vLLM's synchronous window freeing does.
"""

from __future__ import annotations

from typing import Any

from _feature_mutant_base import build_feature

from kvcheck.reference_impl.kv_cache_manager import KVCacheManager


class FreeOptimistic(KVCacheManager):
    def allocate_slots(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        request.num_in_flight_tokens = 0  # BUG: the in-flight tokens counted as processed
        return super().allocate_slots(request, *args, **kwargs)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_feature(
    "async_free_optimistic", "async_scheduling", FreeOptimistic)
