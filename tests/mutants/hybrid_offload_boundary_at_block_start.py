"""Bug: a Mamba "align" group hands off each state block it keys at the block's first token
(``index * block_size``) instead of its key's exact boundary (``(index + 1) * block_size``,
vLLM 0.33's ``block_hash_num_tokens``; docs/semantics.md#boundary-state-hand-offs): a KV
connector would store the state after ``(index + 1) * block_size`` tokens under the key of a
prefix one block shorter.

The hand-off content law (the block holds the state after exactly ``boundary_tokens`` tokens
of the request) breaks at the first drain; the recorded drains differ from vLLM's.
"""

from _hybrid_mutant_base import build_hybrid

from kvcheck.reference_impl.single_type_kv_cache_manager import MambaManager


class BoundaryAtBlockStart(MambaManager):
    def _offer_cached_states(self, rid, blocks, before, after):
        for idx in range(before, after):
            block = blocks[idx]
            if block.is_null or block.block_hash is None:
                continue
            # BUG: the block's start, not the boundary its key stands for
            self._pending_boundary_state_offloads.append(
                (rid, self.kv_cache_group_id, block, idx * self.block_size))


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_hybrid(
    "hybrid_offload_boundary_at_block_start", mamba=True, fine_grained=True, offloads=True,
    managers={MambaManager: BoundaryAtBlockStart})
