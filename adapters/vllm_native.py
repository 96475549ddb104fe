"""vLLM's manager-level benchmark hook (``kvcheck.bench.replay.native``), 0.10.2 and later.

``make_native_manager(spec)`` builds vLLM's ``KVCacheManager`` with the builder
``kvcheck.adapters.vllm.VLLMManager`` uses (``kvcheck.adapters.vllm_kv_config``: one
full-attention group, the same constructor arguments; the spec's hash function and NONE_HASH)
and exposes it with vLLM's own objects: ``vllm.v1.request.Request`` in, ``KVCacheBlocks`` out.
As in vLLM's scheduler, the hits of ``get_computed_blocks`` go back into ``allocate_slots`` as
they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from kvcheck.adapters.native_hook import SingleGroupNativeManager
from kvcheck.adapters.vllm_kv_config import make_vllm_cache
from kvcheck.adapters.vllm_requests import Hashing, VllmRequest, make_request
from kvcheck.conformance.protocol import KVCacheSpec, RequestView

__all__ = ["VLLMNativeManager", "make_native_manager"]


class _VllmBlock(Protocol):
    @property
    def block_id(self) -> int: ...


class VllmBlocks(Protocol):
    """What the hook reads of vLLM's ``KVCacheBlocks``: one list of blocks per group."""

    @property
    def blocks(self) -> Sequence[Sequence[_VllmBlock]]: ...


class VLLMNativeManager(SingleGroupNativeManager[VllmRequest]):
    """``kvcheck.bench.replay.native.NativeManager`` over vLLM's ``KVCacheManager``."""

    manager: Any  # Any: vLLM's KVCacheManager (untyped here: vLLM is imported at run time)

    def __init__(self, spec: KVCacheSpec) -> None:
        super().__init__(spec)
        cache = make_vllm_cache(spec)
        self.hashing = Hashing(spec, cache.hash_block_size)
        self.manager = cache.manager
        self.pool = self.manager.block_pool

    def new_request(self, view: RequestView) -> VllmRequest:
        self.hashing.install()  # vLLM's hasher chains from a module-global NONE_HASH
        return make_request(view, self.hashing.block_hasher)

    def append_output(self, request: VllmRequest, token_ids: list[int]) -> None:
        self.hashing.install()
        request.append_output_token_ids(token_ids[0] if len(token_ids) == 1 else token_ids)

    def get_computed_blocks(self, request: VllmRequest) -> tuple[VllmBlocks, int]:
        result = self.manager.get_computed_blocks(request)
        return result[0], result[1]  # 0.33 adds a third element

    def allocate_slots(self, request: VllmRequest, num_new_tokens: int,
                       num_new_computed_tokens: int,
                       new_computed_blocks: VllmBlocks | None) -> VllmBlocks | None:
        new: VllmBlocks | None = self.manager.allocate_slots(
            request, num_new_tokens=num_new_tokens,
            num_new_computed_tokens=num_new_computed_tokens,
            new_computed_blocks=new_computed_blocks)
        return new

    def num_free_blocks(self) -> int:
        return int(self.pool.get_num_free_blocks())

    def block_ids(self, blocks: VllmBlocks) -> list[int]:
        return [b.block_id for b in blocks.blocks[0]]


def make_native_manager(spec: KVCacheSpec) -> VLLMNativeManager:
    """vLLM's manager for ``spec`` with its own objects (benchmark hook)."""
    return VLLMNativeManager(spec)
