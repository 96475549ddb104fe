"""Stores of another block size than the index's are taken as they come (dynamo PR #1233:
a block-size mismatch between router and engine "will cause routing to fail silently")."""

from _indexer_mutant_base import serve

from kvcheck.reference_impl.kv_indexer import KVIndexer


class BlockSizeUnchecked(KVIndexer):
    def _check_block_size(self, worker_id, seq, events):  # type: ignore[no-untyped-def]
        return None


IMPL_INFO, make_indexer = serve("mut_idx_block_size_unchecked", BlockSizeUnchecked)
