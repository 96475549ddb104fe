"""Bug: ``get_computed_blocks`` pins its hits (touches them) as a side effect.

vLLM's lookup has no side effects; ``allocate_slots`` touches the hits once it knows they fit.
Touching on lookup double-counts every hit that is then allocated and leaks the ones a
scheduler looks up but does not admit (ref counts never return to 0). It is the other half of
the lookup/pin split that vllm#37076 / PR #37164 got wrong (peer-systems §4 #2).
"""

from _mutant_base import build

from kvcheck.reference_impl.kv_cache_manager import KVCacheManager


class TouchingLookupManager(KVCacheManager):
    def get_computed_blocks(self, request):
        blocks, num_tokens = super().get_computed_blocks(request)
        for group in blocks:
            self.block_pool.touch(group)  # BUG: a lookup must not pin
        return blocks, num_tokens


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_lookup_touches", manager_cls=TouchingLookupManager)
