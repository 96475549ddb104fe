"""Bug: ``allocate_slots(..., reserved_blocks=R)`` ignores the reservation: a step is
allowed to take the blocks vLLM 0.33 keeps free for other in-flight sequences (an async
KV-connector load's admission must fit ``free - R``; docs/semantics.md#admission-gates).
"""

from __future__ import annotations

from typing import Any

from _feature_mutant_base import build_feature

from kvcheck.reference_impl.kv_cache_manager import KVCacheManager


class ReservedIgnored(KVCacheManager):
    def _allocate_gated(self, *args: Any) -> Any:
        # (..., full_sequence_must_fit, reserved_blocks, has_scheduled_reqs)
        return super()._allocate_gated(*args[:-2], 0, args[-1])  # BUG: nothing reserved


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_feature(
    "admission_reserved_ignored", "admission_gates", ReservedIgnored)
