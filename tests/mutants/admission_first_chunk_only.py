"""Bug: ``allocate_slots(..., full_sequence_must_fit=True)`` checks only the step's own
blocks (the first chunk), as before vLLM 0.33's gate: a request whose full sequence cannot
fit is admitted and then thrashes (preempted chunk after chunk), which the gate exists to
stop (docs/semantics.md#admission-gates).
"""

from __future__ import annotations

from typing import Any

from _feature_mutant_base import build_feature

from kvcheck.reference_impl.kv_cache_manager import KVCacheManager


class FirstChunkOnly(KVCacheManager):
    def _allocate_gated(self, *args: Any) -> Any:
        # (..., full_sequence_must_fit, reserved_blocks, has_scheduled_reqs)
        return super()._allocate_gated(*args[:-3], False, *args[-2:])  # BUG: no gate


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_feature(
    "admission_first_chunk_only", "admission_gates", FirstChunkOnly)
