"""Bug (kv_cache_coordinator.py): one-phase external allocation: each group adopts its hits
and takes its external blocks before the next group touches its own hits.

With several KV-cache groups, group 0's fresh external blocks can then be popped from the
free queue's head where group 1's untouched hits sit: the hit block is evicted and handed out
as new while group 1 adopts it too, the same block twice with wrong ref counts (vLLM #43884,
fixed by the two-phase allocation of PR #44409; recurrence #50454).
"""

from __future__ import annotations

from collections.abc import Sequence

from _hybrid_mutant_base import build_hybrid

from kvcheck.reference_impl.block import KVCacheBlock
from kvcheck.reference_impl.kv_cache_coordinator import HybridKVCacheCoordinator


class OnePhase(HybridKVCacheCoordinator):
    def add_computed_blocks(self, request_id: str,
                            new_computed_blocks: Sequence[Sequence[KVCacheBlock]],
                            num_local_computed_tokens: int,
                            num_external_computed_tokens: int = 0) -> None:
        if not (self.v033 and num_external_computed_tokens):
            super().add_computed_blocks(request_id, new_computed_blocks,
                                        num_local_computed_tokens, num_external_computed_tokens)
            return
        if any(request_id in m.num_cached_block for m in self.single_type_managers):
            return
        for manager, hits in zip(self.single_type_managers, new_computed_blocks, strict=True):
            # BUG: this group's external blocks are popped before the next group's hits
            # are touched.
            manager.add_local_computed_blocks(request_id, hits, num_local_computed_tokens,
                                              num_external_computed_tokens)
            manager.allocate_external_computed_blocks(
                request_id, num_local_computed_tokens, num_external_computed_tokens)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_hybrid(
    "mut_ext_one_phase", coordinator=OnePhase)
