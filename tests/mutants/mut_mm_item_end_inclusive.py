"""Bug (extra_keys.py): the 0.33 multimodal scan treats an item's range as closed, so a block
that starts exactly where an item ends still carries that item's key.

The overlap test must be half-open (``start < offset + length``); ``<=`` re-introduces 0.10.2's
``start > item_end`` quirk into the 0.33 format. The block after every image that ends on a
block boundary then hashes differently from vLLM's, so an external router predicting keys
misses there and everything after it (peer-systems §4 #21: a silent hash-scheme change).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from _mutant_base import build, rebind, rebind_function

from kvcheck.reference_impl.block_hasher import RequestBlockHasher
from kvcheck.reference_impl.block_pool import BlockPool
from kvcheck.reference_impl.extra_keys import generate_block_hash_extra_keys
from kvcheck.reference_impl.request import MultiModalFeature


def scan_mm_closed(features: Sequence[MultiModalFeature], start: int, end: int,
                   start_mm_idx: int) -> tuple[list[Any], int]:
    keys: list[Any] = []
    idx = start_mm_idx
    next_idx: int | None = None
    while idx < len(features):
        feature = features[idx]
        if feature.offset >= end:
            break
        item_end = feature.offset + feature.length
        if start <= item_end:  # BUG: half-open ranges overlap only when start < item_end
            keys.append(("mm", feature.identifier, feature.offset - start))
        if item_end > end and next_idx is None:
            next_idx = idx
        idx += 1
    return keys, (idx if next_idx is None else next_idx)


_extra_keys = rebind_function(generate_block_hash_extra_keys, _scan_mm_tagged=scan_mm_closed)

IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_mm_item_end_inclusive",
    hasher_cls=rebind(RequestBlockHasher, generate_block_hash_extra_keys=_extra_keys),
    pool_cls=rebind(BlockPool, generate_block_hash_extra_keys=_extra_keys))
