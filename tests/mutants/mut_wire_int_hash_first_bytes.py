"""Bug (the int hash form): a hash sent as the u64 of its first 8 bytes, not its last.

vLLM's default (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``) sends each hash as
``int.from_bytes(h[-8:], "big")``; a router that maps engine hashes to its own keys, or
compares them across workers, sees a different key for the same block from this engine.
"""

from __future__ import annotations

from dataclasses import replace

from _wire_mutant_base import build_wire, encode_as_reference

from kvcheck.reference_impl.events import BlockRemoved, BlockStored


def first_bytes(adapter, events, ts):  # type: ignore[no-untyped-def]
    out = []
    for event in events:
        sent = event
        # BUG: the first 8 bytes become the u64 (the codec takes the last 8 of what it gets).
        if isinstance(event, BlockStored):
            parent = event.parent_block_hash
            sent = replace(event, block_hashes=tuple(h[:8] for h in event.block_hashes),
                           parent_block_hash=None if parent is None else parent[:8])
        elif isinstance(event, BlockRemoved):
            sent = replace(event, block_hashes=tuple(h[:8] for h in event.block_hashes))
        out.append(sent)
    return encode_as_reference(adapter, out, ts, int_hashes=True)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_wire(
    "mut_wire_int_hash_first_bytes", first_bytes)
