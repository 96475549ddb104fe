"""KV-cache events, as vLLM's ``distributed/kv_events.py`` publishes them.

``BlockStored`` is emitted once per ``cache_full_blocks`` call that caches at least one block,
``BlockRemoved`` once per map key dropped by eviction, ``AllBlocksCleared`` by a successful
``reset_prefix_cache``. Hashes are the bare ``BlockHash`` bytes (no group suffix); a consumer
that wants vLLM's default integer form applies ``hashing.to_event_int``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["AllBlocksCleared", "BlockRemoved", "BlockStored", "KVCacheEvent"]


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Blocks newly cached by one request, in chain order.

    ``parent_block_hash`` is the hash of the block before ``block_hashes[0]`` (None at the
    start of a prompt); ``token_ids`` holds exactly ``block_size * len(block_hashes)`` tokens.
    ``extra_keys`` has one entry per block (untagged, see ``extra_keys.to_event_extra_keys``).
    """

    block_hashes: tuple[bytes, ...]
    parent_block_hash: bytes | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None
    medium: str | None = "GPU"
    lora_name: str | None = None
    extra_keys: tuple[Any, ...] | None = None
    group_idx: int = 0


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Keys dropped from the prefix cache (one event per key, as vLLM emits them)."""

    block_hashes: tuple[bytes, ...]
    medium: str | None = "GPU"
    group_idx: int = 0


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The whole prefix cache was reset."""


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared
