"""A BlockRemoved evicts the hash from every worker, not only the sender (AIBrix PR #2723)."""

from _indexer_mutant_base import serve

from kvcheck.reference_impl.events import BlockRemoved
from kvcheck.reference_impl.kv_indexer import KVIndexer


class RemovedOnEveryWorker(KVIndexer):
    def _apply_events(self, worker, events):  # type: ignore[no-untyped-def]
        events = list(events)
        super()._apply_events(worker, events)
        removals = [e for e in events if isinstance(e, BlockRemoved)]
        for other in self.workers.values():
            if other is not worker:
                super()._apply_events(other, removals)


IMPL_INFO, make_indexer = serve("mut_idx_removed_on_every_worker", RemovedOnEveryWorker)
