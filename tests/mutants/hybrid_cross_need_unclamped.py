"""Bug: under vLLM 0.33 a running request's cross-attention group counts ``0 - held`` blocks
(0.10.2's unclamped arithmetic) in the capacity check instead of ``max(0 - held, 0)``.

The negative need lets a decode step that needs a block the pool lacks pass the check, and the
allocation then fails midway (vLLM 0.10.2 raises ``ValueError`` there, a real bug that 0.33
fixed with the clamp; docs/semantics.md#cross-attention-groups): a full pool must refuse the
step (None).
"""

from _hybrid_mutant_base import build_hybrid

from kvcheck.reference_impl.single_type_kv_cache_manager import (
    CrossAttentionManager,
    cdiv,
)


class UnclampedCross(CrossAttentionManager):
    def get_num_blocks_to_allocate(self, request_id, num_tokens, new_computed_blocks,
                                   total_computed_tokens):
        held = len(self.req_to_blocks.get(request_id, ()))
        return cdiv(num_tokens, self.block_size) - held  # BUG: no clamp at 0


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_hybrid(
    "hybrid_cross_need_unclamped", managers={CrossAttentionManager: UnclampedCross})
