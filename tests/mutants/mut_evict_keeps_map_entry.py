"""Bug: evicting a block (popping it from the free queue) resets its hash but leaves its
entry in the prefix-cache map.

A later lookup of the old key returns the block although it now holds another request's KV
(cross-request KV bleed). The stale-key-after-reuse bug of kvcached#362 (peer-systems §4 #9);
vLLM's ``_maybe_evict_cached_block`` pops the map entry and resets the hash together.
"""

from _mutant_base import build

from kvcheck.reference_impl.block_pool import BlockPool


class StaleMapPool(BlockPool):
    def _maybe_evict_cached_block(self, block):
        if block.block_hash is None:
            return False
        block.reset_hash()  # BUG: the map still lists the block under its old key
        return True


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_evict_keeps_map_entry", pool_cls=StaleMapPool)
