"""Bug: a cross-attention group drops the encoder blocks behind the decoder's position, as a
one-token sliding window would, replacing them by null blocks.

Cross attention reads the whole encoder output at every decoder step: vLLM skips nothing in
that group (``get_num_skipped_tokens`` is 0 in 0.33; 0.10.2's ``remove_skipped_blocks`` is a
no-op; docs/semantics.md#cross-attention-groups). Freed early, the encoder's KV is gone while
the request still decodes.
"""

from _hybrid_mutant_base import build_hybrid

from kvcheck.reference_impl.single_type_kv_cache_manager import CrossAttentionManager


class WindowedCross(CrossAttentionManager):
    def get_num_skipped_tokens(self, num_computed_tokens):
        return max(0, num_computed_tokens - 1)  # BUG: only the last position kept

    def _first_useful_block_v010(self, request_id, num_computed_tokens):
        return max(0, num_computed_tokens - 1) // self.block_size  # BUG (0.10.2 form)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_hybrid(
    "hybrid_cross_window_nulls", managers={CrossAttentionManager: WindowedCross})
