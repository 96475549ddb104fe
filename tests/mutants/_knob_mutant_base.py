"""Shared wiring for the mutants of the manager's configuration knobs (DCP,
``prefix_match_unit``): the hybrid mutant wiring (``_hybrid_mutant_base``, which serves
grouped specs with the reference adapter) around a ``KVCacheManager`` whose ``__init__``
reads one mutated module global, the capabilities ``dcp`` and ``prefix_match_unit``
declared (with ``mamba`` and ``fine_grained_hits``, the knob scenarios' kinds).

``KVCacheManager`` itself, and so the oracle, keeps the real functions (``rebind``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from _hybrid_mutant_base import build_hybrid
from _mutant_base import rebind, rebind_function

from kvcheck.adapters.reference import ReferenceManager, reference_kv_cache_manager
from kvcheck.conformance.protocol import ImplInfo, KVCacheSpec
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager

__all__ = ["build_knob_mutant"]


def build_knob_mutant(
    name: str, *, mamba_dcp: bool = False, **overrides: object,
) -> tuple[ImplInfo, Callable[[KVCacheSpec], Any], Callable[[KVCacheSpec], Any]]:
    """``(IMPL_INFO, make_kv_cache_manager, make_block_pool)`` for the knob mutant ``name``:
    grouped specs get a reference manager whose ``KVCacheManager`` reads ``overrides``
    instead of its module's globals of those names. ``mamba_dcp``: declare ``mamba_dcp``
    too (a Mamba-under-DCP mutant's; the others draw what they drew before it was added)."""
    info, make_manager, make_pool = build_hybrid(name, mamba=True, fine_grained=True)
    knobs = {"dcp", "prefix_match_unit", *(("mamba_dcp",) if mamba_dcp else ())}
    info = replace(info, capabilities=info.capabilities | knobs)
    manager_cls = rebind(KVCacheManager, **overrides)
    factory = rebind_function(reference_kv_cache_manager, KVCacheManager=manager_cls)
    grouped = rebind(ReferenceManager, reference_kv_cache_manager=factory)

    def make_kv_cache_manager(spec: KVCacheSpec) -> Any:
        if spec.kv_cache_groups:
            return grouped(spec)
        return make_manager(spec)

    return info, make_kv_cache_manager, make_pool
