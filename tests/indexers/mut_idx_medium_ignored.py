"""Stores and removals of every medium count as the GPU cache's (a CPU offload tier's blocks
taken for GPU blocks: the router over-scores the worker)."""

import dataclasses

from _indexer_mutant_base import serve

from kvcheck.reference_impl.events import BlockRemoved, BlockStored
from kvcheck.reference_impl.kv_indexer import KVIndexer


class MediumIgnored(KVIndexer):
    def _apply_events(self, worker, events):  # type: ignore[no-untyped-def]
        super()._apply_events(worker, [
            dataclasses.replace(e, medium="GPU") if isinstance(e, (BlockStored, BlockRemoved))
            else e for e in events])


IMPL_INFO, make_indexer = serve("mut_idx_medium_ignored", MediumIgnored)
