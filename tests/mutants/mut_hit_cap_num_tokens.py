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
            return [], 0
        max_num_blocks = request.num_tokens // self.block_size  # BUG: not num_tokens - 1
        computed = []
        for block_hash in request.block_hashes[:max_num_blocks]:
            hit = self.block_pool.get_cached_block(block_hash, (0,))
            if hit is None:
                break
            computed.append(hit[0])
        return computed, len(computed) * self.block_size


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_hit_cap_num_tokens", manager_cls=HitCapManager)
