"""Bug: ``remove_skipped_blocks`` frees the blocks a window skipped in forward order (lowest
index first) instead of highest index first.

vLLM walks the skipped indices backwards and frees them in one ``free_blocks`` call, so the
free queue gets ``8, 7, 6`` (docs/semantics.md#skipped-tokens-and-null-blocks; G1 row 3); forward
order evicts the
chain's root first.
"""

from _hybrid_mutant_base import build_hybrid

from kvcheck.reference_impl.single_type_kv_cache_manager import SlidingWindowManager


class ForwardFreeSWA(SlidingWindowManager):
    def remove_skipped_blocks(self, request_id, num_computed_tokens):
        blocks = self.req_to_blocks.get(request_id)
        if blocks is None:
            return
        if self.v033:
            end = min(self.get_num_skipped_tokens(num_computed_tokens) // self.block_size,
                      len(blocks))
        else:
            end = min(self._first_useful_block_v010(request_id, num_computed_tokens),
                      len(blocks))
        freed = []
        for i in range(end - 1, -1, -1):
            if blocks[i].is_null:
                break
            freed.append(blocks[i])
            blocks[i] = self.null_block
        if freed:
            self.block_pool.free_blocks(reversed(freed))  # BUG: forward order


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_hybrid(
    "hybrid_skipped_forward_free", managers={SlidingWindowManager: ForwardFreeSWA})
