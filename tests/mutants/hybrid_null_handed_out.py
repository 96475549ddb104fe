"""Bug: a sliding-window group hands out the null block for the positions a long prefill
chunk's window already skips ("no need for real blocks there"), instead of allocating real
blocks and letting ``remove_skipped_blocks`` null them at the next step.

vLLM allocates every position (``allocate_new_blocks``) and only ever nulls a position that
was computed; the null block is never a *new* block
(docs/semantics.md#allocation-caching-freeing-and-events-with-several-groups).
"""

from _hybrid_mutant_base import build_hybrid

from kvcheck.reference_impl.single_type_kv_cache_manager import SlidingWindowManager, cdiv


class NullPaddingSWA(SlidingWindowManager):
    def allocate_new_blocks(self, request_id, num_tokens):
        blocks = self.req_to_blocks.setdefault(request_id, [])
        num_new = cdiv(num_tokens, self.block_size) - len(blocks)
        if num_new <= 0:
            return []
        skipped = self.get_num_skipped_tokens(num_tokens) // self.block_size
        pad = max(0, min(num_new, skipped - len(blocks)))
        new = [self.null_block] * pad  # BUG: the null block as a new block
        new += self.block_pool.get_new_blocks(num_new - pad)
        blocks.extend(new)
        return new


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_hybrid(
    "hybrid_null_handed_out", managers={SlidingWindowManager: NullPaddingSWA})
