"""Bug (extra_keys.py): the event form of a multimodal key drops the item's offset:
``("mm", identifier, offset)`` is published as ``identifier`` instead of
``(identifier, offset)``.

The block hashes are right; only ``BlockStored.extra_keys`` is wrong. A consumer that
recomputes hashes from events (an external KV index checking what it was told) then cannot
reproduce any block holding part of an image, and two blocks holding different slices of the
same image look identical (peer-systems §4 #5: every input that changes KV must be in the
key, here the published one).
"""

from __future__ import annotations

from typing import Any

from _mutant_base import build, rebind

from kvcheck.reference_impl.block_pool import BlockPool
from kvcheck.reference_impl.extra_keys import ExtraKeys, to_event_extra_keys


def event_keys_without_offset(extra_keys: ExtraKeys) -> ExtraKeys:
    if extra_keys is None:
        return None
    out: list[Any] = []
    for key in extra_keys:
        if isinstance(key, tuple) and key and key[0] == "mm":
            out.append(key[1])  # BUG: vLLM publishes (identifier, offset)
        else:
            out.extend(to_event_extra_keys((key,)) or ())
    return tuple(out)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_event_mm_offset_dropped",
    pool_cls=rebind(BlockPool, to_event_extra_keys=event_keys_without_offset))
