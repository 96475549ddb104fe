"""Bug: a chunked-local group never releases the blocks of finished chunks (its skipped
tokens are always 0), so a long request holds every block, as full attention would.

vLLM's ``ChunkedLocalAttentionManager`` skips ``n // c * c`` tokens and nulls those blocks
(docs/semantics.md#skipped-tokens-and-null-blocks; G4 row 4).
"""

from _hybrid_mutant_base import build_hybrid

from kvcheck.reference_impl.single_type_kv_cache_manager import ChunkedLocalAttentionManager


class KeepingChunks(ChunkedLocalAttentionManager):
    def get_num_skipped_tokens(self, num_computed_tokens):
        return 0  # BUG

    def _first_useful_block_v010(self, request_id, num_computed_tokens):
        return 0  # BUG


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_hybrid(
    "hybrid_chunk_keeps_finished", managers={ChunkedLocalAttentionManager: KeepingChunks})
