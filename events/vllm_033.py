"""vLLM 0.33.0's KV-event structs (``vllm/distributed/kv_events.py``), field for field.

The bytes are msgspec's for these settings: the batch is an array ``[ts, events,
data_parallel_rank]`` (``array_like``; a trailing ``None`` rank is still written), each event a
**tagged map** ``{"type": "BlockStored", ...}`` (``tag=True``, no ``array_like``), optional
fields left out when ``None`` (``omit_defaults``). Field order is vLLM's: it is the order of
the map's keys on the wire. Class names are the tags, so they must stay vLLM's.
"""

from __future__ import annotations

from typing import Any

import msgspec

from kvcheck.events.batch import EventBatch, ExternalBlockHash

__all__ = ["AllBlocksCleared", "BlockRemoved", "BlockStored", "EventBatch", "KVCacheEvent",
           "KVEventBatch"]


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the three events; the tag is the class name."""


class BlockStored(KVCacheEvent):
    # Required: on the wire even when None.
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    # Optional: left out when None.
    extra_keys: list[tuple[Any, ...] | None] | None = None  # Any: vLLM's own field type
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
