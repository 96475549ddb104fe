"""The reference's manager-level benchmark hook (``kvcheck.bench.replay.native``).

``kvcheck.adapters.reference.make_native_manager(spec)`` gives ``ReferenceNativeManager``
that module's own builders (``reference_kv_cache_manager``, ``request_factory``), so the
engine and its requests are built exactly as ``ReferenceManager`` builds them, and exposed
with the engine's own objects: reference ``Request`` objects in, per-group ``KVCacheBlock``
lists out (as vLLM's ``KVCacheBlocks``), no id conversion.

This module imports nothing from ``kvcheck.adapters.reference`` (which imports this class),
so the two form no import cycle.
"""

from __future__ import annotations

from collections.abc import Callable

from kvcheck.adapters.native_hook import SingleGroupNativeManager
from kvcheck.conformance.protocol import KVCacheSpec, RequestView
from kvcheck.reference_impl.block_hasher import RequestBlockHasher
from kvcheck.reference_impl.kv_cache_manager import GroupBlocks, KVCacheManager
from kvcheck.reference_impl.request import Request

__all__ = ["ReferenceNativeManager"]


class ReferenceNativeManager(SingleGroupNativeManager[Request]):
    """``kvcheck.bench.replay.native.NativeManager`` over a reference ``KVCacheManager``: as in
    vLLM's scheduler, the hits of ``get_computed_blocks`` go back into ``allocate_slots`` as
    they are (one list per group).

    Args:
        spec: a single-group spec.
        build_manager: the adapter's engine builder (``reference_kv_cache_manager``).
        request_factory: the adapter's ``request_factory``; the closure it returns for the
            engine's hasher is the instance's ``new_request``, so the timed call has no extra
            layer.

    Raises:
        UnsupportedSpec: ``spec.kv_cache_groups`` is set.
    """

    manager: KVCacheManager
    new_request: Callable[[RequestView], Request]

    def __init__(self, spec: KVCacheSpec, build_manager: Callable[[KVCacheSpec], KVCacheManager],
                 request_factory: Callable[[RequestBlockHasher],
                                           Callable[[RequestView], Request]]) -> None:
        super().__init__(spec)
        self.manager = build_manager(spec)
        self.new_request = request_factory(self.manager.block_hasher)

    def append_output(self, request: Request, token_ids: list[int]) -> None:
        request.append_output_token_ids(token_ids)

    def get_computed_blocks(self, request: Request) -> tuple[GroupBlocks, int]:
        return self.manager.get_computed_blocks(request)

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       num_new_computed_tokens: int,
                       new_computed_blocks: GroupBlocks | None) -> GroupBlocks | None:
        return self.manager.allocate_slots(request, num_new_tokens, num_new_computed_tokens,
                                           new_computed_blocks)

    def num_free_blocks(self) -> int:
        return self.manager.num_free_blocks

    def block_ids(self, blocks: GroupBlocks) -> list[int]:
        return [b.block_id for b in blocks[0]]
