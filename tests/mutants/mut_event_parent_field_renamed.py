"""Bug (events.py): ``BlockStored`` names its parent field ``parent_hash`` (TensorRT-LLM's
event schema) instead of vLLM's ``parent_block_hash``.

A KV-aware router built for vLLM's events (Dynamo, llm-d) then finds no parent on any event and
roots every stored run of blocks at the top of its tree, so a chunked prefill's later chunks
look like new prompts: the parent-chain breakage of dynamo#671 / TRT-LLM#3543 (peer-systems
§4 #19), reached through a schema mismatch instead of a wrong value.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from _mutant_base import build

from kvcheck.reference_impl import events
from kvcheck.reference_impl.block_pool import BlockPool


@dataclass(frozen=True, slots=True)
class BlockStored:  # the event type is reported by class name, so it keeps vLLM's name
    block_hashes: tuple[bytes, ...]
    parent_hash: bytes | None  # BUG: vLLM's field is parent_block_hash
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None
    medium: str | None = "GPU"
    lora_name: str | None = None
    extra_keys: tuple[Any, ...] | None = None
    group_idx: int = 0


class RenamedParentPool(BlockPool):
    def _block_stored_event(self, *args: Any, **kwargs: Any) -> events.BlockStored:
        fields = asdict(super()._block_stored_event(*args, **kwargs))
        fields["parent_hash"] = fields.pop("parent_block_hash")
        return BlockStored(**fields)  # type: ignore[return-value]


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_event_parent_field_renamed", pool_cls=RenamedParentPool)
