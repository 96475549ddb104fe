"""Requests are hashed without the workers' hash lookahead (vLLM 0.33's
``num_hash_lookahead_tokens``, on by default for EAGLE and MTP drafters with prefix caching):
every key a worker stores covers the token(s) after its block, none of the index's does, so
every match is 0 and routing silently falls back to load balancing."""

from _indexer_mutant_base import serve

from kvcheck.reference_impl.kv_indexer import KVIndexer


class LookaheadIgnored(KVIndexer):
    def __init__(self, block_size, **options):  # type: ignore[no-untyped-def]
        options.pop("num_hash_lookahead_tokens", None)
        super().__init__(block_size, **options)


IMPL_INFO, make_indexer = serve("mut_idx_lookahead_ignored", LookaheadIgnored)
