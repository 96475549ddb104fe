"""Bug (copies): a second physical copy of a cached hash is not announced.

The engine caches the same content twice (a request that skipped the prefix cache computed
it again) but sends ``BlockStored`` only for the first copy, while it still sends a
``BlockRemoved`` per copy evicted (as vLLM does). When the announced copy is evicted the
router drops the hash, though the other copy still serves hits: it under-scores the worker,
the effect vLLM PR #55092 describes from the router's side.
"""

from __future__ import annotations

from _wire_mutant_base import build_wire, encode_as_reference

from kvcheck.reference_impl.events import AllBlocksCleared, BlockRemoved, BlockStored


def stored_once(adapter, events, ts):  # type: ignore[no-untyped-def]
    announced = adapter.__dict__.setdefault("_announced", set())
    kept = []
    for event in events:
        if isinstance(event, AllBlocksCleared):
            announced.clear()
        elif isinstance(event, BlockRemoved):
            announced.difference_update((event.group_idx, h) for h in event.block_hashes)
        elif isinstance(event, BlockStored):
            keys = {(event.group_idx, h) for h in event.block_hashes}
            if keys <= announced:
                continue  # BUG: every hash already announced: the new copies go unsaid
            announced |= keys
        kept.append(event)
    return encode_as_reference(adapter, kept, ts)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_wire(
    "mut_wire_stored_once_per_hash", stored_once)
