"""Bug (kv_cache_manager.py): a late ``cache_blocks`` (after an asynchronous load) forgets
what the request already cached and stores from its first block.

The local hit's blocks are then announced again with no parent, and the loaded blocks'
``BlockStored`` does not chain to the last block cached before: a router rebuilding the
prefix tree from the events gets the wrong parent. vLLM caches from the request's
``num_cached_block``.
"""

from __future__ import annotations

from typing import Any

from _mutant_base import build

from kvcheck.reference_impl.kv_cache_manager import KVCacheManager


class RecachesFromStart(KVCacheManager):
    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        for manager in self.coordinator.single_type_managers:
            if request.request_id in manager.num_cached_block:
                manager.num_cached_block[request.request_id] = 0  # BUG: starts over
                for block in manager.req_to_blocks[request.request_id]:
                    if not block.is_null and block.block_hash is not None:
                        block.reset_hash()
        super().cache_blocks(request, num_computed_tokens)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_ext_recache_from_start", manager_cls=RecachesFromStart)
