"""A Mamba group's stores and removals are keyed as the match group's (an index that keeps
only sliding-window groups apart: AMD Infera #98, where Mamba hashes collided with attention
hashes in the router's map): a hash whose state Mamba keeps counts as an attention block
after attention evicted it."""

import dataclasses

from _indexer_mutant_base import serve

from kvcheck.reference_impl.events import BlockRemoved, BlockStored
from kvcheck.reference_impl.kv_indexer import KVIndexer


class MambaKeyedAsAttention(KVIndexer):
    def _apply_events(self, worker, events):  # type: ignore[no-untyped-def]
        mamba = {group for group, kind in worker.kinds.items() if kind == "mamba"}
        moved = [dataclasses.replace(event, group_idx=self.match_group)
                 if isinstance(event, (BlockStored, BlockRemoved)) and event.group_idx in mamba
                 else event for event in events]
        super()._apply_events(worker, moved)


IMPL_INFO, make_indexer = serve("mut_idx_mamba_keyed_as_attention", MambaKeyedAsAttention)
