"""Bug: with per-group EAGLE flags (``KVCacheGroupSpec.is_eagle_group``) vLLM 0.33's hybrid
hit search widens every group's search by EAGLE's drop unit, not only the searches that drop.

vLLM 0.33 adds ``eagle_proof_margin`` to a spec group's search only when it drops
(``drop_eagle_block``), so the drop lands back at the candidate length; a group that does not
drop searches up to the candidate itself (docs/semantics.md#prefix-cache-hits). Widened
without the drop, an unflagged chunked local group beside flagged full attention finds one
block past the candidate: the sibling of a 21-token prompt hits 20 tokens instead of 16.
"""

from __future__ import annotations

from _eagle_mutant_base import build_eagle

from kvcheck.reference_impl.kv_cache_coordinator import HybridKVCacheCoordinator
from kvcheck.reference_impl.kv_cache_interface import MambaSpec


class MarginForAll(HybridKVCacheCoordinator):
    def _search(self, spec, ids, request, max_length, drop_eagle_block=False):
        manager = self.single_type_managers[ids[0]]
        if self.use_eagle and self.v033 and not manager.use_eagle and not isinstance(
                spec, MambaSpec):
            # BUG: the widened search for a group that never drops (not flagged)
            max_length = min(max_length + manager.block_size,
                             len(request.block_hashes) * self.hash_block_size)
        return super()._search(spec, ids, request, max_length, drop_eagle_block)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_eagle(
    "eagle_groups_unflagged_search_margin", coordinator=MarginForAll, mamba=True,
    eagle_groups=True)
