"""Shared wiring for the mutants of one vLLM 0.33 manager feature (``admission_*.py``,
``async_*.py``, ``zeroing_*.py``): one bug in the reference's ``KVCacheManager`` (a subclass)
or in a per-group manager, in single-group specs (``_mutant_base.build``) and grouped ones
(``_hybrid_mutant_base.build_hybrid``) alike, with the feature's capability declared (the other
mutants leave it out, so their Hypothesis draws do not move), so the feature's golden
scenarios and random workloads run for them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from _hybrid_mutant_base import build_hybrid
from _mutant_base import build

from kvcheck.conformance.protocol import ImplInfo, KVCacheSpec
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager

__all__ = ["build_feature"]


Built = tuple[ImplInfo, Callable[[KVCacheSpec], Any], Callable[[KVCacheSpec], Any]]


def build_feature(name: str, capability: str,
                  manager_cls: type[KVCacheManager] = KVCacheManager,
                  managers: Mapping[type, type] | None = None, *,
                  mamba: bool = False, fine_grained: bool = False,
                  offloads: bool = False) -> Built:
    """``(IMPL_INFO, make_kv_cache_manager, make_block_pool)`` for the mutant ``name`` of the
    feature declared as ``capability``: ``manager_cls`` a subclass of the reference's
    ``KVCacheManager`` (in both forms), ``managers`` maps a reference per-group manager class
    to its mutant subclass; ``mamba`` / ``fine_grained`` / ``offloads``: the grouped form also
    declares Mamba groups, fine-grained hits, boundary-state hand-offs
    (``build_hybrid``'s flags)."""
    _, make_single, make_pool = build(name, manager_cls=manager_cls,
                                      managers=dict(managers or {}),
                                      keep=frozenset({capability}))
    info, make_grouped, _ = build_hybrid(name, managers=managers, mamba=mamba,
                                         fine_grained=fine_grained, offloads=offloads)

    def make_kv_cache_manager(spec: KVCacheSpec) -> Any:
        if not spec.kv_cache_groups:
            return make_single(spec)
        adapter = make_grouped(spec)
        adapter.manager.__class__ = manager_cls  # the grouped manager, the same bug
        return adapter

    return (replace(info, capabilities=info.capabilities | {capability}),
            make_kv_cache_manager, make_pool)
