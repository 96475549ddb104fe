"""Bug: a Mamba prefill checkpoint block (vLLM 0.33, ``num_prefill_checkpoint_blocks``;
docs/semantics.md#mamba-prefill-checkpoints) is keyed at the end of its own table block,
``(index + 1) * block_size``, instead of at the checkpoint position, where the chunk's state
was exported into it.

Where the two differ (a Mamba block larger than the hash block: the position falls inside a
later block) a request sharing the prompt hits the block at the wrong length: its state is not
the one after the hit's tokens.
"""

from _hybrid_mutant_base import build_hybrid

from kvcheck.reference_impl.single_type_kv_cache_manager import MambaManager


class KeyedAtBlockEnd(MambaManager):
    def _cache_checkpoint_block(self, request):
        rid = request.request_id
        position, idx = self._checkpoints[rid]
        # BUG: the block's own end, not the checkpoint position
        self._checkpoints[rid] = ((idx + 1) * self.block_size, idx)
        try:
            return super()._cache_checkpoint_block(request)
        finally:
            self._checkpoints[rid] = (position, idx)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_hybrid(
    "hybrid_checkpoint_keyed_at_block_end", mamba=True, fine_grained=True, checkpoints=True,
    managers={MambaManager: KeyedAtBlockEnd})
