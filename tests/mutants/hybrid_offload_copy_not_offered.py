"""Bug: a Mamba "align" group does not hand off the copy-on-write copy of a running request's
own partial tail state (vLLM 0.33 offers that copy, ``cow_block``, at the prompt's last hash
boundary in the step that makes it; docs/semantics.md#boundary-state-hand-offs): a KV
connector never sees the one durable block holding that state, so it cannot offload the
prefix a later request could hit.

No law breaks (fewer hand-offs are still correct ones); the recorded drains and the oracle's
show the missing entry.
"""

from _hybrid_mutant_base import build_hybrid

from kvcheck.reference_impl.single_type_kv_cache_manager import MambaManager


class CopyNotOffered(MambaManager):
    def _offer_producer_tail(self, rid, source_block, cow_block):
        self._producer_partial_tail_reqs.pop(rid, None)  # BUG: consumed, never offered


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_hybrid(
    "hybrid_offload_copy_not_offered", mamba=True, fine_grained=True, offloads=True,
    managers={MambaManager: CopyNotOffered})
