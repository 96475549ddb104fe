"""remove_worker does nothing: the router keeps scoring a worker that left the pool."""

from _indexer_mutant_base import serve

from kvcheck.reference_impl.kv_indexer import KVIndexer


class RemovedWorkerKept(KVIndexer):
    def remove_worker(self, worker_id):  # type: ignore[no-untyped-def]
        return None


IMPL_INFO, make_indexer = serve("mut_idx_removed_worker_kept", RemovedWorkerKept)
