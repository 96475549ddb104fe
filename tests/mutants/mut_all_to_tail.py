"""Bug: under the 0.33 profile every freed block is appended to the tail of the free queue.

That is vLLM <= 0.23's append-all order (and, with caching off, the 0.27.0 regression
vllm#48017, fixed by vllm#51482): unhashed blocks should go to the head for LIFO reuse
(vllm#42656), hashed ones to the tail.
"""

from dataclasses import replace

from _mutant_base import build

from kvcheck.reference_impl.block_pool import BlockPool


class AllToTailPool(BlockPool):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.profile = replace(self.profile, free_order="append_all")  # BUG: 0.10's free order


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_all_to_tail", pool_cls=AllToTailPool)
