"""Bug: sparse Mamba retention (vLLM 0.33, ``prefix_cache_retention_interval`` beside a Mamba
group; docs/semantics.md#mamba-prefill-checkpoints) is ignored: a Mamba "align" group caches
every state block that becomes full, as without a retention interval, instead of one per
retention interval plus the states at the reachable boundaries.

A request sharing a prefix then hits a state vLLM no longer holds (a longer hit), and KV
events store blocks vLLM never keys.
"""

from _hybrid_mutant_base import build_hybrid

from kvcheck.reference_impl.single_type_kv_cache_manager import MambaManager


class KeepsEveryState(MambaManager):
    def reachable_block_mask(self, request, start_block, end_block):
        return None  # BUG: every state kept, reachable or not


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_hybrid(
    "hybrid_retention_keeps_every_state", mamba=True, checkpoints=True,
    managers={MambaManager: KeepsEveryState})
