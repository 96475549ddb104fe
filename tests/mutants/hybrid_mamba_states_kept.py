"""Bug: a Mamba "align" group keeps every state block until the request is freed (vLLM 0.10.2's
Mamba behaviour, applied to 0.33's mode "align"): the state of two steps ago is never freed
and nulled (vLLM 0.33 frees every block below the skipped boundary, ``n - 1`` of ``n``
computed tokens; docs/semantics.md#mamba-groups).

A running request then holds one block per step it took instead of ``2 +
num_speculative_blocks``: the pool runs short early, and the states are not back in the free
queue (evictable, still hit) for others.
"""

from _hybrid_mutant_base import build_hybrid

from kvcheck.reference_impl.single_type_kv_cache_manager import MambaManager


class StatesKept(MambaManager):
    def remove_skipped_blocks(self, request_id, num_computed_tokens):
        if self.align:
            return  # BUG: the states of earlier steps are never freed
        super().remove_skipped_blocks(request_id, num_computed_tokens)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_hybrid(
    "hybrid_mamba_states_kept", mamba=True,
    managers={MambaManager: StatesKept})
