"""KV events built in a vLLM release's wire form when they happen, as vLLM builds them.

vLLM's ``BlockPool`` constructs the msgspec structs its ``ZmqEventPublisher`` encodes at the
moment a block is cached or evicted (``BlockStored(...)`` in ``cache_full_blocks``,
``BlockRemoved(...)`` in ``_maybe_evict_cached_block``), hashes already in their wire form
(``maybe_convert_block_hash``); 0.33's ``KVCacheManager.take_events`` then annotates each
``BlockStored`` with its group's kind and window, and the publisher encodes the step's list in
one ``KVEventBatch``. ``WireEventFactory`` gives a reference ``BlockPool`` the same shape (it is
a ``reference_impl.events.KVEventFactory``): the pool's events are the release's structs, the
0.33 annotation is made when the event is built, and a step's payload is one msgspec call
(``encode``). The bytes are ``codec.encode_batch``'s for the same events (tested), without its
conversion of the reference's dataclasses at encode time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, fields
from typing import Any, Final

import msgspec

from kvcheck.events import vllm_010, vllm_033
from kvcheck.events.codec import RELEASES, Release
from kvcheck.events.errors import WireFormatError
from kvcheck.reference_impl import events as reference_events
from kvcheck.reference_impl.hashing import to_event_int

__all__ = ["WireEvent", "WireEventFactory", "wire_event_factory", "wire_event_to_dict"]

#: An event in a release's wire form (the structs of ``vllm_033`` / ``vllm_010``).
WireEvent = vllm_033.KVCacheEvent | vllm_010.KVCacheEvent

# vLLM's publisher: a default Encoder (``ZmqEventPublisher._pack``).
_ENCODER: Final = msgspec.msgpack.Encoder()


@dataclass(frozen=True, slots=True)
class WireEventFactory:
    """A ``KVEventFactory`` whose events are ``release``'s wire structs (build it with
    ``wire_event_factory``). ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` take the
    keywords of the reference's event classes."""

    release: Release
    int_hashes: bool
    BlockStored: Callable[..., WireEvent]
    BlockRemoved: Callable[..., WireEvent]
    AllBlocksCleared: Callable[[], WireEvent]
    batch: type[msgspec.Struct]

    def encode(self, events: Sequence[object], ts: float,
               data_parallel_rank: int | None = None) -> bytes:
        """The payload vLLM's publisher sends for one step's ``events`` (this factory's, in
        order): their ``KVEventBatch``, msgpack-encoded."""
        return _ENCODER.encode(self.batch(ts=ts, events=events,
                                          data_parallel_rank=data_parallel_rank))


def wire_event_factory(release: Release = "vllm-0.33", *, int_hashes: bool = False,
                       group_metadata: Sequence[tuple[str, int | None]] | None = None,
                       ) -> WireEventFactory:
    """The factory of ``release``'s events.

    Args:
        release: ``"vllm-0.33"`` (tagged maps) or ``"vllm-0.10"`` (tagged arrays).
        int_hashes: ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``: hashes as the u64 of their last
            8 bytes, converted when the event is built as vLLM does, or as raw bytes.
        group_metadata: 0.33 only: per group ``(kind, sliding_window)`` each ``BlockStored``
            carries (``kv_cache_interface.kv_cache_event_metadata``); None leaves both out.

    Raises:
        WireFormatError: an unknown release; group metadata for 0.10. When an event is built:
            a group without metadata; under 0.10, a field 0.10.2's events cannot carry
            (``lora_name``, ``extra_keys``, a ``group_idx`` other than 0), as ``encode_batch``
            refuses them.
    """
    if release not in RELEASES:
        raise WireFormatError(f"unknown release {release!r}: one of {list(RELEASES)}")
    if release == "vllm-0.33":
        return _factory_033(int_hashes, group_metadata)
    if group_metadata is not None:
        raise WireFormatError("vLLM 0.10.2's events carry no KV-cache spec metadata: pass "
                              "group_metadata=None with release='vllm-0.10'")
    return _factory_010(int_hashes)


def _int_hashes(hashes: Sequence[bytes]) -> tuple[int, ...]:
    return tuple(map(to_event_int, hashes))


def _factory_033(int_hashes: bool,
                 group_metadata: Sequence[tuple[str, int | None]] | None) -> WireEventFactory:
    # Typed loosely: the pool's sequences are tuples where vLLM's structs say list; msgspec
    # writes both as the same msgpack array and checks no type when a struct is built.
    stored_cls: Callable[..., vllm_033.BlockStored] = vllm_033.BlockStored
    removed_cls: Callable[..., vllm_033.BlockRemoved] = vllm_033.BlockRemoved
    meta = None if group_metadata is None else tuple(group_metadata)
    stored = stored_cls  # the reference's keywords are 0.33's fields
    removed = removed_cls
    if meta is not None or int_hashes:
        def stored(*, block_hashes: Sequence[bytes], parent_block_hash: bytes | None,
                   group_idx: int, **fields: object) -> vllm_033.BlockStored:
            kind = window = None
            if meta is not None:
                if not 0 <= group_idx < len(meta):
                    raise WireFormatError(f"group_metadata has no entry for group {group_idx}",
                                          field="group_idx")
                kind, window = meta[group_idx]
            hashes: Sequence[int | bytes] = block_hashes
            parent: int | bytes | None = parent_block_hash
            if int_hashes:
                hashes = _int_hashes(block_hashes)
                parent = None if parent_block_hash is None else to_event_int(parent_block_hash)
            return stored_cls(block_hashes=hashes, parent_block_hash=parent,
                              group_idx=group_idx, kv_cache_spec_kind=kind,
                              kv_cache_spec_sliding_window=window, **fields)
    if int_hashes:
        def removed(*, block_hashes: Sequence[bytes], medium: str | None,
                    group_idx: int) -> vllm_033.BlockRemoved:
            return removed_cls(block_hashes=_int_hashes(block_hashes), medium=medium,
                               group_idx=group_idx)
    return WireEventFactory("vllm-0.33", int_hashes, stored, removed,
                            vllm_033.AllBlocksCleared, vllm_033.KVEventBatch)


def _only_010(name: str, value: object, default: object) -> None:
    """0.10.2 has no place for these: refuse rather than drop them silently."""
    if value != default:
        raise WireFormatError(f"vLLM 0.10.2's events have no {name} field, got {value!r} "
                              "(it turns the hybrid KV-cache manager off when KV events are "
                              "configured: one group, no LoRA names or extra keys on events)",
                              field=name)


def _factory_010(int_hashes: bool) -> WireEventFactory:
    # tuples for lists, as in 0.33's
    stored_cls: Callable[..., vllm_010.BlockStored] = vllm_010.BlockStored
    removed_cls: Callable[..., vllm_010.BlockRemoved] = vllm_010.BlockRemoved
    wire: Callable[[Sequence[bytes]], Sequence[int | bytes]] = (
        _int_hashes if int_hashes else tuple)

    def stored(*, block_hashes: Sequence[bytes], parent_block_hash: bytes | None,
               token_ids: Sequence[int], block_size: int, lora_id: int | None,
               medium: str | None, lora_name: str | None = None,
               extra_keys: tuple[object, ...] | None = None,
               group_idx: int = 0,
               lookahead_token_ids: tuple[tuple[int, ...], ...] | None = None,
               ) -> vllm_010.BlockStored:
        _only_010("lora_name", lora_name, None)
        _only_010("lookahead_token_ids", lookahead_token_ids, None)
        _only_010("extra_keys", extra_keys, None)
        _only_010("group_idx", group_idx, 0)
        parent: int | bytes | None = parent_block_hash
        if int_hashes and parent_block_hash is not None:
            parent = to_event_int(parent_block_hash)
        return stored_cls(wire(block_hashes), parent, token_ids, block_size, lora_id, medium)

    def removed(*, block_hashes: Sequence[bytes], medium: str | None,
                group_idx: int = 0) -> vllm_010.BlockRemoved:
        _only_010("group_idx", group_idx, 0)
        return removed_cls(wire(block_hashes), medium)

    return WireEventFactory("vllm-0.10", int_hashes, stored, removed,
                            vllm_010.AllBlocksCleared, vllm_010.KVEventBatch)


# ------------------------------------------------------------------------------ as dicts
#: Event name -> the reference class's ``(field, default)`` in order (None: required).
_REFERENCE_FIELDS: Final[dict[str, tuple[tuple[str, object], ...]]] = {
    cls.__name__: tuple((f.name, None if f.default is MISSING else f.default)
                        for f in fields(cls))
    for cls in (reference_events.BlockStored, reference_events.BlockRemoved,
                reference_events.AllBlocksCleared)}
_GROUP_FIELDS: Final = ("group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window")
#: Reference fields a dict carries only when set: vLLM 0.33's hash lookahead tokens, so the
#: dicts of every engine without lookahead read as they did before the field.
_OMITTED_WHEN_NONE: Final = frozenset({"lookahead_token_ids"})


def wire_event_to_dict(event: object, group_fields: bool = False,
                       hash_bytes: Callable[[object], object] | None = None
                       ) -> dict[str, object]:
    """An event as the protocol's dict: ``"type"`` plus exactly the reference's fields, those
    its class lacks at the reference's default (0.10.2's structs: ``lora_name``,
    ``extra_keys``, ``group_idx`` 0), but ``lookahead_token_ids`` only when not None (vLLM
    0.33 with hash lookahead: one list of tokens per block). The event is a reference
    dataclass, a wire struct of this module, or vLLM's own.

    ``group_fields``: the grouped form, the release's own group fields instead, present
    exactly when its event class has them (0.33: ``group_idx``, and on ``BlockStored`` the
    spec kind and window), absent otherwise (0.10.2). ``hash_bytes``: applied to each hash
    (the hash lists become lists); None passes the hashes as the struct holds them.
    """
    name = type(event).__name__
    out: dict[str, object] = {"type": name}
    for field_name, default in _REFERENCE_FIELDS.get(name, ()):
        # Any: the field as the event's class holds it (block_hashes: a sequence of hashes)
        value: Any = getattr(event, field_name, default)
        if hash_bytes is not None and field_name == "block_hashes":
            value = [hash_bytes(h) for h in value]
        elif hash_bytes is not None and field_name == "parent_block_hash":
            value = hash_bytes(value)
        elif field_name == "group_idx" and value is None:
            value = default
        elif value is None and field_name in _OMITTED_WHEN_NONE:
            continue
        out[field_name] = value
    if group_fields:
        for field_name in _GROUP_FIELDS:
            if hasattr(event, field_name):
                out[field_name] = getattr(event, field_name)
            else:
                out.pop(field_name, None)
    return out
