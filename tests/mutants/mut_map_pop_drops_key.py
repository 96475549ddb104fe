"""Bug (block_hash_map.py): evicting one block drops its whole key, with every other block
cached under it.

When two blocks hold the same key (vLLM does not deduplicate), evicting one must leave the
other findable; dropping the key leaves the survivor carrying a hash the map no longer
lists, so it never hits again and is never reported as removed: the hash-map / block-hash
inconsistency of kvcached#362 (peer-systems §4 #9). vLLM pops only ``block_id`` from the key.
"""

from __future__ import annotations

from typing import Any

from _mutant_base import build

from kvcheck.reference_impl.block import BlockHashWithGroupId, KVCacheBlock
from kvcheck.reference_impl.block_hash_map import BlockHashToBlockMap
from kvcheck.reference_impl.block_pool import BlockPool


class DropKeyMap(BlockHashToBlockMap):
    def pop(self, key: BlockHashWithGroupId, block_id: int) -> KVCacheBlock | None:
        blocks = self._cache.get(key)
        if blocks is None or block_id not in blocks:
            return None
        del self._cache[key]  # BUG: other blocks cached under key are dropped too
        return blocks[block_id]


class DropKeyPool(BlockPool):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cached_block_hash_to_block = DropKeyMap()


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_map_pop_drops_key", pool_cls=DropKeyPool)
