"""Batches apply in arrival order, a replayed one included (Mooncake PR #4159: after a replay
timeout an old BlockStored landed after the newer BlockRemoved and resurrected the block)."""

from _indexer_mutant_base import serve

from kvcheck.reference_impl.kv_indexer import KVIndexer, WorkerIndex


class ArrivalOrder(KVIndexer):
    """Each sequence number applies once, but as it arrives."""

    def apply(self, worker_id, seq, events, *, replay=False):  # type: ignore[no-untyped-def]
        worker = self.workers.setdefault(worker_id, WorkerIndex())
        seen = worker.pending.setdefault(-1, [])  # the sequence numbers applied (a stash)
        if not replay:
            if worker.last_live is not None and seq < worker.last_live:
                worker.clear()
                seen.clear()
            worker.last_live = seq
        if seq in seen:
            return
        self._check_block_size(worker_id, seq, events)
        seen.append(seq)
        self._apply_events(worker, events)


IMPL_INFO, make_indexer = serve("mut_idx_arrival_order", ArrivalOrder)
