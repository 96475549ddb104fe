"""Bug: ``allocate_slots`` returns the prefix-cache hits along with the new blocks.

The caller appends the returned ids to its block table, so the hits appear twice and every
later position maps to the wrong block. vLLM returns only the newly allocated blocks
(``KVCacheBlocks`` of ``new_blocks``); the hits come from ``get_computed_blocks``.
"""

from _mutant_base import build

from kvcheck.reference_impl.kv_cache_manager import KVCacheManager


class HitsInAnswerManager(KVCacheManager):
    def allocate_slots(self, request, num_new_tokens, num_new_computed_tokens=0,
                       new_computed_blocks=None, *args, **kwargs):
        new = super().allocate_slots(request, num_new_tokens, num_new_computed_tokens,
                                     new_computed_blocks, *args, **kwargs)
        if new is None or not new_computed_blocks:
            return new
        # BUG: hits are not new
        return tuple(list(hits) + blocks for hits, blocks in zip(new_computed_blocks, new,
                                                                     strict=True))


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_allocate_returns_hits", manager_cls=HitsInAnswerManager)
