"""Shared wiring for the EAGLE mutants (``eagle_*.py``): one bug, in single-group specs
(``_mutant_base.build``) and grouped ones (``_hybrid_mutant_base.build_hybrid``) alike, with
the capability ``eagle`` declared (the other mutants leave it out), so random workloads draw
``use_eagle`` for them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from _hybrid_mutant_base import build_hybrid
from _mutant_base import build

from kvcheck.conformance.loader import _CAPABILITY_NEEDS
from kvcheck.conformance.protocol import ImplInfo, KVCacheSpec

__all__ = ["build_eagle"]


def build_eagle(name: str, managers: Mapping[type, type] | None = None, *,
                coordinator: type | None = None, mamba: bool = False,
                eagle_groups: bool = False,
                ) -> tuple[ImplInfo, Callable[[KVCacheSpec], Any], Callable[[KVCacheSpec], Any]]:
    """``(IMPL_INFO, make_kv_cache_manager, make_block_pool)`` for the EAGLE mutant ``name``:
    ``managers`` maps a reference per-group manager class to its mutant subclass, swapped in
    single-group and grouped specs; ``coordinator`` a mutant subclass of one reference
    coordinator class (``swap_classes``); ``mamba``: declare the ``mamba`` kind too;
    ``eagle_groups``: declare vLLM 0.33's per-group flags too (a flag mutant's; the others
    draw no flagged group)."""
    _, make_single, make_pool = build(name, managers=dict(managers or {}),
                                      coordinator=coordinator, keep=frozenset({"eagle"}))
    info, make_grouped, _ = build_hybrid(name, managers=managers, coordinator=coordinator,
                                         mamba=mamba)

    def make_kv_cache_manager(spec: KVCacheSpec) -> Any:
        return make_grouped(spec) if spec.kv_cache_groups else make_single(spec)

    caps = info.capabilities | {"eagle", *(("eagle_groups",) if eagle_groups else ())}
    # Only the capabilities whose tests can run here (the loader refuses one declared without
    # what it needs, e.g. a Mamba feature without 'mamba').
    caps = frozenset(c for c in caps if not caps.isdisjoint(_CAPABILITY_NEEDS.get(c, (c,))))
    return replace(info, capabilities=caps), make_kv_cache_manager, make_pool
