"""Bug: a Mamba "align" group hands off a running request's own partial tail from its table
block (the copy's source) instead of the copy-on-write copy (vLLM 0.33 offers ``cow_block``;
docs/semantics.md#boundary-state-hand-offs): the step that makes the copy goes on computing
into the source, so by the time a KV connector reads it, it holds a later state than the
boundary it is handed off at.

The hand-off content law (the block holds the state after exactly ``boundary_tokens`` tokens)
breaks; the recorded drains differ from vLLM's.
"""

from _hybrid_mutant_base import build_hybrid

from kvcheck.reference_impl.single_type_kv_cache_manager import MambaManager


class SourceNotCopy(MambaManager):
    def _offer_producer_tail(self, rid, source_block, cow_block):
        super()._offer_producer_tail(rid, source_block, source_block)  # BUG: the source


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_hybrid(
    "hybrid_offload_source_not_copy", mamba=True, fine_grained=True, offloads=True,
    managers={MambaManager: SourceNotCopy})
