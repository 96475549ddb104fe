"""Shared wiring for the hybrid mutants (``hybrid_*.py``): the reference adapter whose
manager runs one mutated class on grouped specs (``kv_cache_groups``).

A hybrid mutant states its one bug as a subclass of a reference per-group manager
(``SlidingWindowManager``...), coordinator or ``BlockPool`` and calls ``build_hybrid``; right
after the reference builds its coordinator, every per-group manager of the named class
(exactly that class), the coordinator, if its class is the named one's base, and the pool
are switched to the mutant subclass. Single-group specs get the unmutated reference
(``_mutant_base.build``), so the mutant differs from the reference by exactly one bug, in
hybrid models only. The hybrid capabilities (which ``build`` drops) are declared again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from _mutant_base import build, swap_classes

from kvcheck.adapters.reference import IMPL_INFO as REFERENCE_INFO
from kvcheck.adapters.reference import ReferenceManager
from kvcheck.conformance.protocol import ImplInfo, KVCacheSpec

__all__ = ["build_hybrid"]


def build_hybrid(
    name: str, *, managers: Mapping[type, type] | None = None,
    coordinator: type | None = None, pool: type | None = None, mamba: bool = False,
    fine_grained: bool = False, offloads: bool = False, checkpoints: bool = False,
) -> tuple[ImplInfo, Callable[[KVCacheSpec], Any], Callable[[KVCacheSpec], Any]]:
    """``(IMPL_INFO, make_kv_cache_manager, make_block_pool)`` for the hybrid mutant ``name``:
    ``managers`` maps a reference per-group manager class to its mutant subclass;
    ``coordinator`` is a mutant subclass of one reference coordinator class; ``pool`` a
    subclass of ``BlockPool`` adding no state (the built pool is switched to it). ``mamba``:
    declare the ``mamba`` kind too (a Mamba mutant's); the others leave it out, so their
    random workloads draw the layouts they drew before Mamba layouts were added.
    ``fine_grained``: declare ``fine_grained_hits`` too (with ``mamba``: a fine-grained hit
    mutant's; the others draw no fine-grained layout). ``offloads``: declare
    ``boundary_state_offloads`` too (with ``mamba``: a hand-off mutant's; the others neither
    drain hand-offs nor draw the two-Mamba-group layouts). ``checkpoints``: declare
    ``mamba_checkpoints`` too (with ``mamba``: a prefill checkpoint or sparse retention
    mutant's; the others draw no checkpoint layout)."""
    info, make_single, make_pool = build(name)
    # build() leaves the hybrid capabilities out (its managers are single-group ones).
    hybrid_caps = REFERENCE_INFO.capabilities & {"kv_cache_groups", "sliding_window",
                                                 "chunked_local_attention", "cross_attention",
                                                 *(("mamba",) if mamba else ()),
                                                 *(("mamba", "fine_grained_hits")
                                                   if fine_grained else ()),
                                                 *(("mamba", "boundary_state_offloads")
                                                   if offloads else ()),
                                                 *(("mamba", "mamba_checkpoints")
                                                   if checkpoints else ())}
    info = replace(info, capabilities=info.capabilities | hybrid_caps)
    swaps = dict(managers or {})

    class MutantGroupedManager(ReferenceManager):
        def __init__(self, spec: KVCacheSpec) -> None:
            super().__init__(spec)
            swap_classes(self.manager, swaps, coordinator)
            if pool is not None:
                self.manager.block_pool.__class__ = pool

    def make_kv_cache_manager(spec: KVCacheSpec) -> Any:
        if spec.kv_cache_groups:
            return MutantGroupedManager(spec)
        return make_single(spec)

    return info, make_kv_cache_manager, make_pool
