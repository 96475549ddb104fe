"""Where ``kvcheck events serve`` gets its batches: the reference's seeded random engine here;
any implementation's KV events over a workload (a built-in scenario, a request trace, one
trace of a recorded corpus) in ``kvcheck.bench.event_serve``, from the pieces here.

A source is an iterator of ``SourceBatch``: one per scheduler step (a corpus: per recorded op)
that emitted events, in order, from one engine that starts with an empty cache. Each batch's
payload is the third ZMQ frame as vLLM's ``ZmqEventPublisher`` sends it, ``ts`` = the batch
number (reproducible bytes), ``data_parallel_rank`` the publisher's.

An implementation's events come one of two ways:

* ``event_wire`` (``take_event_batch(ts)``): its own bytes, only the rank set, as vLLM's
  publisher sets it on the batch before encoding (``_RankedBatch`` rewrites no other byte);
  each payload is first decoded strictly (``decode_batch``), so bytes no consumer could read
  stop the serve with the fault named;
* ``events`` (``take_events()`` dicts): encoded by kvcheck (``encode_batch``) in the chosen
  hash form, with 0.33's group metadata from the dicts or the spec's groups.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Final, Protocol

import msgspec

from kvcheck.errors import KVCheckInputError
from kvcheck.events.codec import Release, decode_batch, encode_batch
from kvcheck.events.errors import WireFormatError
from kvcheck.reference_impl.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
)

__all__ = ["BatchSource", "GroupedSpec", "SourceBatch", "encoded_events", "event_from_dict",
           "reference_source", "with_rank"]


@dataclass(frozen=True, slots=True)
class SourceBatch:
    """One step's batch: its payload frame and how many events it holds."""

    payload: bytes
    events: int


#: ``source(engine) -> batches``: engine 0 first, engine 1 after a restart fault (a fresh
#: manager, an empty cache), and so on.
BatchSource = Callable[[int], Iterator[SourceBatch]]


# --------------------------------------------------------------------- the reference engine
def reference_source(release: Release, seed: int, *, int_hashes: bool,
                     data_parallel_rank: int | None) -> BatchSource:
    """The reference manager's endless seeded random workload (``workload.manager_streams``);
    engine ``n`` runs seed ``seed + n``."""
    from kvcheck.events.workload import manager_streams

    def batches(engine: int) -> Iterator[SourceBatch]:
        stream = next(manager_streams(release, seed + engine, steps=None))
        for number, batch in enumerate(stream):
            payload = encode_batch(
                batch.events, ts=float(number), data_parallel_rank=data_parallel_rank,
                release=release, int_hashes=int_hashes,
                group_metadata=batch.group_metadata if release == "vllm-0.33" else None)
            yield SourceBatch(payload, len(batch.events))
    return batches


# ------------------------------------------------------------------ an implementation's events
class _RankedBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """A ``KVEventBatch`` with its timestamp and events kept as raw msgpack: re-encoded, only
    ``data_parallel_rank`` can change (vLLM's ``EventBatch`` is array-like and omits a None
    rank at the end, so setting one appends it)."""

    ts: msgspec.Raw
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


_RANKED_DECODER: Final = msgspec.msgpack.Decoder(_RankedBatch)
_ENCODER: Final = msgspec.msgpack.Encoder()


def with_rank(payload: bytes, data_parallel_rank: int | None, release: Release,
              number: int) -> SourceBatch:
    """``payload`` (an implementation's ``take_event_batch`` bytes) checked strictly and
    given the publisher's rank, as vLLM's publisher gives it to the batch it encodes."""
    try:
        decode_batch(payload, release=release)
        batch = _RANKED_DECODER.decode(payload)
    except (WireFormatError, msgspec.DecodeError) as error:
        raise KVCheckInputError(
            f"batch {number}: take_event_batch returned bytes that are not a {release} "
            f"KVEventBatch ({error}): fix the implementation's encoder (docs/events.md has the "
            "bytes), or serve its take_events() through kvcheck's encoder with --hashes") from None
    if data_parallel_rank != batch.data_parallel_rank:
        batch.data_parallel_rank = data_parallel_rank
        payload = _ENCODER.encode(batch)
    return SourceBatch(payload, len(batch.events))


_EVENT_CLASSES: Final[dict[str, Callable[..., KVCacheEvent]]] = {
    cls.__name__: cls for cls in (BlockStored, BlockRemoved, AllBlocksCleared)}
_FIELDS: Final[dict[str, frozenset[str]]] = {
    cls.__name__: frozenset(f.name for f in fields(cls))
    for cls in (BlockStored, BlockRemoved, AllBlocksCleared)}


class _Group(Protocol):
    @property
    def kind(self) -> str: ...

    @property
    def sliding_window(self) -> int | None: ...


class GroupedSpec(Protocol):
    """What ``encoded_events`` reads of a spec (``kvcheck.conformance.protocol.KVCacheSpec``,
    which events does not import): its groups."""

    @property
    def kv_cache_groups(self) -> Sequence[_Group]: ...


def event_from_dict(event: Mapping[str, object], number: int, index: int) -> KVCacheEvent:
    """A protocol event dict (``SupportsEvents.take_events``) as the reference's event, for
    ``encode_batch``; fields the event class lacks (0.33's group metadata) are left out."""
    kind = event.get("type") if isinstance(event, Mapping) else None
    if not isinstance(kind, str) or kind not in _EVENT_CLASSES:
        raise KVCheckInputError(
            f"batch {number}, event {index}: take_events gave {event!r}, not a dict with "
            f"\"type\" in {sorted(_EVENT_CLASSES)}: fix the adapter's take_events")
    try:
        return _EVENT_CLASSES[kind](**{k: v for k, v in event.items() if k in _FIELDS[kind]})
    except TypeError as error:
        raise KVCheckInputError(f"batch {number}, event {index}: {kind} {event!r}: {error}: "
                                "fix the adapter's take_events") from None


# Any: the protocol's event dicts (conformance's KVEvent) as the adapter gave them: a
# store's metadata is taken as it is (encode_batch writes it).
def _group_metadata(spec: GroupedSpec, events: Sequence[Mapping[str, Any]]
                    ) -> dict[int, tuple[str, int | None]]:
    """Per group ``(kind, sliding_window)``: the spec's groups (one full-attention group for a
    single-group spec), overridden by what the dicts themselves carry."""
    groups = spec.kv_cache_groups
    meta: dict[int, tuple[str, int | None]] = (
        {i: (g.kind, g.sliding_window if g.kind == "sliding_window" else None)
         for i, g in enumerate(groups)} if groups else {0: ("full_attention", None)})
    for event in events:
        if event.get("type") == "BlockStored" and event.get("kv_cache_spec_kind") is not None:
            meta[event.get("group_idx", 0)] = (event["kv_cache_spec_kind"],
                                               event.get("kv_cache_spec_sliding_window"))
    return meta


def encoded_events(dicts: Sequence[Mapping[str, object]], spec: GroupedSpec, *, ts: float,
                   release: Release, int_hashes: bool, data_parallel_rank: int | None,
                   number: int) -> SourceBatch:
    """One step's ``take_events()`` dicts as ``release``'s payload (kvcheck's encoder)."""
    events = [event_from_dict(d, number, i) for i, d in enumerate(dicts)]
    try:
        payload = encode_batch(
            events, ts=ts, data_parallel_rank=data_parallel_rank, release=release,
            int_hashes=int_hashes,
            group_metadata=_group_metadata(spec, dicts) if release == "vllm-0.33" else None)
    except WireFormatError as error:
        raise KVCheckInputError(f"batch {number}: the implementation's events cannot take "
                                f"{release}'s wire form: {error}") from None
    return SourceBatch(payload, len(events))
