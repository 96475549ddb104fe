"""Bug: the hybrid coordinator returns each full-attention group's own longest hit instead
of truncating it to the common hit length the other groups agreed on.

vLLM truncates every full-attention group's list to the final hit length (0.33:
``cdiv(L, bs)`` blocks; 0.10.2: ``hit // full_bs``), so every group covers the same tokens
(docs/semantics.md#hits-per-group-and-the-common-hit-length; G2 row 4: ``[1,2,3,4] · [0,0,8,9]`` for
8 tokens, not 5 full blocks).
"""

from _hybrid_mutant_base import build_hybrid

from kvcheck.reference_impl.kv_cache_coordinator import HybridKVCacheCoordinator
from kvcheck.reference_impl.kv_cache_interface import FullAttentionSpec


class UntruncatedHits(HybridKVCacheCoordinator):
    def find_longest_cache_hit(self, request, max_cache_hit_length):
        out, hit_length = super().find_longest_cache_hit(request, max_cache_hit_length)
        out = list(out)
        specs = (self.spec_groups if self.v033 else
                 [(self.full_spec, self.full_ids)])
        for spec, ids in specs:
            if isinstance(spec, FullAttentionSpec):
                own, _ = self._search(spec, ids, request, max_cache_hit_length)
                for gid, blocks in zip(ids, own, strict=True):
                    out[gid] = blocks  # BUG: not truncated to hit_length
        return tuple(out), hit_length


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_hybrid(
    "hybrid_hit_length_not_common", coordinator=UntruncatedHits)
