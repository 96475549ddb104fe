"""``KVCacheBlock`` and the block-hash byte types.

A ``BlockHash`` is the raw digest of one full block (32 bytes for sha256, 16 for xxh3-128).
The prefix-cache map is keyed by ``BlockHashWithGroupId``: the digest followed by the
KV-cache group id as 4 big-endian unsigned bytes, exactly as vLLM builds it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NewType

from kvcheck.reference_impl.errors import KVCacheMisuseError

__all__ = [
    "BlockHash",
    "BlockHashWithGroupId",
    "KVCacheBlock",
    "get_block_hash",
    "get_group_id",
    "make_block_hash_with_group_id",
]

# Distinct types so a bare digest is never used where the group-suffixed key is expected.
BlockHash = NewType("BlockHash", bytes)
BlockHashWithGroupId = NewType("BlockHashWithGroupId", bytes)

_GROUP_ID_BYTES = 4


def group_id_suffix(group_id: int) -> bytes:
    """The 4 bytes a group id adds to a block hash: ``group_id.to_bytes(4, "big")``. Hot
    loops compute it once and append it themselves (``block_hash + suffix``)."""
    return group_id.to_bytes(_GROUP_ID_BYTES, "big", signed=False)


def make_block_hash_with_group_id(block_hash: bytes, group_id: int) -> BlockHashWithGroupId:
    """``block_hash ‖ group_id.to_bytes(4, "big")``: 36 bytes for sha256, 20 for xxhash."""
    return BlockHashWithGroupId(bytes(block_hash) + group_id_suffix(group_id))


def get_block_hash(key: bytes) -> BlockHash:
    """Strip the 4 group-id bytes from a ``BlockHashWithGroupId``."""
    return BlockHash(key[:-_GROUP_ID_BYTES])


def get_group_id(key: bytes) -> int:
    """Decode the group id from the last 4 bytes of a ``BlockHashWithGroupId``."""
    return int.from_bytes(key[-_GROUP_ID_BYTES:], "big", signed=False)


@dataclass(slots=True, eq=False)
class KVCacheBlock:
    """Metadata of one physical KV-cache block (no tensors: the kernels own the memory).

    Blocks compare by identity, like vLLM's null-block checks: two blocks are the same only if
    they are the same object, i.e. the same ``block_id`` of the same pool.
    """

    # Block ID, ranging from 0 to num_blocks - 1; block 0 is the pool's null block.
    block_id: int
    # Number of requests holding this block; 0 means it sits in the free queue (unless null).
    ref_cnt: int = 0
    # The block's primary BlockHashWithGroupId while it is cached, else None: its full key
    # (BlockPool.cache_full_blocks), or a partial-block key (BlockPool.cache_partial_block)
    # when it has none; cleared on eviction or reset.
    _block_hash: BlockHashWithGroupId | None = None
    # Intrusive free-list links; only FreeKVCacheBlockQueue may touch them.
    prev_free_block: KVCacheBlock | None = field(default=None, repr=False)
    next_free_block: KVCacheBlock | None = field(default=None, repr=False)
    # True only for the pool's placeholder block 0, which is never handed out or cached.
    is_null: bool = False

    @property
    def block_hash(self) -> BlockHashWithGroupId | None:
        """The cache key this block is stored under, or None if it is not cached."""
        return self._block_hash

    @block_hash.setter
    def block_hash(self, block_hash: BlockHashWithGroupId) -> None:
        if self._block_hash is not None:
            raise KVCacheMisuseError(
                f"block {self.block_id} already has a hash; call reset_hash() before re-keying"
            )
        self._block_hash = block_hash

    def reset_hash(self) -> None:
        """Forget the cache key (eviction or prefix-cache reset)."""
        self._block_hash = None
