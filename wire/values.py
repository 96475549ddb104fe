"""Python values to the wire's JSON and back (docs/wire-protocol.md, "Values").

Out (``to_wire``), by value: bytes become lowercase hex, a ``KVCacheSpec`` its
``spec_to_dict`` form, other dataclasses an object of their fields, tuples arrays. In, by the
annotation of the parameter or result (``param_from_wire`` on the serving side,
``result_from_wire`` on kvcheck's side): the annotation says which strings are hex bytes and
which objects are requests, specs, contexts or sizing types.

Hashes inside events are the exception the annotations cannot see: in ``take_events`` answers a
hash is hex (bytes) or a JSON integer (an engine with integer hashes); in the batches
``apply_events`` sends, every hash is hex, an ``int``-form hash the 16 hex digits of its 8
big-endian bytes (no 64-bit integer meets a JSON number's 53-bit limit).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from kvcheck.conformance.indexer_protocol import IndexerConfig, MatchContext
from kvcheck.conformance.protocol import KVCacheSpec, RequestView, spec_from_dict, spec_to_dict
from kvcheck.conformance.sizing_protocol import (
    KVCacheTensorPlan,
    KVFeatureDefaults,
    KVModelFacts,
    KVSizingPlan,
    LayerKVSpec,
)
from kvcheck.wire.errors import WireValueError

__all__ = ["HASH_FIELDS", "WireValueError", "batch_to_wire", "events_from_wire",
           "param_from_wire", "result_from_wire", "to_wire"]

#: Event fields that hold block hashes (a list, or one hash).
HASH_FIELDS: Final = ("block_hashes", "parent_block_hash")


def to_wire(value: object) -> object:
    """``value`` as JSON-able data: bytes as hex, dataclasses as objects, tuples as lists."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, KVCacheSpec):
        return spec_to_dict(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_wire(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): to_wire(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, range)):
        return [to_wire(v) for v in value]
    if isinstance(value, (set, frozenset)):
        # Any: sorted as they come (a set of incomparable items raises, as a Python sort does)
        items: list[Any] = [to_wire(v) for v in value]
        return sorted(items)
    raise WireValueError(f"cannot send a {type(value).__name__} over the wire: {value!r:.80}")


def _hex(value: object, what: str) -> bytes:
    if not isinstance(value, str):
        raise WireValueError(f"{what}: expected a hex string, got {value!r:.80}")
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise WireValueError(f"{what}: not a hex string: {value!r:.80}") from None


def _hash_out(value: object) -> object:
    """One event hash kvcheck sends: hex of its bytes (an int: its 8 big-endian bytes)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 64:
        return value.to_bytes(8, "big").hex()
    return to_wire(value)


def batch_to_wire(batch: Mapping[str, object]) -> dict[str, object]:
    """A decoded batch for ``apply_events``: every hash as hex."""
    out = to_wire(batch)
    assert isinstance(out, dict)  # to_wire turns a Mapping into a dict
    raw_events = batch.get("events") or ()
    if not isinstance(raw_events, Iterable):  # then out's events are this same scalar, and
        raw_events = ()                       # zip fails on them first, as it always did
    for event, raw in zip(out.get("events") or (), raw_events, strict=False):
        if isinstance(event, dict) and isinstance(raw, Mapping):
            for key in HASH_FIELDS:
                if key in raw and isinstance(raw[key], (list, tuple)):
                    event[key] = [_hash_out(h) for h in raw[key]]
                elif key in raw and raw[key] is not None:
                    event[key] = _hash_out(raw[key])
    return out


def events_from_wire(events: object, what: str, *, int_hashes: bool = False) -> object:
    """Events as kvcheck reads them: hex hashes become bytes (``int_hashes``: the int of their
    bytes, for an index configured with ``hash_form="int"``); JSON integers stay ints; any
    other shape is left for the guard to name."""
    if not isinstance(events, list):
        return events

    def one(value: object, where: str) -> object:
        if isinstance(value, str):
            raw = _hex(value, where)
            return int.from_bytes(raw, "big") if int_hashes else raw
        return value

    for i, event in enumerate(events):
        if not isinstance(event, dict):
            continue
        for key in HASH_FIELDS:
            value = event.get(key)
            where = f"{what}: event {i} field {key!r}"
            if isinstance(value, list):
                event[key] = [one(h, where) for h in value]
            elif value is not None:
                event[key] = one(value, where)
    return events


# The converters below take a value as decoded from JSON and leave judging it to the
# dataclass it becomes: a field of the wrong shape raises there (TypeError, KeyError,
# AttributeError), which param_from_wire reports as a WireValueError. Hence the Any of the
# fields they forward: decoded JSON, checked by the dataclass, not here.
def _triples(value: Any) -> tuple[tuple[Any, ...], ...]:  # Any: decoded JSON (see above)
    return tuple(tuple(v) for v in value or ())


def _request(raw: Mapping[str, object]) -> RequestView:
    fields: dict[str, Any] = dict(raw)  # Any: decoded JSON (see above)
    fields["prompt_token_ids"] = tuple(fields.get("prompt_token_ids", ()))
    fields["output_token_ids"] = tuple(fields.get("output_token_ids", ()))
    if fields.get("lora") is not None:
        fields["lora"] = tuple(fields["lora"])
    fields["mm_features"] = _triples(fields.get("mm_features"))
    return RequestView(**fields)


def _context(raw: Mapping[str, Any]) -> MatchContext:  # Any: decoded JSON (see above)
    lora = raw.get("lora")
    return MatchContext(lora=tuple(lora) if lora is not None else None,
                        cache_salt=raw.get("cache_salt"),
                        mm_features=_triples(raw.get("mm_features")))


def _layer(raw: Mapping[str, object]) -> LayerKVSpec:
    fields: dict[str, Any] = dict(raw)  # Any: decoded JSON (see above)
    if "shapes" in fields:
        fields["shapes"] = tuple(tuple(s) for s in fields["shapes"])
    if "dtypes" in fields:
        fields["dtypes"] = tuple(fields["dtypes"])
    return LayerKVSpec(**fields)


def _plan(raw: object) -> KVSizingPlan:
    if not isinstance(raw, dict):
        raise WireValueError(f"a sizing plan is an object, got {raw!r:.80}")
    fields: dict[str, Any] = dict(raw)  # Any: decoded JSON (see above)
    fields["groups"] = tuple(tuple(g) for g in fields.get("groups", ()))
    fields["tensors"] = tuple(KVCacheTensorPlan(size=t["size"], shared_by=tuple(t["shared_by"]))
                              for t in fields.get("tensors", ()))
    return KVSizingPlan(**fields)


#: Parameter annotation -> how the serving side rebuilds the value (the rest: as it comes).
#: Any: each converter takes the decoded JSON its dataclass judges (see above).
_PARAMS: Final[dict[str, Callable[[Any], object]]] = {
    "RequestView": _request,
    "KVCacheSpec": spec_from_dict,
    "IndexerConfig": lambda raw: IndexerConfig(**raw),
    "MatchContext": _context,
    "LayerKVSpec": _layer,
    "Mapping[str, LayerKVSpec]": lambda raw: {k: _layer(v) for k, v in raw.items()},
    "Sequence[LayerKVSpec]": lambda raw: [_layer(v) for v in raw],
    "KVModelFacts": lambda raw: KVModelFacts(**raw),
    "bytes": lambda raw: _hex(raw, "bytes parameter"),
}


def param_from_wire(annotation: str, value: object) -> object:
    """A parameter as the serving side passes it to the implementation.

    Raises:
        WireValueError: (or the dataclass's ``TypeError``) the value does not fit.
    """
    convert = _PARAMS.get(annotation)
    if convert is None or value is None:
        return value
    try:
        return convert(value)
    except (TypeError, KeyError, AttributeError) as exc:
        raise WireValueError(f"not a {annotation}: {value!r:.120} ({exc})") from None


def result_from_wire(method: str, annotation: str, value: object, *,
                     int_hashes: bool = False) -> object:
    """A result as kvcheck reads it: hex to bytes where the method returns bytes, events' hashes
    to bytes, plans rebuilt, arrays to tuples where the method returns a tuple. A value of
    another shape is passed on unchanged for the guard to judge, except where bytes cannot be
    decoded (``WireValueError``, naming ``method``)."""
    if annotation == "bytes":
        return _hex(value, f"{method} answer")
    if annotation == "list[bytes]" and isinstance(value, list):
        return [_hex(v, f"{method} answer item {i}") for i, v in enumerate(value)]
    if annotation == "list[KVEvent]":
        return events_from_wire(value, f"{method} answer", int_hashes=int_hashes)
    if annotation == "KVSizingPlan":
        try:
            return _plan(value)
        except (TypeError, KeyError) as exc:
            raise WireValueError(f"{method} answer is not a sizing plan: {exc}") from None
    if annotation == "KVFeatureDefaults":
        if not isinstance(value, dict):
            raise WireValueError(f"{method} answer is not an object: {value!r:.80}")
        try:
            return KVFeatureDefaults(value["enable_prefix_caching"],
                                     value["enable_chunked_prefill"], tuple(value["reasons"]))
        except (TypeError, KeyError) as exc:
            raise WireValueError(f"{method} answer is not a KVFeatureDefaults: {exc}") from None
    if annotation.startswith("tuple[") and isinstance(value, list):
        return tuple(value)
    return value
