"""Bug: a full-attention group larger than the hash block keys the prompt's last boundary
before caching the full blocks of the step.

vLLM 0.33's ``FullAttentionManager.cache_blocks`` caches the full blocks first, then the
partial tail (``single_type_kv_cache_manager.py:840-857``). As the hybrid coordinator caches
up to the scheduler block only, the block holding the boundary fills in the step that keys
it: vLLM stores its full key, then the partial key as a secondary key (two ``BlockStored``);
the other order makes the partial key primary and promotes it at once (``BlockStored``,
``BlockRemoved``, ``BlockStored``), and the block ends with one key
(docs/semantics.md#partial-block-keys).
"""

from _hybrid_mutant_base import build_hybrid

from kvcheck.reference_impl.single_type_kv_cache_manager import (
    FullAttentionManager,
    SingleTypeKVCacheManager,
)


class PartialFirst(FullAttentionManager):
    def cache_blocks_with_partial_tail_block(self, request, num_tokens):
        self._cache_partial_tail_block(request, num_tokens)  # BUG: before the full blocks
        SingleTypeKVCacheManager.cache_blocks(self, request, num_tokens)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_hybrid(
    "hybrid_partial_before_full", managers={FullAttentionManager: PartialFirst})
