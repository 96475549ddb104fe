"""Bug: the sliding window skips one token too many (``n - w + 2`` instead of
``n - w + 1``), so a block the window still reads is nulled and freed one step early.

vLLM's ``get_num_skipped_tokens`` is ``max(0, n - w + 1)``: the last ``w - 1`` computed tokens
plus the new one make the window (docs/semantics.md#skipped-tokens-and-null-blocks; G1 row 3).
"""

from _hybrid_mutant_base import build_hybrid

from kvcheck.reference_impl.single_type_kv_cache_manager import SlidingWindowManager


class EarlySWA(SlidingWindowManager):
    def get_num_skipped_tokens(self, num_computed_tokens):
        return max(0, num_computed_tokens - self.sliding_window + 2)  # BUG: + 1

    def _first_useful_block_v010(self, request_id, num_computed_tokens):
        return (num_computed_tokens - self.sliding_window + 2) // self.block_size  # BUG


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_hybrid(
    "hybrid_window_off_by_one", managers={SlidingWindowManager: EarlySWA})
