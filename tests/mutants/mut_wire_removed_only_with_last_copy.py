"""Bug (copies): no ``BlockRemoved`` while another physical copy of the hash is cached.

vLLM PR #55092 proposes exactly this; vLLM 0.33 (and the reference) send one ``BlockRemoved``
per copy dropped, matching one ``BlockStored`` per copy, and a router counts copies. Mixing
the two rules, as here (a store per copy, a removal only with the last), leaves a hash
announced after every copy is gone: the router sends requests for a prefix the worker lost.
"""

from __future__ import annotations

from dataclasses import replace

from _wire_mutant_base import build_wire, encode_as_reference

from kvcheck.reference_impl.block import make_block_hash_with_group_id
from kvcheck.reference_impl.events import BlockRemoved


def last_copy_only(adapter, events, ts):  # type: ignore[no-untyped-def]
    cached = adapter.manager.block_pool.cached_block_hash_to_block
    kept = []
    for event in events:
        sent = event
        if isinstance(event, BlockRemoved):
            # BUG: a removal is left out while the map still holds another block of the key.
            hashes = tuple(h for h in event.block_hashes
                           if make_block_hash_with_group_id(h, event.group_idx) not in cached)
            if not hashes:
                continue
            sent = replace(event, block_hashes=hashes)
        kept.append(sent)
    return encode_as_reference(adapter, kept, ts)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build_wire(
    "mut_wire_removed_only_with_last_copy", last_copy_only)
