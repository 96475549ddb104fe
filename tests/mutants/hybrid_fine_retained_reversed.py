"""Bug: the blocks a step's copy-on-write copies retained (vLLM 0.33's fine-grained partial
hits, docs/semantics.md#fine-grained-partial-hits) are released in reverse order, ``[dst, src,
...]`` from the last copy back, instead of vLLM's ``[src, dst, src, dst, ...]``
(``Scheduler._free_cow_retained_blocks`` in its non-deferred mode: ``free_blocks(blocks)``).

Hit blocks nobody else holds go back to the free queue's tail in the wrong order, so a later
allocation evicts another cached block than vLLM's would.
"""

from _hybrid_mutant_base import build_hybrid

from kvcheck.reference_impl.block_pool import BlockPool


class ReversedRelease(BlockPool):
    def free_retained_blocks(self, ordered_blocks):
        super().free_retained_blocks(list(ordered_blocks)[::-1])  # BUG: reversed


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_hybrid(
    "hybrid_fine_retained_reversed", mamba=True, fine_grained=True, pool=ReversedRelease)
