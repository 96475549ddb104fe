"""Every hash of a store is indexed, a partial last block's included (dynamo PR #866:
TRT-LLM sent partial blocks), so a request ending in that block's tokens over-matches."""

from _indexer_mutant_base import serve

from kvcheck.reference_impl.events import BlockStored
from kvcheck.reference_impl.kv_indexer import KVIndexer


class PartialBlockCounted(KVIndexer):
    def _apply_events(self, worker, events):  # type: ignore[no-untyped-def]
        for event in events:
            if isinstance(event, BlockStored) and event.medium in ("GPU", None):
                for block_hash in event.block_hashes:
                    worker.copies[event.group_idx, block_hash] += 1
            else:
                super()._apply_events(worker, [event])


IMPL_INFO, make_indexer = serve("mut_idx_partial_block_counted", PartialBlockCounted)
