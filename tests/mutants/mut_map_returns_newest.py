"""Bug (block_hash_map.py): a key cached by several blocks resolves to the *newest* block
instead of the first inserted one.

vLLM never deduplicates, so a block-aligned prompt recomputed by a second request caches a
second block under the same key; both 0.10.2 (``next(iter(...))``) and 0.33
(``get_one_block``) return the first. Returning the newest changes which physical block every
later hit pins, so the free queue, ref counts and eviction order all drift from vLLM's
(peer-systems §4 #2: which block a lookup hands out is what cross-request bleed hinges on).
"""

from __future__ import annotations

from typing import Any

from _mutant_base import build

from kvcheck.reference_impl.block import BlockHashWithGroupId, KVCacheBlock
from kvcheck.reference_impl.block_hash_map import BlockHashToBlockMap
from kvcheck.reference_impl.block_pool import BlockPool


class NewestFirstMap(BlockHashToBlockMap):
    def get_one_block(self, key: BlockHashWithGroupId) -> KVCacheBlock | None:
        blocks = self._cache.get(key)
        if not blocks:
            return None
        return next(reversed(blocks.values()))  # BUG: the first inserted block wins


class NewestFirstPool(BlockPool):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cached_block_hash_to_block = NewestFirstMap()


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_map_returns_newest", pool_cls=NewestFirstPool)
