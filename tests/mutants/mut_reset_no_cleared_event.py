"""Bug (block_pool.py): a successful ``reset_prefix_cache`` clears every key but publishes
no ``AllBlocksCleared`` event.

A KV-aware router (Dynamo, llm-d) keeps the whole pre-reset tree and routes requests to a
replica whose cache is empty: after an RLHF weight update that is the worst case, stale
routing to KV computed with the old weights. Lost events desynchronise routers
(peer-systems §4 #18 / #19); vLLM emits ``AllBlocksCleared`` on every successful reset.
"""

from __future__ import annotations

from _mutant_base import build

from kvcheck.reference_impl.block_pool import BlockPool


class SilentResetPool(BlockPool):
    def reset_prefix_cache(self) -> bool:
        num_used_blocks = self.num_gpu_blocks - self.get_num_free_blocks()
        if num_used_blocks != 1:
            return False
        self.cached_block_hash_to_block.clear()
        for block in self.blocks:
            block.reset_hash()
        return True  # BUG: missing kv_event_queue.append(AllBlocksCleared())


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_reset_no_cleared_event", pool_cls=SilentResetPool)
