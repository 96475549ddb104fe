"""Bug: with multi-module MTP (``num_prefill_lookahead`` K > 1) a single group caches its
blocks up to the last computed token, the re-prefillable tail included.

vLLM 0.33's ``KVCacheCoordinator.get_num_cacheable_tokens`` leaves the last ``K - 1``
computed tokens uncached (``num_reprefillable_tokens``): MTP's modules may re-prefill them,
so a block ending there is cached only once more tokens are computed
(docs/semantics.md#multi-module-mtp). Cached at once, a 12-token prompt's third block hits
for the next request (12 tokens, not 8).
"""

from __future__ import annotations

from _mtp_mutant_base import build_mtp

from kvcheck.reference_impl.kv_cache_coordinator import UnitaryKVCacheCoordinator


class EagerUnitary(UnitaryKVCacheCoordinator):
    def _cache_blocks_finalized(self, request, num_tokens):
        self.manager.cache_blocks(request, num_tokens)  # BUG: the tail is cached too


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_mtp(
    "mtp_tail_cached", coordinator=EagerUnitary)
