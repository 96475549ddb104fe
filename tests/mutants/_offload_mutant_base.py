"""Shared wiring for the offload-tier mutants (``mut_off_*.py``): the reference adapter whose
offload tier (capability ``offload``, ``make_offloading_manager``) has one bug.

A mutant states its bug as a subclass of ``CPUOffloadingManager`` (``manager_cls``) and/or of
a cache policy (``lru`` / ``arc``: ``LRUCachePolicy`` / ``ARCCachePolicy`` subclasses the
mutant manager builds in place of the reference's) and calls ``build_offload``, which returns
the module-level names the ``--kv-impl`` contract asks for::

    IMPL_INFO, make_kv_cache_manager, make_block_pool, make_offloading_manager = (
        build_offload("mut_off_x", arc=BuggyARC))

The KV-manager side is ``_mutant_base.build``'s (the reference, no bug), so an offload mutant
loads like every other mutant; the ``offload`` area is the one that must fail it. Module
globals are never patched (the policy is replaced on the instance), so the oracle in the same
process stays the real reference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from _mutant_base import build

from kvcheck.adapters.offload_tier import OffloadTier
from kvcheck.conformance.offload_protocol import OffloadSpec
from kvcheck.conformance.protocol import ImplInfo, KVCacheSpec
from kvcheck.reference_impl.offload_arc import ARCCachePolicy
from kvcheck.reference_impl.offload_lru import LRUCachePolicy
from kvcheck.reference_impl.offload_manager import CPUOffloadingManager
from kvcheck.reference_impl.offload_policy import ReqContext

__all__ = ["build_offload"]


def build_offload(
    name: str,
    *,
    manager_cls: type[CPUOffloadingManager] = CPUOffloadingManager,
    lru: type[LRUCachePolicy] | None = None,
    arc: type[ARCCachePolicy] | None = None,
) -> tuple[ImplInfo, Callable[[KVCacheSpec], Any], Callable[[KVCacheSpec], Any],
           Callable[[OffloadSpec], OffloadTier]]:
    """``(IMPL_INFO, make_kv_cache_manager, make_block_pool, make_offloading_manager)`` for the
    offload mutant ``name``: tiers of ``manager_cls`` running the ``lru`` / ``arc`` policy
    classes given (the reference's for the others)."""
    policies: dict[str, type[Any]] = {k: v for k, v in (("lru", lru), ("arc", arc)) if v}

    class MutantTier(manager_cls):  # type: ignore[valid-type,misc]
        def __init__(self, num_chunks: int, cache_policy: str = "lru",
                     **kwargs: Any) -> None:
            super().__init__(num_chunks, cache_policy, **kwargs)
            if cache_policy in policies:
                self._policy = policies[cache_policy](num_chunks)

    MutantTier.__name__ = MutantTier.__qualname__ = f"{name}_tier"
    info, make_kv_cache_manager, make_block_pool = build(name)
    # Declared here whether or not build() keeps the reference's 'offload'.
    info = replace(info, capabilities=info.capabilities | {"offload"})

    def make_offloading_manager(spec: OffloadSpec) -> OffloadTier:
        return OffloadTier(MutantTier(
            spec.num_chunks, spec.cache_policy, enable_events=spec.enable_events,
            store_threshold=spec.store_threshold, max_tracker_size=spec.max_tracker_size,
            key_width=spec.key_width), ReqContext)

    return info, make_kv_cache_manager, make_block_pool, make_offloading_manager
