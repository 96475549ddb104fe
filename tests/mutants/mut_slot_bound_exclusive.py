"""Bug (block_table.py): ``slot_mapping_for_request`` checks ``end < capacity`` instead of
``end <= capacity``, so asking for the slots of a request whose last block is exactly full
raises.

A classic exclusive/inclusive slip in a bounds check: every step that fills a block exactly
(prefill of a block-aligned prompt, the decode that completes a block) fails, although the
request holds every slot it asks for. The valid range is
``0 <= start <= end <= len(block_ids) * block_size``.
"""

from __future__ import annotations

from collections.abc import Sequence

from _mutant_base import MutantManager, build, rebind_function

from kvcheck.adapters.reference import ReferenceManager
from kvcheck.reference_impl.block_table import slot_mapping_for_request
from kvcheck.reference_impl.errors import KVCacheMisuseError


def slot_mapping_exclusive_end(block_ids: Sequence[int], block_size: int, start: int,
                               end: int) -> list[int]:
    capacity = len(block_ids) * block_size
    if not 0 <= start <= end < capacity:  # BUG: end == capacity is valid
        raise KVCacheMisuseError(
            f"need 0 <= start <= end < len(block_ids) * block_size = {capacity}, got "
            f"start={start}, end={end}")
    return slot_mapping_for_request(block_ids, block_size, start, end)


class ExclusiveEndSlots(MutantManager):
    slot_mapping = rebind_function(ReferenceManager.slot_mapping,
                                   slot_mapping_for_request=slot_mapping_exclusive_end)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_slot_bound_exclusive", adapter_cls=ExclusiveEndSlots)
