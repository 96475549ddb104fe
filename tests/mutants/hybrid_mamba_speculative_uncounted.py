"""Bug: a Mamba group in mode "none" (both releases) sizes its table for ``num_tokens`` slots,
leaving out the ``block_size * num_speculative_blocks`` slots of its speculative blocks (the
draft model's states; docs/semantics.md#mamba-groups).

The speculative decoding states then have no blocks: the table is ``num_speculative_blocks``
entries short of vLLM's.
"""

from _hybrid_mutant_base import build_hybrid

from kvcheck.reference_impl.single_type_kv_cache_manager import (
    MambaManager,
    SingleTypeKVCacheManager,
)


class SpeculativeUncounted(MambaManager):
    def get_num_blocks_to_allocate_main(self, request_id, num_tokens, new_computed_blocks,
                                        total_computed_tokens, num_tokens_main_model,
                                        num_local_computed_tokens, prefill_end=0):
        if self.align or self._hit_cached_this_step(new_computed_blocks):
            return super().get_num_blocks_to_allocate_main(
                request_id, num_tokens, new_computed_blocks, total_computed_tokens,
                num_tokens_main_model, num_local_computed_tokens, prefill_end)
        return SingleTypeKVCacheManager.get_num_blocks_to_allocate(  # BUG: no extra slots
            self, request_id, num_tokens, new_computed_blocks, total_computed_tokens)

    def allocate_new_blocks_main(self, request_id, num_tokens, num_tokens_main_model):
        if self.align:
            return super().allocate_new_blocks_main(request_id, num_tokens,
                                                    num_tokens_main_model)
        return SingleTypeKVCacheManager.allocate_new_blocks(  # BUG: no extra slots
            self, request_id, num_tokens)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_hybrid(
    "hybrid_mamba_speculative_uncounted", mamba=True,
    managers={MambaManager: SpeculativeUncounted})
