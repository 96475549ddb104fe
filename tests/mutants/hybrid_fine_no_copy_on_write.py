"""Bug: a full-attention hit ending inside a block (vLLM 0.33's fine-grained partial hits,
docs/semantics.md#fine-grained-partial-hits) is not copied on write: the request keeps the
shared hit block in its table and its forward pass writes its own tokens into it, over what
the block's other holders and its cache key stand for.

The copy-on-write law (no request writes into a shared block) breaks as soon as the block's
producer still holds it; the tables and copies differ from vLLM's.
"""

from _hybrid_mutant_base import build_hybrid

from kvcheck.reference_impl.single_type_kv_cache_manager import FullAttentionManager


class NoCopyOnWrite(FullAttentionManager):
    def record_partial_local_hit(self, request_id, new_computed_blocks,
                                 num_local_computed_tokens, num_external_computed_tokens):
        return  # BUG: the partial hit block is never redirected to a private copy


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_hybrid(
    "hybrid_fine_no_copy_on_write", mamba=True, fine_grained=True,
    managers={FullAttentionManager: NoCopyOnWrite})
