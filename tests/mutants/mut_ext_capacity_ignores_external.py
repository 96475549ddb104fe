"""Bug (kv_cache_manager.py): the capacity check counts the new tokens' blocks but not the
external tokens' (vLLM PR #46892: an external hit undercounted in
``get_num_blocks_to_allocate``).

An admission with external tokens is then accepted when the pool cannot hold it, and the
allocation fails half-way (an exception after the hits were touched) instead of returning
None with nothing changed.
"""

from __future__ import annotations

from typing import Any

from _mutant_base import build

from kvcheck.reference_impl.kv_cache_manager import KVCacheManager


class CapacityIgnoresExternal(KVCacheManager):
    def allocate_slots(self, request: Any, num_new_tokens: int, *args: Any,
                       **kwargs: Any) -> Any:
        external = kwargs.get("num_external_computed_tokens", 0)
        if external and self.v033:
            coordinator = self.coordinator
            real = coordinator.get_num_blocks_to_allocate

            def undercount(request_id: str, num_tokens: int, hits: Any, total: int) -> int:
                # BUG: the external tokens' blocks are left out of the count.
                return real(request_id, max(0, num_tokens - external), hits, total - external)

            coordinator.get_num_blocks_to_allocate = undercount  # type: ignore[method-assign]
            try:
                return super().allocate_slots(request, num_new_tokens, *args, **kwargs)
            finally:
                del coordinator.get_num_blocks_to_allocate
        return super().allocate_slots(request, num_new_tokens, *args, **kwargs)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_ext_capacity_ignores_external", manager_cls=CapacityIgnoresExternal)
