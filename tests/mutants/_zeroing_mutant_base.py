"""Shared wiring for the block-zeroing mutants (``zeroing_*.py``): one bug in the reference's
``KVCacheManager`` (a subclass) or in a per-group manager, on single-group specs
(``_mutant_base.build``) and grouped ones with Mamba (``_hybrid_mutant_base.build_hybrid``)
alike, with the capability ``block_zeroing`` declared (the other mutants leave it out), so
the golden scenarios run and the random workloads draw ``needs_kv_cache_zeroing`` for them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from _hybrid_mutant_base import build_hybrid
from _mutant_base import build

from kvcheck.conformance.protocol import ImplInfo, KVCacheSpec
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager

__all__ = ["build_zeroing"]


Built = tuple[ImplInfo, Callable[[KVCacheSpec], Any], Callable[[KVCacheSpec], Any]]


def build_zeroing(name: str, manager_cls: type[KVCacheManager] = KVCacheManager,
                  managers: Mapping[type, type] | None = None) -> Built:
    """``(IMPL_INFO, make_kv_cache_manager, make_block_pool)`` for the block-zeroing mutant
    ``name``: ``manager_cls`` a subclass of the reference's ``KVCacheManager`` (in both
    forms), ``managers`` maps a reference per-group manager class to its mutant subclass."""
    _, make_single, make_pool = build(name, manager_cls=manager_cls,
                                      managers=dict(managers or {}),
                                      keep=frozenset({"block_zeroing"}))
    info, make_grouped, _ = build_hybrid(name, managers=managers, mamba=True,
                                         fine_grained=True)

    def make_kv_cache_manager(spec: KVCacheSpec) -> Any:
        if not spec.kv_cache_groups:
            return make_single(spec)
        adapter = make_grouped(spec)
        adapter.manager.__class__ = manager_cls  # the grouped manager, the same bug
        return adapter

    return (replace(info, capabilities=info.capabilities | {"block_zeroing"}),
            make_kv_cache_manager, make_pool)
