"""Bug: the prefix-cache hit is capped at ``num_tokens`` instead of ``num_tokens - 1``.

A fully cached block-aligned prompt then hits every token and nothing is recomputed, so the
model has no logits for the last position. vLLM caps at ``num_tokens - 1``
(``max_cache_hit_length``; docs/semantics.md#prefix-cache-hits).
"""

from _mutant_base import build

from kvcheck.reference_impl.kv_cache_manager import KVCacheManager


class HitCapManager(KVCacheManager):
    def get_computed_blocks(self, request):
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return self.coordinator.empty_blocks(), 0
        # BUG: the cap is request.num_tokens - 1
        return self.coordinator.find_longest_cache_hit(request, request.num_tokens)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_hit_cap_num_tokens", manager_cls=HitCapManager)
