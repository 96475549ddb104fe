"""Bug: ``reset_prefix_cache`` drops every key and returns True while blocks are in use.

Blocks still held by running requests lose their keys, so the requests' later
``cache_full_blocks`` calls and frees work on blocks the cache no longer knows, and the
caller (an RLHF weight update) is told the cache is clean while running requests keep stale
KV. vLLM refuses (returns False, nothing changed) unless only the null block is in use;
SGLang's ``flush_cache`` likewise refuses unless the scheduler is idle.
"""

from _mutant_base import build

from kvcheck.reference_impl.block_pool import BlockPool
from kvcheck.reference_impl.events import AllBlocksCleared


class EagerResetPool(BlockPool):
    def reset_prefix_cache(self):
        # BUG: no "every block but the null block is free" check
        self.cached_block_hash_to_block.clear()
        for block in self.blocks:
            block.reset_hash()
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(AllBlocksCleared())
        return True


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_reset_while_in_use", pool_cls=EagerResetPool)
