"""Bug: under ``prefix_cache_retention_interval == 0`` a Mamba group reserves a prefill
checkpoint block on every prefill chunk (vLLM 0.33 reserves one only on the chunk that reaches
the prefill end, ``prefill_end``; docs/semantics.md#mamba-prefill-checkpoints).

An earlier chunk then takes one block more than vLLM's (its answer differs), and its transient
checkpoint is keyed and dropped again.
"""

from _hybrid_mutant_base import build_hybrid

from kvcheck.reference_impl.single_type_kv_cache_manager import MambaManager


class CheckpointOnEveryChunk(MambaManager):
    def _reserve_checkpoint(self, request_id, query_start, query_end, prefill_end):
        # BUG: the prefill end is ignored
        return super()._reserve_checkpoint(request_id, query_start, query_end, 0)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_hybrid(
    "hybrid_checkpoint_on_every_chunk", mamba=True, checkpoints=True,
    managers={MambaManager: CheckpointOnEveryChunk})
