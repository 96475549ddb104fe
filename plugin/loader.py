"""Resolve ``--kv-impl`` values into checked ``ImplHandle`` objects.

Every way a module can fail the contract (not importable, no ``IMPL_INFO``, no factory, a
factory with the wrong signature, an unknown capability or profile, a declared capability whose
method is missing) becomes one ``pytest.UsageError`` paragraph that names the fix; no traceback.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, fields
from types import ModuleType
from typing import Any

import pytest

from kvcheck.conformance.protocol import (
    CAPABILITIES,
    PROFILES,
    ImplInfo,
    KVCacheSpec,
    effective_capabilities,
)

__all__ = ["ALIASES", "ImplHandle", "load_impl", "load_impls"]

#: Short names accepted by --kv-impl.
ALIASES: dict[str, str] = {
    "reference": "kvcheck.reference_impl.adapter",
    "vllm": "kvcheck.adapters.vllm",
}

# Methods each capability requires on the manager object (or, for "module", on the module).
_REQUIRED_METHODS: dict[str, tuple[str, ...]] = {
    "manager": ("get_computed_blocks", "allocate_slots", "free", "get_block_ids",
                "num_free_blocks"),
    "reset_prefix_cache": ("reset_prefix_cache",),
    "free_queue_order": ("free_block_ids",),
    "ref_counts": ("ref_cnt",),
    "block_hashes": ("block_hashes",),
    "events": ("take_events",),
    "slot_mapping": ("slot_mapping",),
    "invariants": ("check_invariants",),
}
_POOL_METHODS = ("get_new_blocks", "free_blocks", "touch", "cache_full_blocks",
                 "get_cached_block", "num_free_blocks", "free_block_ids")
_PROBE_SPEC = KVCacheSpec(num_blocks=16, block_size=4)


@dataclass(frozen=True)
class ImplHandle:
    """A loaded implementation: its module, claims and factories."""

    name: str
    target: str  # what the user wrote, e.g. "reference" or "pkg.mod:factory"
    module: ModuleType
    info: ImplInfo
    factory: Callable[[KVCacheSpec], Any] | None
    pool_factory: Callable[[KVCacheSpec], Any] | None

    def has(self, capability: str) -> bool:
        return capability in self.info.capabilities

    def make_manager(self, spec: KVCacheSpec) -> Any:
        if self.factory is None:
            raise RuntimeError(f"{self.name} declares no manager capability")
        return self.factory(spec)

    def make_block_pool(self, spec: KVCacheSpec) -> Any:
        if self.pool_factory is None:
            raise RuntimeError(f"{self.name} declares no block_pool capability")
        return self.pool_factory(spec)


def _usage(target: str, problem: str, fix: str) -> pytest.UsageError:
    return pytest.UsageError(f"kvcheck: --kv-impl={target}: {problem}\n  Fix: {fix}")


def _impl_info(target: str, module: ModuleType) -> ImplInfo:
    raw = getattr(module, "IMPL_INFO", None)
    if raw is None:
        return_fix = (
            f"define IMPL_INFO = ImplInfo(name=..., version=..., capabilities=frozenset({{...}}))"
            f" in {module.__name__} (from kvcheck.conformance.protocol import ImplInfo)"
        )
        raise _usage(target, f"module {module.__name__!r} has no IMPL_INFO", return_fix)
    if isinstance(raw, dict):
        known = {f.name for f in fields(ImplInfo)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise _usage(target, f"IMPL_INFO has unknown fields {unknown}",
                         f"use only {sorted(known)}")
        try:
            raw = ImplInfo(**{**raw, "capabilities": frozenset(raw.get("capabilities", ()))})
        except TypeError as exc:
            raise _usage(target, f"IMPL_INFO is incomplete ({exc})",
                         "give at least name and version") from None
    if not isinstance(raw, ImplInfo):
        raise _usage(target, f"IMPL_INFO is a {type(raw).__name__}, not an ImplInfo or dict",
                     "build it with kvcheck.conformance.protocol.ImplInfo(...)")
    unknown_caps = sorted(set(raw.capabilities) - set(CAPABILITIES))
    if unknown_caps:
        raise _usage(target, f"IMPL_INFO declares unknown capabilities {unknown_caps}",
                     f"use names from {sorted(CAPABILITIES)}")
    if raw.profile not in PROFILES:
        raise _usage(target, f"IMPL_INFO claims unknown profile {raw.profile!r}",
                     f"use one of {list(PROFILES)}")
    return raw


def _check_factory(target: str, name: str, factory: Any) -> None:
    if not callable(factory):
        raise _usage(target, f"{name} is not callable",
                     f"define def {name}(spec: KVCacheSpec) -> manager")
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return  # builtins / C extensions: trust them
    try:
        sig.bind(_PROBE_SPEC)
    except TypeError:
        raise _usage(target, f"{name}{sig} cannot be called as {name}(spec)",
                     f"make it take exactly one argument: def {name}(spec: KVCacheSpec)") from None


def _check_methods(target: str, obj: Any, what: str, names: tuple[str, ...], cap: str) -> None:
    missing = [n for n in names if not callable(getattr(obj, n, None))]
    if missing:
        raise _usage(
            target,
            f"capability {cap!r} is declared but the {what} ({type(obj).__name__}) lacks "
            f"{', '.join(missing)}",
            f"implement {', '.join(missing)} or remove {cap!r} from IMPL_INFO.capabilities",
        )


def load_impl(target: str) -> ImplHandle:
    """Import and check one ``--kv-impl`` value (``module``, ``module:factory`` or an alias).

    Raises:
        pytest.UsageError: with the problem and the fix, for every contract violation.
    """
    target = target.strip()
    module_name, _, factory_name = target.partition(":")
    module_name = ALIASES.get(module_name, module_name)
    factory_name = factory_name or "make_kv_cache_manager"
    if not module_name:
        raise _usage(target, "empty module name", "pass --kv-impl=package.module")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise _usage(
            target,
            f"cannot import {module_name!r} ({type(exc).__name__}: {exc})",
            "check the dotted module path and that its package is installed in this "
            "environment (python -c 'import " + module_name + "')",
        ) from None
    except Exception as exc:  # the module itself crashed at import time
        raise _usage(target, f"importing {module_name!r} raised {type(exc).__name__}: {exc}",
                     "fix the error in that module's import-time code") from None
    info = _impl_info(target, module)
    if not info.capabilities & {"manager", "block_pool"}:
        raise _usage(target, "IMPL_INFO declares neither 'manager' nor 'block_pool'",
                     "declare 'manager' (make_kv_cache_manager) and/or 'block_pool' "
                     "(make_block_pool): the suite needs something to drive")
    factory = getattr(module, factory_name, None)
    if "manager" in info.capabilities:
        if factory is None:
            raise _usage(target, f"module {module_name!r} has no factory {factory_name!r}",
                         f"define def {factory_name}(spec: KVCacheSpec) in {module_name}, or "
                         "name yours with --kv-impl=module:factory")
        _check_factory(target, factory_name, factory)
        probe = _probe(target, factory_name, factory)
        # Under a vLLM profile the design capabilities are implied, so their methods too.
        caps = effective_capabilities(info, info.profile)
        for cap, methods in _REQUIRED_METHODS.items():
            if cap in caps:
                _check_methods(target, probe, "manager", methods, cap)
    pool_factory = getattr(module, "make_block_pool", None)
    if "block_pool" in info.capabilities:
        if pool_factory is None:
            raise _usage(target, "capability 'block_pool' is declared but the module has no "
                         "make_block_pool", "define make_block_pool(spec) or drop 'block_pool'")
        _check_factory(target, "make_block_pool", pool_factory)
        pool_probe = _probe(target, "make_block_pool", pool_factory)
        _check_methods(target, pool_probe, "block pool", _POOL_METHODS, "block_pool")
    if "kernels" in info.capabilities and not callable(getattr(module, "kernels", None)):
        raise _usage(target, "capability 'kernels' is declared but the module has no kernels()",
                     "define kernels() returning a KernelSet, or drop 'kernels'")
    return ImplHandle(
        info.name, target, module, info,
        factory if "manager" in info.capabilities else None,
        pool_factory if "block_pool" in info.capabilities else None,
    )


def _probe(target: str, name: str, factory: Callable[[KVCacheSpec], Any]) -> Any:
    """Build one small instance, to check that declared capabilities' methods exist."""
    try:
        return factory(_PROBE_SPEC)
    except Exception as exc:
        raise _usage(target, f"{name}({_PROBE_SPEC}) raised {type(exc).__name__}: {exc}",
                     "the factory must build an instance for any small spec") from None


def load_impls(value: str) -> list[ImplHandle]:
    """Load a comma list; names must be unique (they become test ids)."""
    handles = [load_impl(part) for part in value.split(",") if part.strip()]
    names = [h.name for h in handles]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise pytest.UsageError(
            f"kvcheck: --kv-impl={value}: implementations share the name(s) {dup}\n"
            "  Fix: give each IMPL_INFO a distinct name (it is the test-id suffix)"
        )
    return handles
