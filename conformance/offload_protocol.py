"""The offload protocol: what a KV offload tier (a second cache below the GPU pool: vLLM's CPU
offloading, LMCache, Dynamo's KVBM, Mooncake's store, a hardware plugin's host cache)
implements to be checked by the ``offload`` area (docs/semantics.md#the-offload-tier).

A module under ``--kv-impl`` declares capability ``offload`` in its ``IMPL_INFO`` and defines:

* ``make_offloading_manager(spec: OffloadSpec) -> OffloadingManagerAdapter``: a fresh, empty
  tier (called once per test case, under ``--kv-timeout``). It may raise
  ``kvcheck.conformance.protocol.UnsupportedSpec`` for a spec it cannot model (a policy it
  lacks): those tests skip, saying so.

The methods are vLLM 0.33's ``OffloadingManager`` calls (``v1/kv_offload/base.py``) with
primitive types: keys are ``bytes`` (a block hash followed by its KV-cache group index as 4
big-endian bytes, vLLM's ``make_offload_key``), a request is named by its ``req_id`` string
(the adapter keeps one request context per id, as vLLM's scheduler keeps one ``ReqContext``
per request), events are dicts. No kvcheck base class to inherit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypedDict, runtime_checkable

__all__ = ["EVENT_FIELDS", "LOOKUP_RESULTS", "OFFLOAD_CAPABILITIES", "OFFLOAD_FACTORY",
           "OffloadSpec", "OffloadingManagerAdapter", "StoreAnswer"]

#: The factory an offload module defines (capability ``offload``).
OFFLOAD_FACTORY = "make_offloading_manager"

#: Offload capability -> what declaring it promises (merged into ``protocol.CAPABILITIES``).
OFFLOAD_CAPABILITIES: dict[str, str] = {
    "offload": "make_offloading_manager(spec): a KV offload tier with vLLM's OffloadingManager "
               "calls (lookup, prepare_load, complete_load, prepare_store, complete_store, "
               "take_events; docs/semantics.md#the-offload-tier)",
}

#: ``lookup``'s answers: absent, ready, written but not yet readable, ask again later.
LOOKUP_RESULTS = ("MISS", "HIT", "HIT_PENDING", "RETRY")

#: The fields of an event dict (vLLM's ``OffloadingEvent``).
EVENT_FIELDS = ("keys", "medium", "removed", "locality", "ownership", "removal_expected",
                "metadata_only")


@dataclass(frozen=True, slots=True)
class OffloadSpec:
    """One offload tier's configuration (vLLM's ``CPUOffloadingManager`` arguments).

    Attributes:
        num_chunks: slots in the tier (one block each here).
        cache_policy: ``"lru"`` or ``"arc"``.
        store_threshold: 1 stores every offered key; n >= 2 stores a key only once it has
            been offered n times (vLLM's admission filter), counted in an LRU tracker of
            ``max_tracker_size`` keys.
        enable_events: whether ``take_events`` reports anything.
        key_width: the byte length of every key (36: a 32-byte hash and a 4-byte group index).
    """

    num_chunks: int
    cache_policy: Literal["lru", "arc"] = "lru"
    store_threshold: int = 1
    max_tracker_size: int = 64_000
    enable_events: bool = True
    key_width: int = 36


class StoreAnswer(TypedDict):
    """``prepare_store``'s answer: the keys to write (in offer order), the keys evicted for
    them and the slot of each key to write (None: not said)."""

    keys_to_store: list[bytes]
    evicted_keys: list[bytes]
    chunk_ids: list[int] | None


@runtime_checkable
class OffloadingManagerAdapter(Protocol):
    """Capability ``offload``: the tier's calls, each naming the request it is made for."""

    def on_new_request(self, req_id: str) -> None:
        """``req_id`` is scheduled for the first time (before any other call for it)."""
        ...

    def set_key_positions(self, req_id: str, positions: Mapping[bytes, int]) -> None:
        """Where each key's block ends in the request, in tokens (vLLM's
        ``ReqContext.set_offload_key_position``): a policy orders a request's keys by it."""
        ...

    def lookup(self, key: bytes, req_id: str) -> str:
        """One of ``LOOKUP_RESULTS``: ``"MISS"`` (not in the tier), ``"HIT_PENDING"`` (its
        store is not complete), ``"HIT"`` (ready to load)."""
        ...

    def prepare_load(self, keys: Sequence[bytes], req_id: str) -> list[int] | None:
        """Pin ``keys`` (each a ``HIT``) until ``complete_load``: a pinned chunk is never
        evicted. Returns the slot each key is read from, or None for a tier without slots."""
        ...

    def touch(self, keys: Sequence[bytes], req_id: str) -> None:
        """Mark ``keys`` (head to tail) recently used."""
        ...

    def complete_load(self, keys: Sequence[bytes], req_id: str) -> None:
        """The load of ``keys`` (as prepared) finished: unpin them."""
        ...

    def prepare_store(self, keys: Sequence[bytes], req_id: str) -> StoreAnswer | None:
        """Make room for the keys of the offer that are not in the tier yet (each key listed
        once). Returns ``{"keys_to_store": [...], "evicted_keys": [...], "chunk_ids":
        [...] | None}``: the keys to write (in offer order, each now ``HIT_PENDING``), the
        keys evicted for them (never a pinned, pending or offered one) and the slot of each key
        to write. None when the room cannot be made, having changed nothing."""
        ...

    def complete_store(self, keys: Sequence[bytes], req_id: str, success: bool = True) -> None:
        """The store of ``keys`` (the ``keys_to_store`` of one ``prepare_store``) finished:
        they become ``HIT``; with ``success=False`` they leave the tier."""
        ...

    def on_request_finished(self, req_id: str) -> None:
        """``req_id`` ends: no prepare call for it follows (completions still may)."""
        ...

    def take_events(self) -> list[dict[str, object]]:
        """The events since the last call, oldest first, each ``{"keys": [bytes], "medium":
        str, "removed": bool, "locality": str | None, "ownership": str | None,
        "removal_expected": bool, "metadata_only": bool}`` (vLLM's ``OffloadingEvent``);
        ``[]`` when events are disabled."""
        ...

    def reset_cache(self) -> None:
        """Drop everything (no completion of an earlier job follows)."""
        ...
