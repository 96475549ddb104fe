"""``BlockHashToBlockMap``: the prefix cache, from ``BlockHashWithGroupId`` to blocks.

vLLM never deduplicates: when a block becomes full it is cached even if its key already maps
to another block, so one key may map to several blocks. Lookups return the **first inserted**
block for a key (0.33's ``get_one_block``, 0.10.2's ``next(iter(...))``).
"""

from __future__ import annotations

from collections.abc import Iterator

from kvcheck.reference_impl.block import BlockHashWithGroupId, KVCacheBlock

__all__ = ["BlockHashToBlockMap"]


class BlockHashToBlockMap:
    """``key -> {block_id: block}`` in insertion order.

    vLLM 0.33 stores a lone block unwrapped and promotes to a dict on the second insert; that
    is a memory optimisation with no observable effect, so the reference always uses a dict.
    """

    def __init__(self) -> None:
        self._cache: dict[BlockHashWithGroupId, dict[int, KVCacheBlock]] = {}

    def get_one_block(self, key: BlockHashWithGroupId) -> KVCacheBlock | None:
        """The first-inserted block cached under ``key``, or None. No side effects."""
        blocks = self._cache.get(key)
        if not blocks:
            return None
        return next(iter(blocks.values()))

    def contain(self, key: BlockHashWithGroupId, block_id: int) -> bool:
        """Whether ``block_id`` is cached under ``key`` (vLLM 0.33's ``contain``)."""
        blocks = self._cache.get(key)
        return blocks is not None and block_id in blocks

    def insert(self, key: BlockHashWithGroupId, block: KVCacheBlock) -> None:
        """Add ``block`` under ``key``; idempotent for the same (key, block)."""
        self._cache.setdefault(key, {})[block.block_id] = block

    def pop(self, key: BlockHashWithGroupId, block_id: int) -> KVCacheBlock | None:
        """Remove ``block_id`` from ``key``; returns it, or None (and changes nothing) if that
        id is not cached under ``key``. An emptied key is dropped."""
        blocks = self._cache.get(key)
        if blocks is None:
            return None
        block = blocks.pop(block_id, None)
        if not blocks:
            del self._cache[key]
        return block

    def blocks_of(self, key: BlockHashWithGroupId) -> list[KVCacheBlock]:
        """Every block cached under ``key``, in insertion order."""
        return list(self._cache.get(key, {}).values())

    def clear(self) -> None:
        self._cache.clear()

    def __len__(self) -> int:
        """Number of distinct keys (not blocks)."""
        return len(self._cache)

    def __contains__(self, key: object) -> bool:
        return key in self._cache

    def __iter__(self) -> Iterator[BlockHashWithGroupId]:
        return iter(self._cache)

    def items(self) -> Iterator[tuple[BlockHashWithGroupId, list[KVCacheBlock]]]:
        """``(key, blocks)`` pairs; for invariant checks and tests."""
        for key, blocks in self._cache.items():
            yield key, list(blocks.values())
