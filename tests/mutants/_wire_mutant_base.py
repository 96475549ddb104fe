"""Shared wiring for the KV-event wire mutants (``mut_wire_*.py``): the reference adapter with
one bug in ``take_event_batch`` (capability ``event_wire``), every other answer the
reference's, on single-group and grouped specs alike.

A wire mutant writes its bug as a function of the reference's drained events and the spec
that returns the payload, and calls ``build_wire``. Each mirrors a bug KV-aware routers met in
the field (spec kv-events-wire.md §5); the ``events_wire`` area must fail each of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from kvcheck.adapters.reference import IMPL_INFO as REFERENCE_INFO
from kvcheck.adapters.reference import ReferenceBlockPool, ReferenceManager
from kvcheck.conformance.protocol import ImplInfo, KVCacheSpec
from kvcheck.events.codec import encode_batch
from kvcheck.reference_impl.events import KVCacheEvent

__all__ = ["WireBug", "build_wire", "encode_as_reference"]

#: (the adapter, the reference's events since the last drain, ts) -> the payload.
WireBug = Callable[["ReferenceManager", list[KVCacheEvent], float], bytes]


def encode_as_reference(adapter: ReferenceManager, events: list[KVCacheEvent], ts: float,
                        **overrides: Any) -> bytes:
    """The reference adapter's encoding of ``events`` (``overrides`` replace its arguments)."""
    v033 = adapter.manager.v033
    args: dict[str, Any] = {
        "ts": ts, "release": "vllm-0.33" if v033 else "vllm-0.10", "int_hashes": False,
        "group_metadata": adapter.manager.kv_cache_event_metadata if v033 else None}
    args.update(overrides)
    return encode_batch(events, **args)


def build_wire(name: str, bug: WireBug) -> tuple[
        ImplInfo, Callable[[KVCacheSpec], Any], Callable[[KVCacheSpec], Any]]:
    """``(IMPL_INFO, make_kv_cache_manager, make_block_pool)`` for the wire mutant ``name``."""

    class WireMutant(ReferenceManager):
        wire_ready_events = False  # the bug rewrites the reference's event dataclasses

        def take_event_batch(self, ts: float) -> bytes:
            return bug(self, list(self.manager.take_events()), ts)

    info = replace(REFERENCE_INFO, name=name,
                   capabilities=REFERENCE_INFO.capabilities - {"kernels", "sizing",
                                                                    "offload", "eagle",
                                                                    "eagle_groups",
                                                                    "prefill_lookahead",
                                                                    "hash_lookahead",
                                                                    "admission_gates",
                                                                    "async_scheduling",
                                                                    "block_zeroing",
                                                                    "mamba_dcp",
                                                                    "mamba_shared_prefix_checkpoint"})
    return info, WireMutant, ReferenceBlockPool
