"""Requests are hashed in blocks of the match group's block size, not of the hash block
(vLLM 0.33 hashes in blocks of the gcd of the groups' block sizes and keys a larger block by
the hash at its last hash-block boundary): no key the worker stores is ever a request's, and
every match of a hybrid model's workers is 0 ("routing will fail silently")."""

from _indexer_mutant_base import serve

from kvcheck.reference_impl.kv_cache_manager import make_block_hasher
from kvcheck.reference_impl.kv_indexer import KVIndexer
from kvcheck.reference_impl.profiles import get_profile


class HashedAtBlockSize(KVIndexer):
    def __init__(self, block_size, **options):  # type: ignore[no-untyped-def]
        super().__init__(block_size, **options)
        self._scale = 1
        self._hasher = make_block_hasher(
            block_size, options.get("hash_algo", "sha256"),
            get_profile(options.get("profile", "vllm-0.33")),
            options.get("pythonhashseed", "0"))


IMPL_INFO, make_indexer = serve("mut_idx_hashed_at_block_size", HashedAtBlockSize)
