"""Bug: with per-group EAGLE flags (``KVCacheGroupSpec.is_eagle_group``) vLLM 0.33's hybrid
coordinator caches one block past the aligned boundary in every group, not only in the
groups that drop.

vLLM 0.33's ``get_num_cacheable_tokens`` adds the block a later EAGLE hit matches and drops
only for a manager whose ``use_eagle`` is set (a member of a dropping spec group); the others
cache up to the aligned boundary, as without EAGLE (docs/semantics.md#prefix-cache-hits).
Caching the block past it in an unflagged group keys blocks vLLM leaves uncached: the free
queue and later hits differ.
"""

from __future__ import annotations

from _eagle_mutant_base import build_eagle

from kvcheck.reference_impl.kv_cache_coordinator import HybridKVCacheCoordinator


class UnflaggedCachePast(HybridKVCacheCoordinator):
    def cache_blocks(self, request, num_tokens):
        n = self.get_num_cacheable_tokens(num_tokens)
        if not (self.enable_caching and self.use_eagle and self.v033) or n == 0:
            return super().cache_blocks(request, num_tokens)
        finalized = max(0, num_tokens - self.num_reprefillable_tokens)
        n_finalized = self.get_num_cacheable_tokens(finalized)
        for manager in self.single_type_managers:
            # BUG: every group caches the block past the boundary, flagged or not
            manager.cache_blocks(request, min(finalized, n_finalized + manager.block_size))
        return None


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_eagle(
    "eagle_groups_unflagged_cache_past_boundary", coordinator=UnflaggedCachePast, mamba=True,
    eagle_groups=True)
