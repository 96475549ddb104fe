"""Bug: the full-sequence admission gate (``allocate_slots(..., full_sequence_must_fit=True)``)
counts a sliding window's or a chunked-local group's full sequence without its admission cap
(vLLM 0.33's ``max_admission_blocks_per_request``, from ``max_in_flight_tokens``): a long
request that a window holds in a few blocks at a time is refused as if every block were
kept (docs/semantics.md#admission-gates).
"""

from __future__ import annotations

from typing import Any

from _feature_mutant_base import build_feature

from kvcheck.reference_impl.single_type_kv_cache_manager import (
    ChunkedLocalAttentionManager,
    SlidingWindowManager,
)


class _Uncapped:
    max_admission_blocks_per_request: int | None

    def get_num_admission_blocks(self, *args: Any) -> Any:
        cap, self.max_admission_blocks_per_request = self.max_admission_blocks_per_request, None
        try:  # BUG: the full sequence counted without the cap
            return super().get_num_admission_blocks(*args)  # type: ignore[misc]
        finally:
            self.max_admission_blocks_per_request = cap


class UncappedWindow(_Uncapped, SlidingWindowManager):
    pass


class UncappedChunked(_Uncapped, ChunkedLocalAttentionManager):
    pass


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_feature(
    "admission_no_cap", "admission_gates",
    managers={SlidingWindowManager: UncappedWindow,
              ChunkedLocalAttentionManager: UncappedChunked})
