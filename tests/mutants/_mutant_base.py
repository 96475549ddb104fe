"""Shared wiring for the mutant adapters: the reference adapter rebuilt around mutant classes.

A mutant module states its one bug as a subclass of a reference class (``BlockPool``,
``KVCacheManager``, ``RequestBlockHasher``, or the adapters ``ReferenceManager`` /
``ReferenceBlockPool``) and calls ``build``, which returns the module-level names the
``--kv-impl`` contract asks for::

    IMPL_INFO, make_kv_cache_manager, make_block_pool = build("mut_x", pool_cls=BuggyPool)

Everything not named is the reference, so each mutant differs from it by exactly one bug.
Mutants do not declare ``kernels``: none of them touches a kernel, and the kernel checks
(Triton, slow on CPU) would only run the reference's kernels again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvcheck import __version__
from kvcheck.conformance.protocol import ImplInfo, KVCacheSpec
from kvcheck.reference_impl.adapter import (
    IMPL_INFO as REFERENCE_INFO,
)
from kvcheck.reference_impl.adapter import (
    ReferenceBlockPool,
    ReferenceManager,
    reference_profile,
    request_sync,
    none_hash_for,
)
from kvcheck.reference_impl.block_hasher import RequestBlockHasher
from kvcheck.reference_impl.block_pool import BlockPool
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager

__all__ = ["MutantBlockPool", "MutantManager", "build"]

NoneHashFn = Callable[[KVCacheSpec], bytes]


class MutantManager(ReferenceManager):
    """``ReferenceManager`` whose manager, pool and hasher classes are pluggable."""

    manager_cls: type[KVCacheManager] = KVCacheManager
    pool_cls: type[BlockPool] = BlockPool
    hasher_cls: type[RequestBlockHasher] = RequestBlockHasher
    none_hash: NoneHashFn = staticmethod(none_hash_for)  # type: ignore[assignment]

    def __init__(self, spec: KVCacheSpec) -> None:  # noqa: D107 - mirrors ReferenceManager
        self.spec = spec
        profile = reference_profile(spec)
        mgr = self.manager_cls(
            spec.num_blocks, spec.block_size, max_model_len=spec.max_model_len,
            enable_caching=spec.enable_caching, hash_algo=spec.hash_algo, profile=profile,
            enable_kv_cache_events=spec.enable_kv_cache_events,
            pythonhashseed=spec.pythonhashseed,
        )
        if self.pool_cls is not BlockPool:
            mgr.block_pool = self.pool_cls(spec.num_blocks, spec.enable_caching,
                                           spec.enable_kv_cache_events, profile=profile)
        mgr.block_hasher = self.hasher_cls(spec.block_size, spec.hash_algo, profile=profile,
                                           none_hash=self.none_hash(spec))
        self.manager = mgr
        self._requests = request_sync(mgr.block_hasher)


class MutantBlockPool(ReferenceBlockPool):
    """``ReferenceBlockPool`` whose pool and hasher classes are pluggable."""

    pool_cls: type[BlockPool] = BlockPool
    hasher_cls: type[RequestBlockHasher] = RequestBlockHasher
    none_hash: NoneHashFn = staticmethod(none_hash_for)  # type: ignore[assignment]

    def __init__(self, spec: KVCacheSpec) -> None:  # noqa: D107 - mirrors ReferenceBlockPool
        self.spec = spec
        profile = reference_profile(spec)
        self.pool = self.pool_cls(spec.num_blocks, spec.enable_caching,
                                  spec.enable_kv_cache_events, profile=profile)
        self._requests = request_sync(
            self.hasher_cls(spec.block_size, spec.hash_algo, profile=profile,
                            none_hash=self.none_hash(spec))
        )


def build(
    name: str,
    *,
    manager_cls: type[KVCacheManager] = KVCacheManager,
    pool_cls: type[BlockPool] = BlockPool,
    hasher_cls: type[RequestBlockHasher] = RequestBlockHasher,
    none_hash: NoneHashFn | None = None,
    adapter_cls: type[MutantManager] = MutantManager,
    pool_adapter_cls: type[MutantBlockPool] = MutantBlockPool,
    drop: frozenset[str] = frozenset(),
) -> tuple[ImplInfo, Callable[[KVCacheSpec], Any], Callable[[KVCacheSpec], Any]]:
    """``(IMPL_INFO, make_kv_cache_manager, make_block_pool)`` for a mutant named ``name``.

    ``adapter_cls`` / ``pool_adapter_cls`` may already be subclasses (adapter-level bugs); the
    class arguments are layered on top of them. ``drop`` removes capabilities besides
    ``kernels``.
    """
    parts: dict[str, Any] = {"manager_cls": manager_cls, "pool_cls": pool_cls,
                             "hasher_cls": hasher_cls}
    if none_hash is not None:
        parts["none_hash"] = staticmethod(none_hash)
    manager_type = type(f"{name}_manager", (adapter_cls,), dict(parts))
    pool_parts = {k: v for k, v in parts.items() if k != "manager_cls"}
    pool_type = type(f"{name}_pool", (pool_adapter_cls,), pool_parts)
    info = ImplInfo(
        name=name,
        version=__version__,
        capabilities=REFERENCE_INFO.capabilities - {"kernels"} - drop,
        profile=REFERENCE_INFO.profile,
        hash_algos=REFERENCE_INFO.hash_algos,
        reserved_block_ids=REFERENCE_INFO.reserved_block_ids,
    )

    def make_kv_cache_manager(spec: KVCacheSpec) -> Any:
        return manager_type(spec)

    def make_block_pool(spec: KVCacheSpec) -> Any:
        return pool_type(spec)

    return info, make_kv_cache_manager, make_block_pool
