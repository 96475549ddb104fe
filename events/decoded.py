"""``DecodedBatch``: one decoded payload, the type every batch decoder of ``kvcheck.events``
produces.

It is a msgspec struct in the envelope's own wire form (the array ``[ts, events,
data_parallel_rank]``), so a decoder can build it directly: each strict decoder
(``kvcheck.events.strict``) decodes a payload straight into a subclass whose ``wire_events``
field names its validating event twins, and ``codec.decode_batch`` hands that object out
as is. Nothing is built in Python on the way (at a microsecond a batch, one more Python
object or call is a tenth of the cost). The reference's event objects are made from the wire
events when ``events`` is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, cast

import msgspec

from kvcheck.events.batch import EventBatch
from kvcheck.events.errors import WireFormatError
from kvcheck.reference_impl.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
)

__all__ = ["DecodedBatch", "batch_class", "event_from_valid_wire", "extra_keys_from_wire"]


class DecodedBatch(msgspec.Struct, array_like=True, gc=False):
    """One decoded payload; read-only by contract.

    Fields (the envelope's, in wire order): ``ts``, the batch's timestamp; ``wire_events``,
    the release's events as decoded (its field names and tags, with the fields the reference
    does not model: 0.33's spec kind, sliding window, locality, ownership, session id,
    lookahead tokens; hashes as on the wire, ``int`` or ``bytes``); ``data_parallel_rank``.
    Each decoder subclasses it with ``wire_events`` typed for its release and hash form.
    """

    ts: float
    wire_events: list[Any]  # Any: msgspec's field type (each decoder's subclass narrows it)
    data_parallel_rank: int | None = None
    #: The release's ``KVEventBatch`` class (``vllm_033`` / ``vllm_010``), set per subclass.
    wire_class: ClassVar[type[EventBatch]]

    @property
    def events(self) -> tuple[KVCacheEvent, ...]:
        """The reference's event objects (hashes as ``bytes``: the digest in the bytes form,
        its last 8 bytes in the int form), built from ``wire_events`` at each read (bind it
        once when reading it more than once)."""
        return tuple(map(event_from_valid_wire, self.wire_events))

    @property
    def wire(self) -> EventBatch:
        """The release's ``KVEventBatch`` (``kvcheck.events.vllm_033`` / ``vllm_010``) holding
        ``wire_events``."""
        return self.wire_class(ts=self.ts, events=self.wire_events,
                               data_parallel_rank=self.data_parallel_rank)

    def __repr__(self) -> str:
        return (f"DecodedBatch(ts={self.ts!r}, data_parallel_rank="
                f"{self.data_parallel_rank!r}, {len(self.wire_events)} events)")

    def group_metadata(self) -> dict[int, tuple[str, int | None]]:
        """Per group, the ``(kind, sliding_window)`` its ``BlockStored`` events carry (0.33;
        groups whose stores carry no kind are absent), as ``encode_batch`` takes it.

        Raises:
            WireFormatError: two stores of one group disagree.
        """
        found: dict[int, tuple[str, int | None]] = {}
        for index, event in enumerate(self.wire_events):
            kind = getattr(event, "kv_cache_spec_kind", None)
            if kind is None or event.group_idx is None:
                continue
            meta = (kind, event.kv_cache_spec_sliding_window)
            if found.setdefault(event.group_idx, meta) != meta:
                raise WireFormatError(
                    f"group {event.group_idx} is {meta} here but {found[event.group_idx]} in "
                    "an earlier store of the batch", event_index=index,
                    field="kv_cache_spec_kind")
        return found


def batch_class(wire_class: type[EventBatch],
                # Any: the default type form, msgspec's "any value" (vLLM's own decoder's)
                wire_events: object = list[Any]) -> type[DecodedBatch]:
    """A ``DecodedBatch`` subclass for the release whose ``KVEventBatch`` is ``wire_class``,
    decoding its events as ``wire_events`` (a strict decoder's validating twins, or any)."""
    cls = msgspec.defstruct(
        "DecodedBatch", [("wire_events", wire_events)], bases=(DecodedBatch,),
        namespace={"wire_class": wire_class, "__module__": __name__},
        array_like=True, gc=False)
    return cast("type[DecodedBatch]", cls)  # defstruct is typed as returning type[Struct]


def _valid_hash(value: int | bytes) -> bytes:
    return value.to_bytes(8, "big") if isinstance(value, int) else value


def extra_keys_from_wire(value: Sequence[object] | None) -> tuple[object, ...] | None:
    """``extra_keys`` as the reference holds them: msgpack has no tuples, so the
    ``(identifier, offset)`` pairs come back as lists."""
    def freeze(item: object) -> object:
        return tuple(freeze(x) for x in item) if isinstance(item, (list, tuple)) else item
    return None if value is None else tuple(None if k is None else freeze(k) for k in value)


# Any: a validated wire struct of either release, or a strict decoder's twin of one (a class
# built at run time), read by field name.
def event_from_valid_wire(event: Any) -> KVCacheEvent:
    """The reference's event for a wire event a decoder has validated (one hash form, u64
    ints, digest widths, ``group_idx >= 0``): a plain conversion, nothing to check."""
    name = type(event).__name__
    if name == "AllBlocksCleared":
        return AllBlocksCleared()
    hashes = tuple(map(_valid_hash, event.block_hashes))
    # 0.33 always sets group_idx; absent (None) is 0.10.2's one group.
    group = getattr(event, "group_idx", None) or 0
    if name == "BlockRemoved":
        return BlockRemoved(block_hashes=hashes, medium=event.medium, group_idx=group)
    parent = event.parent_block_hash
    return BlockStored(block_hashes=hashes,
                       parent_block_hash=None if parent is None else _valid_hash(parent),
                       token_ids=tuple(event.token_ids), block_size=event.block_size,
                       lora_id=event.lora_id, medium=event.medium,
                       lora_name=getattr(event, "lora_name", None),
                       extra_keys=extra_keys_from_wire(getattr(event, "extra_keys", None)),
                       group_idx=group)
