"""A sequence reset (a restarted engine) does not clear the worker (llm-d-router #1737): the
router keeps routing to a cache that is gone."""

from _indexer_mutant_base import serve

from kvcheck.reference_impl.kv_indexer import KVIndexer


class RestartKeepsIndex(KVIndexer):
    def apply(self, worker_id, seq, events, *, replay=False):  # type: ignore[no-untyped-def]
        worker = self.workers.get(worker_id)
        if worker is not None and not replay and worker.last_live is not None \
                and seq < worker.last_live:
            worker.applied, worker.pending = -1, {}  # the stream restarts, the keys stay
            worker.last_live = seq
        super().apply(worker_id, seq, events, replay=replay)


IMPL_INFO, make_indexer = serve("mut_idx_restart_keeps_index", RestartKeepsIndex)
