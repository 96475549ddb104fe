"""Bug: with EAGLE a sliding-window hit pops its last block but never asked for one more.

vLLM's ``SlidingWindowManager`` needs ``cdiv(w - 1, bs) + 1`` contiguous cached blocks when it
drops the EAGLE block (``_contiguous_blocks_for_hit``, 0.10.2 and 0.33), then pops the last:
what stays is still a whole window. Without the ``+ 1`` the pop leaves one block too few (a
window of 4 at 4-token blocks: the hit [null, 2] becomes [null, null]).
"""

from __future__ import annotations

from _eagle_mutant_base import build_eagle

from kvcheck.reference_impl.single_type_kv_cache_manager import SlidingWindowManager


class ShortWindow(SlidingWindowManager):
    def find_longest_cache_hit(self, block_hashes, max_length, group_ids, alignment_tokens,
                               drop_eagle_block=False):
        if not drop_eagle_block:
            return super().find_longest_cache_hit(block_hashes, max_length, group_ids,
                                                  alignment_tokens)
        self.contiguous_blocks -= 1  # BUG: the run the drop needs is one block too short
        try:
            return super().find_longest_cache_hit(block_hashes, max_length, group_ids,
                                                  alignment_tokens, drop_eagle_block=True)
        finally:
            self.contiguous_blocks += 1


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_eagle(
    "eagle_window_no_extra_block", {SlidingWindowManager: ShortWindow})
