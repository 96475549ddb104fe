"""Shared wiring for the asynchronous-scheduling mutants (``async_*.py``): one bug in the
reference's ``KVCacheManager`` (a subclass) or in a per-group manager, on grouped specs
(``_hybrid_mutant_base.build_hybrid``) and single-group ones alike, with the capability
``async_scheduling`` declared (the other mutants leave it out), so the golden scenarios run
and the random workloads schedule asynchronously for them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from _hybrid_mutant_base import build_hybrid
from _mutant_base import build

from kvcheck.conformance.protocol import ImplInfo, KVCacheSpec
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager

__all__ = ["build_async"]


Built = tuple[ImplInfo, Callable[[KVCacheSpec], Any], Callable[[KVCacheSpec], Any]]


def build_async(name: str, manager_cls: type[KVCacheManager] = KVCacheManager,
                managers: Mapping[type, type] | None = None, *,
                offloads: bool = False) -> Built:
    """``(IMPL_INFO, make_kv_cache_manager, make_block_pool)`` for the asynchronous-scheduling
    mutant ``name``: ``manager_cls`` a subclass of the reference's ``KVCacheManager`` (in both
    forms), ``managers`` maps a reference per-group manager class to its mutant subclass;
    ``offloads``: declare Mamba, fine-grained hits and boundary-state hand-offs too (a
    finalize mutant's)."""
    _, make_single, make_pool = build(name, manager_cls=manager_cls,
                                      managers=dict(managers or {}),
                                      keep=frozenset({"async_scheduling"}))
    info, make_grouped, _ = build_hybrid(name, managers=managers, mamba=offloads,
                                         fine_grained=offloads, offloads=offloads)

    def make_kv_cache_manager(spec: KVCacheSpec) -> Any:
        if not spec.kv_cache_groups:
            return make_single(spec)
        adapter = make_grouped(spec)
        adapter.manager.__class__ = manager_cls  # the grouped manager, the same bug
        return adapter

    return (replace(info, capabilities=info.capabilities | {"async_scheduling"}),
            make_kv_cache_manager, make_pool)
