"""AllBlocksCleared is a no-op (AIBrix #2287): a worker whose cache was reset keeps its
prefixes in the router."""

from _indexer_mutant_base import serve

from kvcheck.reference_impl.events import AllBlocksCleared
from kvcheck.reference_impl.kv_indexer import KVIndexer


class AllClearedIgnored(KVIndexer):
    def _apply_events(self, worker, events):  # type: ignore[no-untyped-def]
        super()._apply_events(worker, [e for e in events if not isinstance(e, AllBlocksCleared)])


IMPL_INFO, make_indexer = serve("mut_idx_all_cleared_ignored", AllClearedIgnored)
