"""A store in the match group whose ``block_size`` is not the index's is always refused, a
partial-block key's included (vLLM 0.33 sends one, ``block_size`` the hash block's, for the
block holding a prompt's last hash boundary): the batch is refused with the blocks stored
beside it, and the router loses the worker's prefix (the check of dynamo PR #1233 applied
to a legitimate store)."""

from _indexer_mutant_base import serve

from kvcheck.reference_impl.kv_indexer import KVIndexer


class PartialKeyRefused(KVIndexer):
    def _is_partial_key(self, event):  # type: ignore[no-untyped-def]
        return False


IMPL_INFO, make_indexer = serve("mut_idx_partial_key_refused", PartialKeyRefused)
