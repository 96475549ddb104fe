"""Bug: a full-attention group larger than the hash block keys every hash boundary inside
its blocks (up to the prompt's last one) instead of only the prompt's last one.

vLLM 0.33's ``_cache_partial_tail_block`` registers "only the final prompt hash boundary";
"intermediate hash boundaries inside the same cache block are intentionally skipped"
(``single_type_kv_cache_manager.py:859-897``; docs/semantics.md#partial-block-keys). The extra
keys show as extra ``BlockStored`` events of one hash block each.
"""

from _hybrid_mutant_base import build_hybrid

from kvcheck.reference_impl.single_type_kv_cache_manager import FullAttentionManager


class EveryBoundary(FullAttentionManager):
    def _cache_partial_tail_block(self, request, num_tokens):
        hbs = self.hash_block_size
        last = min((request.num_prompt_tokens - 1) // hbs, len(request.block_hashes)) * hbs
        blocks = self.req_to_blocks.get(request.request_id, ())
        for boundary in range(hbs, min(last, num_tokens) + 1, hbs):  # BUG: every boundary
            if boundary % self.block_size == 0 or boundary // self.block_size >= len(blocks):
                continue
            self.block_pool.cache_partial_block(
                request, blocks[boundary // self.block_size], boundary,
                self.kv_cache_group_id, self.block_size, hbs)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_hybrid(
    "hybrid_partial_every_boundary", managers={FullAttentionManager: EveryBoundary})
