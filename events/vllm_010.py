"""vLLM 0.10.2's KV-event structs (``vllm/distributed/kv_events.py``), field for field.

As in 0.33 the batch is an array ``[ts, events, data_parallel_rank]``, but each event is a
**tagged array** ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
lora_id, medium]`` (``KVCacheEvent`` is ``array_like`` there too). There are no optional
fields: no ``lora_name``, ``extra_keys``, ``group_idx`` or spec metadata (0.10.2 turns the
hybrid KV-cache manager off when KV events are configured, so there is one group). Class
names are the tags, so they must stay vLLM's.
"""

from __future__ import annotations

import msgspec

from kvcheck.events.batch import EventBatch, ExternalBlockHash

__all__ = ["AllBlocksCleared", "BlockRemoved", "BlockStored", "EventBatch", "KVCacheEvent",
           "KVEventBatch"]


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base of the three events; the tag is the class name, the array's first element."""


class BlockStored(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
