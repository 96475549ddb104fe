"""Bug: a prefix-cache hit sets ``ref_cnt = 1`` instead of incrementing it.

A block shared by two requests then has ``ref_cnt == 1``; when one of them finishes the block
returns to the free queue while the other still uses it, and the next allocation hands it to
a third request: two live requests own the same physical block (cross-request KV bleed, the
vllm#37076 symptom; the mis-counted sharing of sglang#35270, peer-systems §4 #2 and #14).
"""

from _mutant_base import build

from kvcheck.reference_impl.block_pool import BlockPool


class OverwritingTouchPool(BlockPool):
    def touch(self, blocks):
        for block in blocks:
            if block.is_null:
                if self.profile.touch_null_ref_cnt:
                    block.ref_cnt += 1
                continue
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt = 1  # BUG: should be += 1


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_block_to_two_requests", pool_cls=OverwritingTouchPool)
