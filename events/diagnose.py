"""msgspec's decode errors, told in the vocabulary of KV events.

msgspec names the place of a bad value by a path into the batch (``$[1][0].block_size``:
batch element 1 is ``events``, then event 0, then its field); this turns that path into the
event index and field name a ``WireFormatError`` carries, and adds the fix where one is
known: a tagged array given to a map-form release is the older release's form (the mismatch
that silently switched cache-aware routing off in consumers: SGLang #38561, Dynamo #10681).
"""

from __future__ import annotations

import re
from typing import Final

import msgspec

from kvcheck.events.errors import WireFormatError

__all__ = ["explain_decode_error", "explain_validation_error"]

_BATCH_FIELDS: Final = ("ts", "events", "data_parallel_rank")
_TAGS: Final = "BlockStored, BlockRemoved, AllBlocksCleared"
# "<message> - at `$[1][0].block_size`": the message, then the path (absent for the root).
_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_STEP = re.compile(r"\[(\d+)\]|\.(\w+)")


def explain_decode_error(error: msgspec.DecodeError, release: str) -> WireFormatError:
    """A payload that is not exactly one msgpack value (truncated, trailing bytes, bad
    bytes)."""
    return WireFormatError(f"{release} payload is not one msgpack value: {error}")


def explain_validation_error(error: msgspec.ValidationError, release: str,
                             event_fields: dict[str, tuple[str, ...]],
                             map_form: bool, raw: object) -> WireFormatError:
    """A msgpack value that is not a ``KVEventBatch`` of ``release``.

    ``event_fields``: each event tag's fields in wire order (to name an array form's
    positions); ``map_form``: whether the release writes events as tagged maps; ``raw``: the
    payload decoded without a type (to read the tag of the event at fault).
    """
    match = _AT.match(str(error))
    assert match is not None  # the pattern matches any string
    msg, steps = match["msg"], [a or b for a, b in _STEP.findall(match["path"] or "")]
    if not steps:
        return WireFormatError(f"{release} batch must be the array [ts, events, "
                               f"data_parallel_rank]: {msg}")
    if steps[0] != "1" or len(steps) == 1:
        field = _BATCH_FIELDS[int(steps[0])] if steps[0].isdigit() else steps[0]
        return WireFormatError(f"{release} batch: {msg}", field=field)
    index = int(steps[1])
    if len(steps) == 2:
        return WireFormatError(_event_message(msg, release, map_form), event_index=index)
    field = _field_name(steps[2:], event_fields.get(_tag_of(raw, index), ()), map_form)
    if field in ("type", "[0]"):
        return WireFormatError(f"unknown event tag: {msg} (the {release} tags are {_TAGS})",
                               event_index=index, field="type")
    return WireFormatError(msg, event_index=index, field=field)


def _event_message(msg: str, release: str, map_form: bool) -> str:
    if map_form and "got `array`" in msg:
        return (f"{msg}: a tagged array, vLLM 0.10.2's event form; {release} writes tagged "
                "maps ({'type': 'BlockStored', ...}): decode it with release='vllm-0.10'")
    if not map_form and "got `object`" in msg:
        return (f"{msg}: a tagged map, vLLM 0.33's event form; {release} writes tagged "
                "arrays (['BlockStored', ...]): decode it with release='vllm-0.33'")
    if "missing required field `type`" in msg:
        return f"{msg} (the tag; the {release} tags are {_TAGS})"
    return msg


def _tag_of(raw: object, index: int) -> str:
    """The tag of event ``index`` in an untyped batch ('' when there is none)."""
    try:
        event = raw[1][index]  # type: ignore[index]
        tag = event.get("type") if isinstance(event, dict) else event[0]
    except (TypeError, IndexError, KeyError):
        return ""
    return tag if isinstance(tag, str) else ""


def _field_name(steps: list[str], fields: tuple[str, ...], map_form: bool) -> str:
    """``block_hashes[0]`` from ``["block_hashes", "0"]``; an array form's position is named
    by the field the event's tag puts there (``[4]`` of a ``BlockStored``: ``block_size``)."""
    head, rest = steps[0], "".join(f"[{s}]" if s.isdigit() else f".{s}" for s in steps[1:])
    if map_form or not head.isdigit():
        return head + rest
    position = int(head)
    if position == 0:
        return "[0]"
    name = fields[position - 1] if position <= len(fields) else f"[{position}]"
    return name + rest
