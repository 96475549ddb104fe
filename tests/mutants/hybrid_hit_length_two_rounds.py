"""Bug: the hybrid coordinator stops after two rounds over the groups instead of iterating the
hit length to a fixed point.

vLLM 0.33's ``HybridKVCacheCoordinator.find_longest_cache_hit`` repeats the search over every
attention kind while a later kind shortened the hit
(docs/semantics.md#hits-per-group-and-the-common-hit-length). A coordinator capped at a second
round passes every scenario one round gets wrong but two rounds right; with four or more kinds
the second round's length may itself be cut, and the earlier groups hold no valid window at the
third: two rounds return a hit length that some group does not hold.
"""

from _hybrid_mutant_base import build_hybrid

from kvcheck.reference_impl.kv_cache_coordinator import HybridKVCacheCoordinator
from kvcheck.reference_impl.kv_cache_interface import FullAttentionSpec
from kvcheck.reference_impl.single_type_kv_cache_manager import cdiv


class TwoRounds(HybridKVCacheCoordinator):
    def _find_v033(self, request, max_cache_hit_length):
        hit_length = max_cache_hit_length
        longest = 0
        by_group = [None] * len(self.specs)
        length_by_group = [0] * len(self.specs)
        simple = (len(self.spec_groups) == 2
                  and isinstance(self.spec_groups[0][0], FullAttentionSpec))
        for _ in range(2):  # BUG: two rounds at most
            curr = hit_length
            for spec, ids in self.spec_groups:
                first = ids[0]
                if isinstance(spec, FullAttentionSpec) and by_group[first] is not None:
                    curr = min(curr, length_by_group[first])
                    continue
                hits, new_len = self._search(spec, ids, request, curr)
                curr = new_len
                for gid, blocks in zip(ids, hits, strict=True):
                    by_group[gid] = blocks
                    length_by_group[gid] = new_len
                longest = max(longest, curr)
            if curr >= hit_length:
                break
            hit_length = curr
            if simple:
                break
        for spec, ids in self.spec_groups:
            if not isinstance(spec, FullAttentionSpec):
                continue
            keep = cdiv(hit_length, spec.block_size)
            for gid in ids:
                if by_group[gid] is not None:
                    del by_group[gid][keep:]
        out = tuple(b if b is not None else [] for b in by_group)
        return out, hit_length, longest - hit_length


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_hybrid(
    "hybrid_hit_length_two_rounds", coordinator=TwoRounds)
