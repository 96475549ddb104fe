"""Bug: the pool reserves its last block as the null block, so block 0 is handed out.

kvcached#398 (peer-systems §4 #7): a race made the null block something other than id 0 and a
real request got block 0, whose KV the attention backend then skipped as padding. vLLM pops
the null block first, so it is always block 0 and never reaches a block table.
"""

from _mutant_base import build

from kvcheck.reference_impl.block_pool import BlockPool


class NullLastPool(BlockPool):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # BUG: block 0 goes back to the free queue; the last block is reserved instead.
        self.null_block.is_null = False
        self.free_block_queue.prepend_n([self.null_block])
        self.null_block = self.blocks[-1]
        self.free_block_queue.remove(self.null_block)
        self.null_block.is_null = True


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_null_block_handed_out", pool_cls=NullLastPool)
