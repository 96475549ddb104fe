"""Bug: a cache hit adopted by a new request is recorded for zeroing like a fresh block: the
worker would zero the cached KV another request's prefix reads (vLLM 0.33 records only the
blocks it takes from the pool; docs/semantics.md#worker-side-block-zeroing).
"""

from __future__ import annotations

from collections.abc import Sequence

from _feature_mutant_base import build_feature

from kvcheck.reference_impl.block import KVCacheBlock
from kvcheck.reference_impl.single_type_kv_cache_manager import FullAttentionManager


class HitsRecorded(FullAttentionManager):
    def add_local_computed_blocks(self, request_id: str,
                                  new_computed_blocks: Sequence[KVCacheBlock],
                                  num_local_computed_tokens: int,
                                  num_external_computed_tokens: int = 0) -> None:
        super().add_local_computed_blocks(request_id, new_computed_blocks,
                                          num_local_computed_tokens,
                                          num_external_computed_tokens)
        if self.records_new_block_ids:
            self.new_block_ids.extend(b.block_id for b in new_computed_blocks)  # BUG


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_feature(
    "zeroing_hits_recorded", "block_zeroing", managers={FullAttentionManager: HitsRecorded},
    mamba=True, fine_grained=True)
