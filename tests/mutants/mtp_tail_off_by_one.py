"""Bug: with multi-module MTP (``num_prefill_lookahead`` K > 1) a single group leaves the last
``K`` computed tokens uncached instead of ``K - 1``.

vLLM 0.33's ``num_reprefillable_tokens`` is ``num_prefill_lookahead - 1``: MTP's first module
reads the token after the chunk, so only ``K - 1`` of the computed ones may be re-prefilled
(docs/semantics.md#multi-module-mtp). One token too many, a block completed by exactly
``K - 1`` more computed tokens stays uncached one step longer and a request sharing it misses.
"""

from __future__ import annotations

from _mtp_mutant_base import build_mtp

from kvcheck.reference_impl.kv_cache_coordinator import UnitaryKVCacheCoordinator


class OneTooManyUnitary(UnitaryKVCacheCoordinator):
    def _cache_blocks_finalized(self, request, num_tokens):
        # BUG: K tokens held back, not K - 1
        self.manager.cache_blocks(request, max(0, num_tokens - self.num_reprefillable_tokens - 1))


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_mtp(
    "mtp_tail_off_by_one", coordinator=OneTooManyUnitary)
