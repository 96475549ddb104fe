"""Keys carry no group: a sliding-window group's removal of a hash drops the full-attention
group's copy of the same hash (vLLM mixes no group into a hash; AMD Infera #98)."""

import dataclasses

from _indexer_mutant_base import serve

from kvcheck.reference_impl.events import BlockRemoved, BlockStored
from kvcheck.reference_impl.kv_indexer import KVIndexer


class GroupIgnored(KVIndexer):
    def _apply_events(self, worker, events):  # type: ignore[no-untyped-def]
        group = self.match_group
        moved = []
        for event in events:
            if isinstance(event, (BlockStored, BlockRemoved)) and event.group_idx != group:
                moved.append(dataclasses.replace(event, group_idx=group))
            else:
                moved.append(event)
        super()._apply_events(worker, moved)


IMPL_INFO, make_indexer = serve("mut_idx_group_ignored", GroupIgnored)
