"""Bug (free_block_queue.py): ``prepend_n`` pushes the blocks one at a time, so they end up
in front of the head in *reverse* order.

An ``appendleft`` loop is the natural way to write it with a deque, and it reverses the batch:
a request freed last-block-first then has its *first* unhashed block at the head instead of its
last, so the LIFO reuse order vLLM 0.33 introduced (vllm#42656: unhashed blocks to the head,
in the order freed) is inverted. vLLM's ``prepend_n`` splices the batch keeping its order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from _mutant_base import build

from kvcheck.reference_impl.block import KVCacheBlock
from kvcheck.reference_impl.block_pool import BlockPool
from kvcheck.reference_impl.free_block_queue import FreeKVCacheBlockQueue


class OneByOnePrependQueue(FreeKVCacheBlockQueue):
    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        for block in blocks:
            super().prepend_n([block])  # BUG: each block goes in front of the previous one


class ReversedPrependPool(BlockPool):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.free_block_queue.__class__ = OneByOnePrependQueue


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_prepend_reversed", pool_cls=ReversedPrependPool)
