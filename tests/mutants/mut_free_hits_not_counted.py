"""Bug (single_type_kv_cache_manager.py): the capacity check ignores prefix hits that sit in
the free queue.

Touching such a hit takes it out of the free queue, so it consumes a free block just like a
new one; without counting it ``allocate_slots`` admits a request the pool cannot hold and the
pop of the new blocks runs dry half-way (after the hits were pinned). vLLM counts them
(``num_evictable_computed_blocks``); capacity math that disagrees with what allocation
consumes is vllm#19031 (peer-systems §4 #6) and the "can_allocate but popleft_n asserts" of
vllm#42085 (#10).
"""

from __future__ import annotations

from collections.abc import Sequence

from _mutant_base import build

from kvcheck.reference_impl.block import KVCacheBlock
from kvcheck.reference_impl.single_type_kv_cache_manager import FullAttentionManager, cdiv


class UncountedHitsFullAttention(FullAttentionManager):
    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int,
                                   new_computed_blocks: Sequence[KVCacheBlock],
                                   total_computed_tokens: int) -> int:
        held = len(self.req_to_blocks.get(request_id, ()))
        num_new = cdiv(num_tokens, self.block_size) - len(new_computed_blocks) - held
        return max(num_new, 0)  # BUG: + the hits with ref_cnt == 0 (they leave the queue)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_free_hits_not_counted", managers={FullAttentionManager: UncountedHitsFullAttention})
