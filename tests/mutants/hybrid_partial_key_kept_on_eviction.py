"""Bug: evicting a block removes only its primary cache key; its secondary (partial-block)
key stays in the map, with no ``BlockRemoved``.

vLLM 0.33 removes every key of a block (``_remove_cached_block_hashes``: the primary key and
those of ``cached_block_hashes_by_block``, ``block_pool.py:630-648``), one ``BlockRemoved``
each (docs/semantics.md#partial-block-keys).
"""

from _hybrid_mutant_base import build_hybrid

from kvcheck.reference_impl.block_pool import BlockPool


class KeepsSecondaryKeys(BlockPool):
    def _remove_cached_block_hashes(self, block):
        key = block.block_hash
        self.cached_block_hashes_by_block.pop(block.block_id, None)  # BUG: left in the map
        self.partial_block_hash_num_tokens.pop(block.block_id, None)
        block.reset_hash()
        if key is None or self.cached_block_hash_to_block.pop(key, block.block_id) is None:
            return []
        return [key]


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_hybrid(
    "hybrid_partial_key_kept_on_eviction", pool=KeepsSecondaryKeys)
