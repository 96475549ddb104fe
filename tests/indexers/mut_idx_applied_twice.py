"""A batch delivered twice (a duplicate, a replay overlapping the live stream) is applied
twice: its blocks counted twice, so one eviction leaves them "cached" (llm-d-kv-cache #691)."""

from _indexer_mutant_base import serve

from kvcheck.reference_impl.kv_indexer import KVIndexer


class AppliedTwice(KVIndexer):
    def apply(self, worker_id, seq, events, *, replay=False):  # type: ignore[no-untyped-def]
        worker = self.workers.get(worker_id)
        if worker is not None and (seq <= worker.applied or seq in worker.pending) and (
                replay or seq == worker.last_live):
            self._apply_events(worker, events)  # again
            return
        super().apply(worker_id, seq, events, replay=replay)


IMPL_INFO, make_indexer = serve("mut_idx_applied_twice", AppliedTwice)
