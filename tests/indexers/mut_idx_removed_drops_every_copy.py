"""One BlockRemoved drops the hash whatever copies remain (vLLM PR #55092 seen from the
router: a removal while another physical copy is resident under-scores the worker)."""

from _indexer_mutant_base import serve

from kvcheck.reference_impl.events import BlockRemoved
from kvcheck.reference_impl.kv_indexer import KVIndexer


class RemovedDropsEveryCopy(KVIndexer):
    def _apply_events(self, worker, events):  # type: ignore[no-untyped-def]
        for event in events:
            if isinstance(event, BlockRemoved):
                for block_hash in event.block_hashes:
                    worker.copies.pop((event.group_idx, block_hash), None)
            else:
                super()._apply_events(worker, [event])


IMPL_INFO, make_indexer = serve("mut_idx_removed_drops_every_copy", RemovedDropsEveryCopy)
