"""Encode and decode KV event batches in the exact bytes of a vLLM release.

``encode_batch`` turns the reference's events (``kvcheck.reference_impl.events``) into the
payload vLLM's ``ZmqEventPublisher`` sends (its third frame): msgspec's msgpack of the
release's ``KVEventBatch`` (``vllm_033`` / ``vllm_010``). ``decode_batch`` reads such a
payload back, checking it is that release's form; every problem is a ``WireFormatError``
naming the event and field, never a bare msgspec error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass
from types import ModuleType
from typing import Any, Final, Literal, cast

import msgspec

from kvcheck.events import vllm_010, vllm_033
from kvcheck.events.batch import EventBatch
from kvcheck.events.decoded import DecodedBatch, batch_class, extra_keys_from_wire
from kvcheck.events.diagnose import explain_decode_error, explain_validation_error
from kvcheck.events.errors import WireFormatError
from kvcheck.events.hashes import from_wire_hash, to_wire_hash
from kvcheck.events.strict import StrictDecoder, strict_decoders
from kvcheck.reference_impl.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
)

__all__ = ["RELEASES", "DecodedBatch", "GroupMetadata", "Release", "decode_batch",
           "encode_batch"]

Release = Literal["vllm-0.33", "vllm-0.10"]
#: Per KV-cache group, the ``(kv_cache_spec_kind, kv_cache_spec_sliding_window)`` 0.33's
#: ``KVCacheManager.take_events`` puts on each ``BlockStored`` (the reference manager's
#: ``kv_cache_event_metadata``).
GroupMetadata = Sequence[tuple[str, int | None]] | Mapping[int, tuple[str, int | None]]


@dataclass(frozen=True, slots=True)
class _Form:
    structs: ModuleType
    map_form: bool
    #: vLLM's own decoder (either hash form, no constraints): the general path.
    decoder: msgspec.msgpack.Decoder[EventBatch]
    event_fields: dict[str, tuple[str, ...]]
    #: One validating decoder per hash form (``kvcheck.events.strict``): the fast path.
    strict: tuple[StrictDecoder, ...]
    #: The general path's ``DecodedBatch`` (events as vLLM's own decoder read them).
    general: type[DecodedBatch]


def _form(structs: ModuleType, map_form: bool) -> _Form:
    classes = (structs.BlockStored, structs.BlockRemoved, structs.AllBlocksCleared)
    return _Form(structs, map_form, msgspec.msgpack.Decoder(structs.KVEventBatch),
                 {c.__name__: c.__struct_fields__ for c in classes},
                 tuple(strict_decoders(structs)), batch_class(structs.KVEventBatch))


_FORMS: Final[dict[str, _Form]] = {"vllm-0.33": _form(vllm_033, True),
                                   "vllm-0.10": _form(vllm_010, False)}
#: The releases whose wire form this module writes, newest first.
RELEASES: Final = tuple(_FORMS)
# vLLM's publisher: a default Encoder (``ZmqEventPublisher._pack``).
_ENCODER: Final = msgspec.msgpack.Encoder()


def _get_form(release: str) -> _Form:
    try:
        return _FORMS[release]
    except (KeyError, TypeError):
        raise WireFormatError(f"unknown release {release!r}: one of {list(RELEASES)}") from None


# ------------------------------------------------------------------------------- encode
def encode_batch(events: Iterable[KVCacheEvent], *, ts: float,
                 data_parallel_rank: int | None = None, release: Release = "vllm-0.33",
                 int_hashes: bool = True,
                 group_metadata: GroupMetadata | None = None) -> bytes:
    """The payload vLLM ``release`` publishes for ``events`` (one scheduler step's batch).

    Args:
        events: the reference's events, in order.
        ts: the batch's timestamp (vLLM: ``time.time()`` when the step published).
        data_parallel_rank: the publisher's DP rank (vLLM's publisher always sets it; None is
            written as nil).
        release: ``"vllm-0.33"`` (tagged maps) or ``"vllm-0.10"`` (tagged arrays).
        int_hashes: ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``: hashes as the u64 of their last
            8 bytes (vLLM's default) or as raw bytes.
        group_metadata: 0.33 only: per group ``(kind, sliding_window)`` to annotate each
            ``BlockStored`` with, as vLLM's ``take_events`` does (the reference manager's
            ``kv_cache_event_metadata``); None leaves both fields out.

    Raises:
        WireFormatError: an unknown release; an object that is not a reference event; a hash
            that cannot take the form; a field 0.10.2 cannot carry (``lora_name``,
            ``extra_keys``, a ``group_idx`` other than 0); group metadata for 0.10 or missing
            a group.
    """
    form = _get_form(release)
    if group_metadata is not None and not form.map_form:
        raise WireFormatError("vLLM 0.10.2's events carry no KV-cache spec metadata: pass "
                              "group_metadata=None with release='vllm-0.10'")
    meta = (dict(enumerate(group_metadata)) if isinstance(group_metadata, Sequence)
            else group_metadata)
    convert = _event_to_033 if form.map_form else _event_to_010
    wire = [convert(event, index, int_hashes, meta) for index, event in enumerate(events)]
    batch = form.structs.KVEventBatch(ts=ts, events=wire, data_parallel_rank=data_parallel_rank)
    return _ENCODER.encode(batch)


def _hashes(hashes: Sequence[bytes], int_hashes: bool, index: int) -> list[int | bytes]:
    if not isinstance(hashes, (tuple, list)):
        raise WireFormatError(f"block_hashes must be a sequence of bytes, got "
                              f"{type(hashes).__name__}", event_index=index,
                              field="block_hashes")
    return [to_wire_hash(h, int_hashes, event_index=index, field=f"block_hashes[{i}]")
            for i, h in enumerate(hashes)]


def _parent(event: BlockStored, int_hashes: bool, index: int) -> int | bytes | None:
    if event.parent_block_hash is None:
        return None
    return to_wire_hash(event.parent_block_hash, int_hashes, event_index=index,
                        field="parent_block_hash")


def _not_an_event(event: object, index: int) -> WireFormatError:
    return WireFormatError(f"not a reference KV event: {event!r} (BlockStored, BlockRemoved "
                           "or AllBlocksCleared of kvcheck.reference_impl.events)",
                           event_index=index)


#: Each reference event class's name -> its field names: an event is recognised by both, so
#: a copy of the reference's classes (scripts/mutate.py serves the reference from a copied
#: package) or an engine's own dataclasses with the same names and fields encode too.
_EVENT_FIELD_NAMES: Final[dict[str, tuple[str, ...]]] = {
    cls.__name__: tuple(f.name for f in fields(cls))
    for cls in (BlockStored, BlockRemoved, AllBlocksCleared)}


def _kind(event: object) -> str | None:
    """``"BlockStored"`` / ``"BlockRemoved"`` / ``"AllBlocksCleared"``, or None when ``event``
    is none of them (by class name and dataclass fields)."""
    name = type(event).__name__
    if isinstance(event, (BlockStored, BlockRemoved, AllBlocksCleared)):
        return name
    want = _EVENT_FIELD_NAMES.get(name)
    if want is None or not is_dataclass(event):
        return None
    have = tuple(f.name for f in fields(event))
    # A BlockStored class from before lookahead_token_ids (the last field) still encodes.
    older = have == want[:-1] and want[-1] == "lookahead_token_ids"
    return name if have == want or older else None


# Typed loosely (as in wire_events): the reference holds extra_keys as a tuple of objects where
# vLLM's struct declares a list of tuples; msgspec checks no type when a struct is built.
_STORED_033: Final[Callable[..., vllm_033.BlockStored]] = vllm_033.BlockStored


def _event_to_033(event: object, index: int, int_hashes: bool,
                  meta: Mapping[int, tuple[str, int | None]] | None) -> vllm_033.KVCacheEvent:
    kind_of = _kind(event)
    if kind_of == "BlockStored":
        event = cast(BlockStored, event)  # _kind: the reference's class or a copy (same fields)
        kind: str | None = None
        window: int | None = None
        if meta is not None:
            if event.group_idx not in meta:
                raise WireFormatError(f"group_metadata has no entry for group {event.group_idx}",
                                      event_index=index, field="group_idx")
            kind, window = meta[event.group_idx]
        return _STORED_033(
            block_hashes=_hashes(event.block_hashes, int_hashes, index),
            parent_block_hash=_parent(event, int_hashes, index),
            token_ids=list(event.token_ids), block_size=event.block_size,
            lora_id=event.lora_id, medium=event.medium, lora_name=event.lora_name,
            extra_keys=None if event.extra_keys is None else list(event.extra_keys),
            group_idx=event.group_idx, kv_cache_spec_kind=kind,
            kv_cache_spec_sliding_window=window,
            lookahead_token_ids=_lookahead(getattr(event, "lookahead_token_ids", None)))
    if kind_of == "BlockRemoved":
        event = cast(BlockRemoved, event)  # _kind: as above
        return vllm_033.BlockRemoved(block_hashes=_hashes(event.block_hashes, int_hashes, index),
                                     medium=event.medium, group_idx=event.group_idx)
    if kind_of == "AllBlocksCleared":
        return vllm_033.AllBlocksCleared()
    raise _not_an_event(event, index)


def _lookahead(value: object) -> list[list[int]] | None:
    """``BlockStored.lookahead_token_ids`` as vLLM 0.33's struct holds it (lists)."""
    if value is None:
        return None
    return [list(tokens) for tokens in cast(Sequence[Sequence[int]], value)]


def _only_010_fields(event: BlockStored | BlockRemoved, index: int) -> None:
    """0.10.2 has no place for these: refuse rather than drop them silently."""
    if event.group_idx != 0:
        raise WireFormatError(
            "vLLM 0.10.2's events have no group_idx (it turns the hybrid KV-cache manager off "
            "when KV events are configured, so there is one group), got group "
            f"{event.group_idx}", event_index=index, field="group_idx")
    if _kind(event) == "BlockStored":
        for name in ("lora_name", "extra_keys", "lookahead_token_ids"):
            if getattr(event, name, None) is not None:
                raise WireFormatError(f"vLLM 0.10.2's BlockStored has no {name} field, got "
                                      f"{getattr(event, name)!r}", event_index=index,
                                      field=name)


def _event_to_010(event: object, index: int, int_hashes: bool,
                  meta: Mapping[int, tuple[str, int | None]] | None) -> vllm_010.KVCacheEvent:
    del meta  # refused above for 0.10
    kind_of = _kind(event)
    if kind_of == "BlockStored":
        event = cast(BlockStored, event)  # _kind: the reference's class or a copy (same fields)
        _only_010_fields(event, index)
        return vllm_010.BlockStored(
            block_hashes=_hashes(event.block_hashes, int_hashes, index),
            parent_block_hash=_parent(event, int_hashes, index),
            token_ids=list(event.token_ids), block_size=event.block_size,
            lora_id=event.lora_id, medium=event.medium)
    if kind_of == "BlockRemoved":
        event = cast(BlockRemoved, event)  # _kind: as above
        _only_010_fields(event, index)
        return vllm_010.BlockRemoved(block_hashes=_hashes(event.block_hashes, int_hashes, index),
                                     medium=event.medium)
    if kind_of == "AllBlocksCleared":
        return vllm_010.AllBlocksCleared()
    raise _not_an_event(event, index)


# ------------------------------------------------------------------------------- decode
def decode_batch(payload: bytes | bytearray | memoryview, release: Release = "vllm-0.33", *,
                 int_hashes: bool | None = None) -> DecodedBatch:
    """Read one payload of vLLM ``release`` back into the reference's events.

    ``int_hashes``: True or False requires that hash form, None accepts either (vLLM's own
    decoder takes ``bytes | int``), but not both in one batch. Like vLLM's decoder, map keys
    and trailing array elements a newer release may add are ignored.

    Raises:
        WireFormatError: not bytes; not exactly one msgpack value (truncated, trailing
            bytes); not this release's ``KVEventBatch`` (the other release's event form, an
            unknown tag, a missing field, a field of the wrong type); a hash of the wrong
            form or width; a ``group_idx`` that is negative. The message names the event
            index and field.
    """
    # Fast path: the strict decoder that took this release's last payload (a stream keeps
    # one hash form) validates as it decodes, straight into the DecodedBatch; a batch is
    # about a microsecond, so this path is one lookup and one call (an unknown release's
    # KeyError goes on to the error below).
    if int_hashes is None:
        try:
            return _FAST[release](payload)
        except (msgspec.ValidationError, msgspec.DecodeError, TypeError, KeyError):
            pass
    else:
        head = _LAST.get(release)
        if head is not None and head.int_hashes is int_hashes:
            try:
                return head.decode(payload)
            except (msgspec.ValidationError, msgspec.DecodeError, TypeError):
                pass
    form = _get_form(release)
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise WireFormatError(f"a payload is bytes (the publisher's third frame), got "
                              f"{type(payload).__name__}")
    order = _STRICT_ORDER[release]
    for candidate in order[1:]:
        if int_hashes is not None and candidate.int_hashes is not int_hashes:
            continue
        try:
            wire = candidate.decoder.decode(payload)
        except (msgspec.ValidationError, msgspec.DecodeError):
            continue
        order.remove(candidate)  # serves first from now on
        order.insert(0, candidate)
        _LAST[release] = candidate
        _FAST[release] = candidate.decode
        return wire
    return _decode_general(payload, form, release, int_hashes)


#: Release -> its strict decoders, the one that last accepted a payload first (reordered in
#: place; a race between threads only costs a retry).
_STRICT_ORDER: Final[dict[str, list[StrictDecoder]]] = {
    release: list(form.strict) for release, form in _FORMS.items()}
#: Release -> the head of its ``_STRICT_ORDER`` list.
_LAST: Final[dict[str, StrictDecoder]] = {
    release: order[0] for release, order in _STRICT_ORDER.items()}
#: Release -> its head's bound ``decode`` (the fast path's one lookup).
_FAST: Final[dict[str, Callable[[bytes | bytearray | memoryview], DecodedBatch]]] = {
    release: head.decode for release, head in _LAST.items()}


def _decode_general(payload: bytes | bytearray | memoryview, form: _Form, release: Release,
                    int_hashes: bool | None) -> DecodedBatch:
    """vLLM's own (unconstrained) decoder, then a check hash by hash: raises the error that
    names the fault (a payload no strict decoder took), or returns the batch."""
    try:
        wire = form.decoder.decode(payload)
    except msgspec.ValidationError as error:
        try:  # the untyped value names the tag of the event at fault
            raw: object = msgspec.msgpack.decode(payload)
        except msgspec.DecodeError:
            raw = None
        raise explain_validation_error(error, release, form.event_fields, form.map_form,
                                       raw) from None
    except msgspec.DecodeError as error:
        raise explain_decode_error(error, release) from None
    forms: set[bool] = set()
    for index, event in enumerate(wire.events):  # raises at the first fault
        _event_from_wire(event, index, int_hashes, forms)
    return form.general(ts=wire.ts, wire_events=wire.events,
                        data_parallel_rank=wire.data_parallel_rank)


def _from_hash(value: int | bytes, int_hashes: bool | None, forms: set[bool], index: int,
               field: str) -> bytes:
    forms.add(isinstance(value, int))
    if len(forms) > 1:
        raise WireFormatError("hashes in both the int and the bytes form in one batch (a "
                              "publisher uses one: VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES)",
                              event_index=index, field=field)
    return from_wire_hash(value, int_hashes, event_index=index, field=field)


def _group(value: int | None, index: int) -> int:
    # 0.33 always sets group_idx; absent (None) is 0.10.2's one group.
    if value is None:
        return 0
    if value < 0:
        raise WireFormatError(f"group_idx {value} is negative", event_index=index,
                              field="group_idx")
    return value


# Any: a struct of vLLM's own decoder for either release, read by field name.
def _event_from_wire(event: Any, index: int, int_hashes: bool | None,
                     forms: set[bool]) -> KVCacheEvent:
    name = type(event).__name__
    if name == "AllBlocksCleared":
        return AllBlocksCleared()
    hashes = tuple(_from_hash(h, int_hashes, forms, index, f"block_hashes[{i}]")
                   for i, h in enumerate(event.block_hashes))
    group = _group(getattr(event, "group_idx", None), index)
    if name == "BlockRemoved":
        return BlockRemoved(block_hashes=hashes, medium=event.medium, group_idx=group)
    parent = (None if event.parent_block_hash is None else
              _from_hash(event.parent_block_hash, int_hashes, forms, index,
                         "parent_block_hash"))
    return BlockStored(block_hashes=hashes, parent_block_hash=parent,
                       token_ids=tuple(event.token_ids), block_size=event.block_size,
                       lora_id=event.lora_id, medium=event.medium,
                       lora_name=getattr(event, "lora_name", None),
                       extra_keys=extra_keys_from_wire(getattr(event, "extra_keys", None)),
                       group_idx=group)
