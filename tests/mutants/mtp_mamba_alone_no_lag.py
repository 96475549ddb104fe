"""Bug: with multi-module MTP (``num_prefill_lookahead`` K > 1) one Mamba "align" group alone
keys its states up to the last computed token, as if a Mamba state were final at once (the
drafter has no Mamba layers).

vLLM 0.33's unitary coordinator leaves the last ``K - 1`` computed tokens uncached whatever
the group's kind (``get_num_cacheable_tokens``), Mamba's state blocks included: a 12-token
prompt's state block is not keyed with K 3 (docs/semantics.md#multi-module-mtp), so a
sibling hits nothing; keyed at once, it hits 12 tokens.
"""

from __future__ import annotations

from _mtp_mutant_base import build_mtp

from kvcheck.reference_impl.kv_cache_coordinator import UnitaryKVCacheCoordinator
from kvcheck.reference_impl.single_type_kv_cache_manager import MambaManager


class MambaUnlagged(UnitaryKVCacheCoordinator):
    def _cache_blocks_finalized(self, request, num_tokens):
        if isinstance(self.manager, MambaManager):
            self.manager.cache_blocks(request, num_tokens)  # BUG: no lag for a Mamba group
        else:
            super()._cache_blocks_finalized(request, num_tokens)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_mtp(
    "mtp_mamba_alone_no_lag", coordinator=MambaUnlagged, mamba=True)
