"""A BlockRemoved of a hash the index does not hold is an error (dynamo PR #866's "failed to
find block to remove"), so the worker's batch is lost."""

from _indexer_mutant_base import serve

from kvcheck.reference_impl.events import BlockRemoved
from kvcheck.reference_impl.kv_indexer import KVIndexer


class UnknownRemovalRaises(KVIndexer):
    def _apply_events(self, worker, events):  # type: ignore[no-untyped-def]
        for event in events:
            if isinstance(event, BlockRemoved):
                for block_hash in event.block_hashes:
                    if (event.group_idx, block_hash) not in worker.copies:
                        raise KeyError(f"failed to find block to remove: {block_hash.hex()}")
            super()._apply_events(worker, [event])


IMPL_INFO, make_indexer = serve("mut_idx_unknown_removal_raises", UnknownRemovalRaises)
