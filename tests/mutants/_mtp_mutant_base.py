"""Shared wiring for the multi-module MTP mutants (``mtp_*.py``): one bug, in single-group
specs (``_mutant_base.build``) and grouped ones (``_hybrid_mutant_base.build_hybrid``) alike,
with the capability ``prefill_lookahead`` declared (the other mutants leave it out), so random
workloads draw ``num_prefill_lookahead`` for them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from _hybrid_mutant_base import build_hybrid
from _mutant_base import build

from kvcheck.conformance.protocol import ImplInfo, KVCacheSpec

__all__ = ["build_mtp"]


def build_mtp(name: str, managers: Mapping[type, type] | None = None, *,
              coordinator: type | None = None, mamba: bool = False,
              ) -> tuple[ImplInfo, Callable[[KVCacheSpec], Any], Callable[[KVCacheSpec], Any]]:
    """``(IMPL_INFO, make_kv_cache_manager, make_block_pool)`` for the multi-module MTP mutant
    ``name``: ``managers`` maps a reference per-group manager class to its mutant subclass,
    swapped in single-group and grouped specs; ``coordinator`` a mutant subclass of one
    reference coordinator class (``swap_classes``); ``mamba``: declare the ``mamba`` kind
    too (a Mamba mutant's; the others draw no Mamba group)."""
    _, make_single, make_pool = build(name, managers=dict(managers or {}),
                                      coordinator=coordinator,
                                      keep=frozenset({"prefill_lookahead"}))
    info, make_grouped, _ = build_hybrid(name, managers=managers, coordinator=coordinator,
                                         mamba=mamba)

    def make_kv_cache_manager(spec: KVCacheSpec) -> Any:
        return make_grouped(spec) if spec.kv_cache_groups else make_single(spec)

    return (replace(info, capabilities=info.capabilities | {"prefill_lookahead"}),
            make_kv_cache_manager, make_pool)
