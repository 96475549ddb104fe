"""Bug: vLLM 0.33's hybrid hit search with EAGLE does not widen a dropping group's search by
the unit it drops.

vLLM's ``HybridKVCacheCoordinator.find_longest_cache_hit`` searches a dropping group up to the
candidate length plus ``eagle_proof_margin`` (its block, or the hash block when the search is
fine-grained; at most the request's hashed tokens), so the drop lands back on the candidate
length (docs/semantics.md#hits-per-group-and-the-common-hit-length). Unwidened, each group's
drop cuts below the candidate: full attention 4 beside a window of 8, 20 tokens cached, hits
12 tokens instead of 16 (0.10.2's answer, not 0.33's).
"""

from __future__ import annotations

from _eagle_mutant_base import build_eagle

from kvcheck.reference_impl.kv_cache_coordinator import HybridKVCacheCoordinator
from kvcheck.reference_impl.kv_cache_interface import MambaSpec


class UnwidenedSearch(HybridKVCacheCoordinator):
    def _search(self, spec, ids, request, max_length, drop_eagle_block=False):
        if drop_eagle_block and self.v033 and not isinstance(spec, MambaSpec):
            manager = self.single_type_managers[ids[0]]
            fine = (self.enable_partial_hash_hits and manager.supports_fine_grained_hash_lookup
                    and manager.block_size > self.hash_block_size)
            # BUG: take back the margin the search adds (eagle_proof_margin)
            max_length -= self.hash_block_size if fine else manager.block_size
        return super()._search(spec, ids, request, max_length, drop_eagle_block)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_eagle(
    "eagle_no_search_margin", coordinator=UnwidenedSearch, mamba=True)
