"""Bug: the watermark is kept free for every allocation while another request is scheduled,
a running request's (a chunk, a decode step) included; vLLM 0.33 applies it only to a
waiting or preempted request's (``request.status``), so a running request may use the
watermark's blocks (docs/semantics.md#admission-gates).
"""

from __future__ import annotations

from typing import Any

from _feature_mutant_base import build_feature

from kvcheck.reference_impl.kv_cache_manager import KVCacheManager


class WatermarkOnRunning(KVCacheManager):
    def _allocate_gated(self, *args: Any) -> Any:
        coordinator = self.coordinator
        coordinator.is_running = lambda request_id: False  # BUG: every request "waits"
        try:
            return super()._allocate_gated(*args)
        finally:
            del coordinator.is_running


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_feature(
    "admission_watermark_on_running", "admission_gates", WatermarkOnRunning)
