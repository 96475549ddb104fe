"""The reference's manager-level benchmark hook (``kvcheck.bench.native``).

``make_native_manager(spec)`` builds the reference ``KVCacheManager`` exactly as
``kvcheck.adapters.reference.ReferenceManager`` does and exposes it with the engine's own
objects: reference ``Request`` objects in, ``KVCacheBlock`` lists out, no id conversion.

Kept free of a module-level import of ``kvcheck.adapters.reference`` so that that module can
re-export the hook (``from kvcheck.adapters.reference_native import make_native_manager``)
without an import cycle.
"""

from __future__ import annotations

from typing import Any

from kvcheck.conformance.protocol import KVCacheSpec, RequestView, UnsupportedSpec
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager
from kvcheck.reference_impl.request import LoRARequest, MultiModalFeature, Request

__all__ = ["ReferenceNativeManager", "make_native_manager"]


class ReferenceNativeManager:
    """``kvcheck.bench.native.NativeManager`` over the reference ``KVCacheManager``."""

    def __init__(self, spec: KVCacheSpec) -> None:
        if spec.kv_cache_groups:
            raise UnsupportedSpec("the manager-level benchmark hook covers single-group "
                                  "specs only (kv_cache_groups is set)")
        from kvcheck.adapters.reference import reference_profile

        self.spec = spec
        self.manager = KVCacheManager(
            spec.num_blocks,
            spec.block_size,
            max_model_len=spec.max_model_len,
            enable_caching=spec.enable_caching,
            hash_algo=spec.hash_algo,
            profile=reference_profile(spec),
            enable_kv_cache_events=spec.enable_kv_cache_events,
            pythonhashseed=spec.pythonhashseed,
        )
        self._hasher = self.manager.block_hasher

    def new_request(self, view: RequestView) -> Request:
        return Request(
            view.request_id,
            view.prompt_token_ids,
            block_hasher=self._hasher,
            lora_request=None if view.lora is None else LoRARequest(*view.lora),
            mm_features=tuple(MultiModalFeature(*f) for f in view.mm_features),
            cache_salt=view.cache_salt,
            skip_reading_prefix_cache=view.skip_reading_prefix_cache,
        )

    def append_output(self, request: Request, token_ids: list[int]) -> None:
        request.append_output_token_ids(token_ids)

    def get_computed_blocks(self, request: Request) -> tuple[Any, int]:
        return self.manager.get_computed_blocks(request)

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       num_new_computed_tokens: int, new_computed_blocks: Any) -> Any:
        return self.manager.allocate_slots(request, num_new_tokens, num_new_computed_tokens,
                                           new_computed_blocks or [])

    def free(self, request: Request) -> None:
        self.manager.free(request)

    def num_free_blocks(self) -> int:
        return self.manager.num_free_blocks

    def block_ids(self, blocks: Any) -> list[int]:
        return [b.block_id for b in blocks]


def make_native_manager(spec: KVCacheSpec) -> ReferenceNativeManager:
    """The reference manager for ``spec`` with its own objects (benchmark hook)."""
    return ReferenceNativeManager(spec)
