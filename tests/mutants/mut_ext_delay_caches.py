"""Bug (kv_cache_manager.py): ``allocate_slots`` ignores ``delay_cache_blocks`` and caches the
blocks of an asynchronous external load at once.

Another request can then hit blocks whose KV has not arrived (garbage attention input), and a
router is told (``BlockStored``) of content the engine does not hold yet. vLLM returns before
``cache_blocks`` when the load is delayed and caches in the scheduler's ``cache_blocks`` call
once the KV is there.
"""

from __future__ import annotations

from typing import Any

from _mutant_base import build

from kvcheck.reference_impl.kv_cache_manager import KVCacheManager


class CachesAtOnce(KVCacheManager):
    def allocate_slots(self, request: Any, num_new_tokens: int, *args: Any,
                       **kwargs: Any) -> Any:
        if len(args) >= 4:
            args = (*args[:3], False)  # BUG: delay_cache_blocks dropped
        kwargs.pop("delay_cache_blocks", None)
        return super().allocate_slots(request, num_new_tokens, *args, **kwargs)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_ext_delay_caches", manager_cls=CachesAtOnce)
