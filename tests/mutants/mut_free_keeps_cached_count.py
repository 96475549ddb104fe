"""Bug (single_type_kv_cache_manager.py): ``free`` releases a request's blocks but keeps its
entry in ``num_cached_block``.

A preempted request that is re-admitted then looks like a running one: its prefix hits are
refused ("hits can only be added to a request that holds no blocks"), or without hits its
stale count says blocks are already cached, so its new blocks are never cached. Preemption
(free, then re-admit) is the path that exercises per-request state outliving ``free``; vLLM
pops both maps in ``free``.
"""

from __future__ import annotations

from _mutant_base import build

from kvcheck.reference_impl.single_type_kv_cache_manager import FullAttentionManager


class StaleCountFullAttention(FullAttentionManager):
    def free(self, request_id: str) -> None:
        blocks = self.req_to_blocks.pop(request_id, [])
        # BUG: missing self.num_cached_block.pop(request_id, None)
        self.block_pool.free_blocks(reversed(blocks))


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_free_keeps_cached_count", managers={FullAttentionManager: StaleCountFullAttention})
