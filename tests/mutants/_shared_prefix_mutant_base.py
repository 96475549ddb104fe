"""Shared wiring for the Mamba shared-prefix checkpoint mutants (``shared_prefix_*.py``): one
bug, in grouped specs (``_hybrid_mutant_base.build_hybrid`` with Mamba and fine-grained hits),
with ``eagle``, ``eagle_groups`` and ``mamba_shared_prefix_checkpoint`` declared (the other
mutants leave them out), so random workloads draw EAGLE and the flag for them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from _hybrid_mutant_base import build_hybrid

from kvcheck.conformance.protocol import ImplInfo, KVCacheSpec
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager

__all__ = ["build_shared_prefix"]

#: A bug in the constructor's narrowing: given the built manager and its spec, it re-sets the
#: narrowed flag (``KVCacheManager.mamba_shared_prefix_checkpoint`` and the Mamba managers').
Narrowing = Callable[[KVCacheManager, KVCacheSpec], bool]


def build_shared_prefix(name: str, managers: Mapping[type, type] | None = None, *,
                        narrowing: Narrowing | None = None,
                        ) -> tuple[ImplInfo, Callable[[KVCacheSpec], Any],
                                   Callable[[KVCacheSpec], Any]]:
    """``(IMPL_INFO, make_kv_cache_manager, make_block_pool)`` for the shared-prefix mutant
    ``name``: ``managers`` maps a reference per-group manager class to its mutant subclass;
    ``narrowing`` (a bug in the constructor) answers the flag each Mamba manager gets."""
    info, make_grouped, make_pool = build_hybrid(name, managers=managers, mamba=True,
                                                 fine_grained=True)

    def make_kv_cache_manager(spec: KVCacheSpec) -> Any:
        made = make_grouped(spec)
        if narrowing is not None and spec.kv_cache_groups:
            manager: KVCacheManager = made.manager
            kept = narrowing(manager, spec)
            manager.mamba_shared_prefix_checkpoint = kept
            for group_manager in manager.coordinator.single_type_managers:
                if hasattr(group_manager, "shared_prefix_checkpoint"):
                    group_manager.shared_prefix_checkpoint = kept
        return made

    caps = {"eagle", "eagle_groups", "mamba_shared_prefix_checkpoint"}
    return (replace(info, capabilities=info.capabilities | caps), make_kv_cache_manager,
            make_pool)
