"""KV-cache events, as vLLM's ``distributed/kv_events.py`` publishes them.

``BlockStored`` is emitted once per ``cache_full_blocks`` call that caches at least one block,
``BlockRemoved`` once per map key dropped by eviction, ``AllBlocksCleared`` by a successful
``reset_prefix_cache``. Hashes are the bare ``BlockHash`` bytes (no group suffix); a consumer
that wants vLLM's default integer form applies ``hashing.to_event_int``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["AllBlocksCleared", "BlockRemoved", "BlockStored", "KVCacheEvent", "KVEventFactory"]


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Blocks newly cached by one request, in chain order.

    ``parent_block_hash`` is the hash of the block before ``block_hashes[0]`` (None at the
    start of a prompt); ``token_ids`` holds exactly ``block_size * len(block_hashes)`` tokens.
    ``extra_keys`` has one entry per block (untagged, see ``extra_keys.to_event_extra_keys``).
    ``lookahead_token_ids`` (vLLM 0.33, hash lookahead ``L > 0`` only; None otherwise): per
    block, the ``L`` tokens after it that its hash covers.
    """

    block_hashes: tuple[bytes, ...]
    parent_block_hash: bytes | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None
    medium: str | None = "GPU"
    lora_name: str | None = None
    extra_keys: tuple[object, ...] | None = None
    group_idx: int = 0
    lookahead_token_ids: tuple[tuple[int, ...], ...] | None = None


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


class KVEventFactory(Protocol):
    """What a ``BlockPool`` builds its events with: three callables named after the events,
    called with the keywords of this module's classes (``BlockStored(block_hashes=...,
    parent_block_hash=..., token_ids=..., block_size=..., lora_id=..., medium=...,
    lora_name=..., extra_keys=..., group_idx=...)``, plus ``lookahead_token_ids=...`` only
    from a pool hashing with lookahead (vLLM 0.33), ``BlockRemoved(block_hashes=...,
    medium=..., group_idx=...)``, ``AllBlocksCleared()``), hashes as bare ``BlockHash`` bytes.

    This module itself is the default factory (the dataclasses above). A factory may build
    another form of the same event as it happens, as vLLM's ``BlockPool`` builds the msgspec
    structs its publisher encodes: ``kvcheck.events.wire_events`` builds a release's wire
    structs, so draining and encoding a step's events costs what it costs vLLM.
    """

    # The events are this module's dataclasses or a release's wire structs (kvcheck.events),
    # kept in one KVCacheEvent queue; the pool never reads them.
    @property
    def BlockStored(self) -> Callable[..., Any]: ...  # Any: either form (see above)

    @property
    def BlockRemoved(self) -> Callable[..., Any]: ...  # Any: as BlockStored

    @property
    def AllBlocksCleared(self) -> Callable[[], Any]: ...  # Any: as BlockStored
