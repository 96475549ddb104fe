"""Bug: the sliding-window hit search scans left to right like full attention (the longest
cached prefix) instead of right to left for the last run of ``cdiv(w - 1, bs)`` cached
blocks padded with nulls.

vLLM's ``SlidingWindowManager.find_longest_cache_hit`` scans right to left (hybrid-groups.md
docs/semantics.md#hits-per-group-and-the-common-hit-length; G2 row 4: ``[0,0,8,9]``, not
``[6,7,8,9]``): the prefix scan keeps blocks the window
never reads and stops short where an early block was evicted.
"""

from _hybrid_mutant_base import build_hybrid

from kvcheck.reference_impl.single_type_kv_cache_manager import SlidingWindowManager


class LeftToRightSWA(SlidingWindowManager):
    def find_longest_cache_hit(self, block_hashes, max_length, group_ids, alignment_tokens):
        bs = self.block_size
        computed = [[] for _ in group_ids]
        for block_hash in block_hashes[:max_length // bs]:  # BUG: left to right
            hit = self.block_pool.get_cached_block(block_hash, group_ids)
            if hit is None:
                break
            for out, block in zip(computed, hit, strict=True):
                out.append(block)
        if self.v033:
            while bs != alignment_tokens and len(computed[0]) * bs % alignment_tokens:
                for out in computed:
                    out.pop()
        return computed, len(computed[0]) * bs


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_hybrid(
    "hybrid_swa_hit_left_to_right", managers={SlidingWindowManager: LeftToRightSWA})
