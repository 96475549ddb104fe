"""Bug (kv_cache_manager.py): ``allocate_slots`` pops its new blocks *before* touching the
prefix-cache hits.

A hit that sits in the free queue can then be popped as one of the request's own new blocks:
the block is evicted (its key dropped) and handed out again while the same request also holds
it as a hit, so the request's prefix KV is overwritten by its own new tokens. This is vLLM's
``test_computed_blocks_not_evicted`` case and the touch-ordering race of vllm#37076 / PR
#37164 (peer-systems §4 #2); vLLM touches the hits first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from _mutant_base import build

from kvcheck.reference_impl.block import KVCacheBlock
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager
from kvcheck.reference_impl.request import Request


class PopFirstManager(KVCacheManager):
    def allocate_slots(self, request: Request, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_blocks: Sequence[Sequence[KVCacheBlock]] | None = None,
                       num_lookahead_tokens: int = 0,
                       delay_cache_blocks: bool = False,
                       ) -> tuple[list[KVCacheBlock], ...] | None:
        # The reference's own allocate_slots, with its touch moved after get_new_blocks.
        pool = self.block_pool
        deferred: list[KVCacheBlock] = []

        def defer_touch(blocks: Iterable[KVCacheBlock]) -> None:
            deferred.extend(blocks)

        def pop_then_touch(num_blocks: int) -> list[KVCacheBlock]:
            new = type(pool).get_new_blocks(pool, num_blocks)
            type(pool).touch(pool, deferred)  # BUG: the hits must be touched before the pop
            deferred.clear()
            return new

        pool.touch, pool.get_new_blocks = defer_touch, pop_then_touch  # type: ignore[method-assign]
        try:
            return super().allocate_slots(request, num_new_tokens, num_new_computed_tokens,
                                          new_computed_blocks, num_lookahead_tokens,
                                          delay_cache_blocks)
        finally:
            del pool.touch, pool.get_new_blocks
            type(pool).touch(pool, deferred)  # no new block was popped: touch now


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_pop_before_touch", manager_cls=PopFirstManager)
