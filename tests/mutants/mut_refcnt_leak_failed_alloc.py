"""Bug: ``allocate_slots`` touches the prefix-cache hits before the capacity check and does
not undo it when the pool is short.

A failed allocation then leaves its hits pinned (``ref_cnt`` raised, out of the free queue)
with no request holding them: a permanent leak. vLLM checks capacity first and returns None
with nothing changed; the touch-ordering around that check is the vllm#37076 / PR #37164
area (peer-systems §4 #2).
"""

from _mutant_base import build

from kvcheck.reference_impl.kv_cache_manager import KVCacheManager


class TouchFirstManager(KVCacheManager):
    def allocate_slots(self, request, num_new_tokens, num_new_computed_tokens=0,
                       new_computed_blocks=None, *args, **kwargs):
        if self.enable_caching and new_computed_blocks:
            for hits in new_computed_blocks:
                self.block_pool.touch(hits)  # BUG: before the capacity check
        self.block_pool.touch = lambda blocks: None  # (the reference's own touch: done above)
        try:
            return super().allocate_slots(request, num_new_tokens, num_new_computed_tokens,
                                          new_computed_blocks, *args, **kwargs)
        finally:
            del self.block_pool.touch


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_refcnt_leak_failed_alloc", manager_cls=TouchFirstManager)
