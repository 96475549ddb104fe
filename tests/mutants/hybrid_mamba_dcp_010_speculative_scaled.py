"""Bug: under vLLM 0.10.2 with decode context parallelism a Mamba group's speculative slots
are counted at its DCP-scaled block size; vLLM 0.10.2's ``MambaManager`` adds them at the
spec's own block size and divides by the scaled one (``single_type_kv_cache_manager.py:
580-583``, docs/semantics.md#decode-context-parallelism-and-prefix_match_unit).

Full attention and Mamba (one speculative block) in blocks of 2 at DCP 2, caching off: a
10-token prompt takes 4 Mamba blocks of 4 tokens instead of vLLM's 3 (12 slots).
"""

from dataclasses import replace

from _hybrid_mutant_base import build_hybrid

from kvcheck.reference_impl.single_type_kv_cache_manager import MambaManager


class ScaledSpeculativeSlots(MambaManager):
    @property
    def speculative_block_tokens(self) -> int:
        return self.block_size  # BUG: the DCP-scaled block, not the spec's

    @speculative_block_tokens.setter
    def speculative_block_tokens(self, value: int) -> None:
        pass


_INFO, make_kv_cache_manager, make_block_pool = build_hybrid(
    "hybrid_mamba_dcp_010_speculative_scaled", mamba=True,
    managers={MambaManager: ScaledSpeculativeSlots})
IMPL_INFO = replace(_INFO, capabilities=_INFO.capabilities | {"dcp", "mamba_dcp"})
