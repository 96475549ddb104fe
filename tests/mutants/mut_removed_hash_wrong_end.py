"""Bug (block.py): ``get_block_hash`` drops the first 4 bytes of a ``BlockHashWithGroupId``
instead of its 4-byte group-id suffix (``key[4:]`` for ``key[:-4]``).

Lookups still work (keys are compared whole), but every ``BlockRemoved`` event publishes a
hash that no ``BlockStored`` ever carried, so a KV-aware router rebuilding the cache from
events never removes anything and keeps routing to evicted prefixes: the stored/removed
desync class of peer-systems §4 #18 / #19. vLLM keys its cache by the digest followed by the
group id, so every consumer that slices the key must drop the right end.
"""

from _mutant_base import build, rebind

from kvcheck.reference_impl.block import BlockHash
from kvcheck.reference_impl.block_pool import BlockPool


def get_block_hash_wrong_end(key: bytes) -> BlockHash:
    return BlockHash(key[4:])  # BUG: the group id is the *last* 4 bytes: key[:-4]


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_removed_hash_wrong_end",
    pool_cls=rebind(BlockPool, get_block_hash=get_block_hash_wrong_end))
