"""The reference's manager-level benchmark hook (``kvcheck.bench.native``).

``make_native_manager(spec)`` builds the reference ``KVCacheManager`` and its requests with
``kvcheck.adapters.reference``'s own builders (``reference_kv_cache_manager``,
``request_factory``), so exactly as ``ReferenceManager`` does, and exposes it with the engine's
own objects: reference ``Request`` objects in, ``KVCacheBlock`` lists out, no id conversion.

Kept free of a module-level import of ``kvcheck.adapters.reference`` so that that module can
re-export the hook (``from kvcheck.adapters.reference_native import make_native_manager``)
without an import cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvcheck.adapters.native_hook import SingleGroupNativeManager
from kvcheck.conformance.protocol import KVCacheSpec, RequestView
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager
from kvcheck.reference_impl.request import Request

__all__ = ["ReferenceNativeManager", "make_native_manager"]


class ReferenceNativeManager(SingleGroupNativeManager):
    """``kvcheck.bench.native.NativeManager`` over the reference ``KVCacheManager``."""

    manager: KVCacheManager
    #: The engine's request for ``view``'s prompt alone, hashed as the adapter's requests are.
    #: A closure in the instance, so the timed call has no extra layer.
    new_request: Callable[[RequestView], Request]

    def __init__(self, spec: KVCacheSpec) -> None:
        super().__init__(spec)
        from kvcheck.adapters.reference import reference_kv_cache_manager, request_factory

        self.manager = reference_kv_cache_manager(spec)
        self.new_request = request_factory(self.manager.block_hasher)

    def append_output(self, request: Request, token_ids: list[int]) -> None:
        request.append_output_token_ids(token_ids)

    def get_computed_blocks(self, request: Request) -> tuple[Any, int]:
        return self.manager.get_computed_blocks(request)

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       num_new_computed_tokens: int, new_computed_blocks: Any) -> Any:
        return self.manager.allocate_slots(request, num_new_tokens, num_new_computed_tokens,
                                           new_computed_blocks or [])

    def num_free_blocks(self) -> int:
        return self.manager.num_free_blocks

    def block_ids(self, blocks: Any) -> list[int]:
        return [b.block_id for b in blocks]


def make_native_manager(spec: KVCacheSpec) -> ReferenceNativeManager:
    """The reference manager for ``spec`` with its own objects (benchmark hook)."""
    return ReferenceNativeManager(spec)
