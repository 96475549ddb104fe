"""Bug: a Mamba "align" group accepts a hit on a state block cached in the same scheduler step
(vLLM 0.33 refuses it, answering a need of ``num_gpu_blocks + 1`` so the request waits for the
next step; docs/semantics.md#mamba-groups).

vLLM's scheduler writes a step's states after the step's forward pass, so a block cached in this
step holds no state yet when another request of the same step would read it: the hit reads a
state that is not there.
"""

from _hybrid_mutant_base import build_hybrid

from kvcheck.reference_impl.single_type_kv_cache_manager import MambaManager


class NoSameStepRefusal(MambaManager):
    def _hit_cached_this_step(self, new_computed_blocks):
        return False  # BUG: a block cached in this step is hit at once


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_hybrid(
    "hybrid_mamba_no_same_step_refusal", mamba=True,
    managers={MambaManager: NoSameStepRefusal})
