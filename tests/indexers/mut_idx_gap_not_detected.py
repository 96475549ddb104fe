"""No sequence-gap detection (llm-d-router #1737): a batch after a gap applies at once, and
the replayed batches of the gap, now "old", are dropped, so what they did never lands."""

from _indexer_mutant_base import serve

from kvcheck.reference_impl.kv_indexer import KVIndexer, WorkerIndex


class GapNotDetected(KVIndexer):
    def apply(self, worker_id, seq, events, *, replay=False):  # type: ignore[no-untyped-def]
        worker = self.workers.setdefault(worker_id, WorkerIndex())
        if not replay:
            if worker.last_live is not None and seq < worker.last_live:
                worker.clear()
                worker.applied = -1
            worker.last_live = seq
        if seq <= worker.applied:
            return
        self._check_block_size(worker_id, seq, events)
        worker.applied = seq
        self._apply_events(worker, events)


IMPL_INFO, make_indexer = serve("mut_idx_gap_not_detected", GapNotDetected)
