"""Bug: a full-attention hit ending inside a block (vLLM 0.33's fine-grained partial hits,
docs/semantics.md#fine-grained-partial-hits) reserves no block for its copy-on-write:
``get_num_blocks_to_allocate`` omits vLLM's ``+ 1`` (``_has_partial_local_hit``), though
``allocate_new_blocks`` still takes one.

A pool one block short of the hit's new blocks plus its copies admits the request where vLLM
refuses it, and the allocation then takes a block the capacity check never counted.
"""

from _hybrid_mutant_base import build_hybrid

from kvcheck.reference_impl.single_type_kv_cache_manager import FullAttentionManager


class NoReservation(FullAttentionManager):
    def get_num_blocks_to_allocate_main(self, request_id, num_tokens, new_computed_blocks,
                                        total_computed_tokens, num_tokens_main_model,
                                        num_local_computed_tokens, prefill_end=0):
        # BUG: no block reserved for the copy-on-write of a hit ending inside a block
        return self.get_num_blocks_to_allocate(request_id, num_tokens, new_computed_blocks,
                                               total_computed_tokens)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_hybrid(
    "hybrid_fine_no_reservation", mamba=True, fine_grained=True,
    managers={FullAttentionManager: NoReservation})
