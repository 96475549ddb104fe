"""Shared wiring for the mutant adapters: the reference adapter rebuilt around mutant classes.

A mutant module states its one bug as a subclass of a reference class (``BlockPool``,
``KVCacheManager``, a per-group manager such as ``FullAttentionManager``, a coordinator,
``RequestBlockHasher``, ``Request``, or the adapters ``ReferenceManager`` /
``ReferenceBlockPool``) and calls ``build``, which returns the module-level names the
``--kv-impl`` contract asks for::

    IMPL_INFO, make_kv_cache_manager, make_block_pool = build("mut_x", pool_cls=BuggyPool)
    build("mut_y", managers={FullAttentionManager: BuggyFullAttention})

Everything not named is the reference, so each mutant differs from it by exactly one bug.
A bug in a module-level helper (``get_block_hash``, ``to_event_extra_keys``, a hash function)
is injected with ``rebind``/``rebind_function``: a copy of the reference class or function
that sees the buggy helper in place of the real one. Module globals are never patched, so the
oracle (the reference itself, imported by the suite) stays unmutated in the same process.

Mutants do not declare ``kernels``: none of them touches a kernel, and the kernel checks
(Triton, slow on CPU) would only run the reference's kernels again.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any, TypeVar, cast

from kvcheck import __version__
from kvcheck.adapters.reference import (
    IMPL_INFO as REFERENCE_INFO,
)
from kvcheck.adapters.reference import (
    ReferenceBlockPool,
    ReferenceManager,
    none_hash_for,
    reference_profile,
    request_sync,
)
from kvcheck.conformance.protocol import ImplInfo, KVCacheSpec
from kvcheck.reference_impl.block_hasher import RequestBlockHasher
from kvcheck.reference_impl.block_pool import BlockPool
from kvcheck.reference_impl.kv_cache_coordinator import UnitaryKVCacheCoordinator
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager
from kvcheck.reference_impl.profiles import ProfileBehaviour
from kvcheck.reference_impl.request import Request

__all__ = ["MutantBlockPool", "MutantManager", "build", "rebind", "rebind_function",
           "swap_classes"]

NoneHashFn = Callable[[KVCacheSpec], bytes]
ProfileFn = Callable[[KVCacheSpec], "str | ProfileBehaviour"]
_F = TypeVar("_F", bound=Callable[..., Any])
_C = TypeVar("_C", bound=type)


def rebind_function(fn: _F, /, **overrides: object) -> _F:
    """A copy of ``fn`` that reads ``overrides`` instead of its module's globals of those
    names (the module itself is unchanged). Each name must be a global ``fn``'s module has,
    so a typo cannot silently leave the reference in place."""
    missing = sorted(set(overrides) - set(fn.__globals__))
    if missing:
        raise NameError(f"{fn.__qualname__}: module {fn.__module__} has no globals {missing}")
    copy = types.FunctionType(fn.__code__, {**fn.__globals__, **overrides}, fn.__name__,
                              fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__qualname__ = fn.__qualname__
    copy.__doc__ = fn.__doc__
    return copy  # type: ignore[return-value]


def _rebind_attr(attr: object, overrides: dict[str, object]) -> object:
    if isinstance(attr, types.FunctionType):
        if attr.__module__ != attr.__globals__.get("__name__"):
            return attr  # a decorator's wrapper (contextmanager...): not the module's code
        return rebind_function(attr, **overrides)
    if isinstance(attr, staticmethod):
        return staticmethod(_rebind_attr(attr.__func__, overrides))  # type: ignore[arg-type]
    if isinstance(attr, classmethod):
        return classmethod(_rebind_attr(attr.__func__, overrides))  # type: ignore[arg-type]
    if isinstance(attr, property):
        fget, fset, fdel = (None if f is None else cast("Callable[..., Any]",
                                                        _rebind_attr(f, overrides))
                            for f in (attr.fget, attr.fset, attr.fdel))
        return property(fget, fset, fdel, attr.__doc__)
    return attr


def rebind(cls: _C, /, **overrides: object) -> _C:
    """A subclass of ``cls`` whose own methods (those ``cls`` defines) read ``overrides``
    instead of the module globals of those names: e.g. ``rebind(BlockPool,
    get_block_hash=buggy)`` is a pool whose every method calls ``buggy``, while
    ``BlockPool`` itself, and so the oracle, still calls the real one."""
    module_globals = next((v.__globals__ for v in vars(cls).values()
                           if isinstance(v, types.FunctionType)), {})
    missing = sorted(set(overrides) - set(module_globals))
    if missing:
        raise NameError(f"{cls.__qualname__}: its module has no globals {missing}")
    names = {name: _rebind_attr(attr, overrides)
             for name, attr in vars(cls).items()
             if isinstance(attr, (types.FunctionType, staticmethod, classmethod, property))}
    return type(cls.__name__, (cls,), names)  # type: ignore[return-value]


def swap_classes(manager: KVCacheManager, managers: dict[type, type],
                 coordinator: type | None = None, pool: BlockPool | None = None) -> None:
    """Switch, right after ``manager`` was built, every per-group manager of a class named in
    ``managers`` (exactly that class) to its mutant subclass, the coordinator to
    ``coordinator`` if its class is that one's base, and every part to ``pool``."""
    coord = manager.coordinator
    if coordinator is not None and type(coord) is coordinator.__mro__[1]:
        coord.__class__ = coordinator
    if pool is not None:
        manager.block_pool = coord.block_pool = pool
    for group in coord.single_type_managers:
        mutant = managers.get(type(group))
        if mutant is not None:
            group.__class__ = mutant
            # Re-set: a FullAttentionManager larger than the hash block binds its caching
            # step per instance (to the mutant's method now).
            group.hash_block_size = group.hash_block_size
        if pool is not None:
            group.block_pool, group.null_block = pool, pool.null_block
    if isinstance(coord, UnitaryKVCacheCoordinator):
        coord.use_manager(coord.manager)  # re-bind its steps to the (mutant) methods


class MutantManager(ReferenceManager):
    """``ReferenceManager`` whose manager, per-group manager, coordinator, pool, hasher and
    request classes, profile and NONE_HASH are pluggable."""

    manager_cls: type[KVCacheManager] = KVCacheManager
    managers: dict[type, type] = {}  # noqa: RUF012 (replaced, never mutated)
    coordinator_cls: type | None = None
    pool_cls: type[BlockPool] = BlockPool
    hasher_cls: type[RequestBlockHasher] = RequestBlockHasher
    request_cls: type[Request] = Request
    none_hash: NoneHashFn = staticmethod(none_hash_for)  # type: ignore[assignment]
    profile_of: ProfileFn = staticmethod(reference_profile)  # type: ignore[assignment]

    def __init__(self, spec: KVCacheSpec) -> None:
        profile = self.profile_of(spec)
        mgr = self.manager_cls(
            spec.num_blocks, spec.block_size, max_model_len=spec.max_model_len,
            enable_caching=spec.enable_caching, hash_algo=spec.hash_algo, profile=profile,
            enable_kv_cache_events=spec.enable_kv_cache_events,
            pythonhashseed=spec.pythonhashseed,
            # EAGLE only where a mutant declares it (build(..., keep={"eagle"})).
            **({"use_eagle": True} if spec.use_eagle else {}),
            # Multi-module MTP likewise (build(..., keep={"prefill_lookahead"})).
            **({"num_prefill_lookahead": spec.num_prefill_lookahead}
               if spec.num_prefill_lookahead else {}),
            # Hash lookahead likewise (build(..., keep={"hash_lookahead"})).
            **({"num_hash_lookahead_tokens": spec.num_hash_lookahead_tokens}
               if spec.num_hash_lookahead_tokens else {}),
            # Admission gates likewise (build(..., keep={"admission_gates"})).
            **({"watermark": spec.watermark} if spec.watermark else {}),
            **({"max_in_flight_tokens": spec.max_in_flight_tokens}
               if spec.max_in_flight_tokens is not None else {}),
            # Block zeroing likewise (build(..., keep={"block_zeroing"})).
            **({"needs_kv_cache_zeroing": True} if spec.needs_kv_cache_zeroing else {}),
        )
        lookahead = spec.num_hash_lookahead_tokens
        pool = None
        if self.pool_cls is not BlockPool:
            pool = self.pool_cls(spec.num_blocks, spec.enable_caching,
                                 spec.enable_kv_cache_events, profile=profile,
                                 **({"num_hash_lookahead_tokens": lookahead}
                                    if lookahead else {}))
        swap_classes(mgr, self.managers, self.coordinator_cls, pool)
        mgr.block_hasher = self.hasher_cls(spec.block_size, spec.hash_algo, profile=profile,
                                           none_hash=self.none_hash(spec),
                                           **({"num_lookahead_tokens": lookahead}
                                              if lookahead else {}))
        self._wrap(spec, mgr)
        self._requests = _request_sync(self.request_cls, mgr.block_hasher)


class MutantBlockPool(ReferenceBlockPool):
    """``ReferenceBlockPool`` whose pool, hasher and request classes, profile and NONE_HASH
    are pluggable."""

    pool_cls: type[BlockPool] = BlockPool
    hasher_cls: type[RequestBlockHasher] = RequestBlockHasher
    request_cls: type[Request] = Request
    none_hash: NoneHashFn = staticmethod(none_hash_for)  # type: ignore[assignment]
    profile_of: ProfileFn = staticmethod(reference_profile)  # type: ignore[assignment]

    def __init__(self, spec: KVCacheSpec) -> None:
        self.spec = spec
        profile = self.profile_of(spec)
        self.pool = self.pool_cls(spec.num_blocks, spec.enable_caching,
                                  spec.enable_kv_cache_events, profile=profile)
        self._requests = _request_sync(
            self.request_cls,
            self.hasher_cls(spec.block_size, spec.hash_algo, profile=profile,
                            none_hash=self.none_hash(spec)),
        )


def _request_sync(request_cls: type[Request], hasher: RequestBlockHasher) -> Any:
    """The adapter's ``request_sync`` building ``request_cls`` requests."""
    if request_cls is Request:
        return request_sync(hasher)
    return rebind_function(request_sync, Request=request_cls)(hasher)


def build(
    name: str,
    *,
    manager_cls: type[KVCacheManager] = KVCacheManager,
    managers: dict[type, type] | None = None,
    coordinator: type | None = None,
    pool_cls: type[BlockPool] = BlockPool,
    hasher_cls: type[RequestBlockHasher] = RequestBlockHasher,
    request_cls: type[Request] = Request,
    none_hash: NoneHashFn | None = None,
    profile_of: ProfileFn | None = None,
    adapter_cls: type[MutantManager] = MutantManager,
    pool_adapter_cls: type[MutantBlockPool] = MutantBlockPool,
    drop: frozenset[str] = frozenset(),
    keep: frozenset[str] = frozenset(),
) -> tuple[ImplInfo, Callable[[KVCacheSpec], Any], Callable[[KVCacheSpec], Any]]:
    """``(IMPL_INFO, make_kv_cache_manager, make_block_pool)`` for a mutant named ``name``.

    ``adapter_cls`` / ``pool_adapter_cls`` may already be subclasses (adapter-level bugs); the
    class arguments are layered on top of them. ``managers`` maps a reference per-group
    manager class to its mutant subclass; ``coordinator`` is a mutant subclass of one
    reference coordinator class (see ``swap_classes``). ``profile_of(spec)`` replaces the adapter's
    ``reference_profile`` (the profile name or ``ProfileBehaviour`` the reference objects get).
    ``drop`` removes capabilities besides ``kernels``; ``keep`` keeps some of those left out
    by default (``eagle``: an EAGLE mutant's, ``prefill_lookahead``: a multi-module MTP
    mutant's, ``hash_lookahead``: a hash-lookahead mutant's, ``admission_gates``: an
    admission-gate mutant's, ``async_scheduling``: an in-flight-tokens mutant's,
    ``block_zeroing``: a block-zeroing mutant's; the others leave them out, so their random
    workloads draw what they drew before those were added).
    """
    parts: dict[str, Any] = {"manager_cls": manager_cls, "pool_cls": pool_cls,
                             "hasher_cls": hasher_cls, "request_cls": request_cls,
                             "managers": dict(managers or {}), "coordinator_cls": coordinator}
    if none_hash is not None:
        parts["none_hash"] = staticmethod(none_hash)
    if profile_of is not None:
        parts["profile_of"] = staticmethod(profile_of)
    manager_type = type(f"{name}_manager", (adapter_cls,), dict(parts))
    pool_parts = {k: v for k, v in parts.items()
                  if k not in ("manager_cls", "managers", "coordinator_cls")}
    pool_type = type(f"{name}_pool", (pool_adapter_cls,), pool_parts)
    info = ImplInfo(
        name=name,
        version=__version__,
        # The mutants are served on single-group specs (hybrid ones: _hybrid_mutant_base): no
        # grouped specs, no sizing functions, no offload tier (_offload_mutant_base).
        # Spelled out here, not taken from tests/kv_helpers.py (MODULE_LEVEL_CAPABILITIES): a
        # mutant must import with only tests/mutants on the path (README's replay commands).
        capabilities=REFERENCE_INFO.capabilities - {
            "kernels", "kv_cache_groups", "sliding_window", "chunked_local_attention",
            "cross_attention", "mamba", "fine_grained_hits", "boundary_state_offloads",
            "mamba_checkpoints", "dcp", "prefix_match_unit", "mamba_dcp",
            "mamba_shared_prefix_checkpoint",
            "sizing", "offload",
            *({"eagle", "eagle_groups", "prefill_lookahead", "hash_lookahead",
               "admission_gates", "async_scheduling", "block_zeroing"} - keep)}
        - drop,
        profile=REFERENCE_INFO.profile,
        hash_algos=REFERENCE_INFO.hash_algos,
        reserved_block_ids=REFERENCE_INFO.reserved_block_ids,
    )

    def make_kv_cache_manager(spec: KVCacheSpec) -> Any:
        return manager_type(spec)

    def make_block_pool(spec: KVCacheSpec) -> Any:
        return pool_type(spec)

    return info, make_kv_cache_manager, make_block_pool
