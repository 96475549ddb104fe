"""Bug: ``touch`` raises ``ref_cnt`` of a free cached hit but leaves it in the free queue.

The hit is then both in use and free: ``num_free_blocks`` over-counts and ``get_new_blocks``
can hand the block to another request while the first still reads it (vllm#37076's cross-
request KV bleed, peer-systems §4 #2; the free count drift of vllm#42571, §4 #1).
"""

from _mutant_base import build

from kvcheck.reference_impl.block_pool import BlockPool


class TouchKeepsQueuedPool(BlockPool):
    def touch(self, blocks):
        for block in blocks:
            if block.is_null:
                if self.profile.touch_null_ref_cnt:
                    block.ref_cnt += 1
                continue
            block.ref_cnt += 1  # BUG: not removed from the free queue when ref_cnt was 0


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_touch_keeps_in_queue", pool_cls=TouchKeepsQueuedPool)
