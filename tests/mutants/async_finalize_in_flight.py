"""Bug: a Mamba "align" group finalizes a finishing KV producer's partial tail although
tokens are still in flight (``finalize_partial_tail_offloads(request,
num_in_flight_tokens=k)`` with ``k > 0``): an in-flight step may still write that state
block, so the connector would offload a state that is not the boundary's (vLLM 0.33 offers
nothing then; docs/semantics.md#asynchronous-scheduling).
"""

from __future__ import annotations

from typing import Any

from _feature_mutant_base import build_feature

from kvcheck.reference_impl.single_type_kv_cache_manager import MambaManager


class FinalizeInFlight(MambaManager):
    def finalize_partial_tail_offload(self, request_id: str, num_computed_tokens: int,
                                      num_in_flight_tokens: int = 0) -> Any:
        # BUG: the in-flight tokens not looked at
        return super().finalize_partial_tail_offload(request_id, num_computed_tokens)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_feature(
    "async_finalize_in_flight", "async_scheduling", managers={MambaManager: FinalizeInFlight},
    mamba=True, fine_grained=True, offloads=True)
