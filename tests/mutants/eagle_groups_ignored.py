"""Bug: vLLM 0.33's hybrid hit search ignores the per-group EAGLE flags
(``KVCacheGroupSpec.is_eagle_group``): with ``use_eagle`` every spec group drops its last
block, as if none were flagged.

vLLM 0.33 drops only in the groups of ``drop_eagle_group_ids`` (the flagged ones; every group
only when none is flagged) and a spec group drops when any member is flagged
(docs/semantics.md#prefix-cache-hits). Ignoring the flags, full attention (block 4) flagged
beside an unflagged window of 8 hits 8 tokens instead of 16, and an unflagged full-attention
group beside a flagged Mamba group hits none instead of 24.
"""

from __future__ import annotations

from _eagle_mutant_base import build_eagle

from kvcheck.reference_impl.kv_cache_coordinator import HybridKVCacheCoordinator


class FlagsIgnored(HybridKVCacheCoordinator):
    def _find_v033(self, request, max_cache_hit_length):
        if self.use_eagle:
            # BUG: every spec group drops, whichever groups are flagged
            self.spec_group_eagle = [True] * len(self.spec_groups)
        return super()._find_v033(request, max_cache_hit_length)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_eagle(
    "eagle_groups_ignored", coordinator=FlagsIgnored, mamba=True, eagle_groups=True)
