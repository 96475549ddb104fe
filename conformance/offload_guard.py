"""Answer validation for offload tiers: every call runs under the handle's call limit
(``--kv-timeout``) and every answer is checked for its form before a law or an oracle looks at
it (``kvcheck.conformance.offload_protocol``).

Rules (a broken one raises ``ProtocolViolation`` naming the call, its arguments, the answer
and the rule):

* ``lookup`` returns one of ``LOOKUP_RESULTS`` (a ``str``);
* ``prepare_load`` returns None or one ``int`` slot per key;
* ``prepare_store`` returns None or a dict with ``keys_to_store`` and ``evicted_keys`` (lists
  of ``bytes``, each key once) and ``chunk_ids`` (None, or one ``int`` per key to store);
  ``keys_to_store`` lists keys of the offer, in offer order; no evicted key is offered;
* ``take_events`` returns a list of dicts with exactly ``EVENT_FIELDS``: ``keys`` a non-empty
  list of ``bytes``, ``medium`` a ``str``, ``removed`` / ``removal_expected`` /
  ``metadata_only`` ``bool``, ``locality`` / ``ownership`` ``str`` or None;
* every other call returns None.

The guard hands each call a private copy of its key lists, and the caller copies of the lists
in each answer, so a tier that keeps or changes either cannot change the driver's. An exception
a tier raises passes through unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict, cast

from kvcheck.conformance.call_limit import CallLimit, arg_text
from kvcheck.conformance.guard import ProtocolViolation
from kvcheck.conformance.offload_protocol import (
    EVENT_FIELDS,
    LOOKUP_RESULTS,
    OffloadSpec,
    StoreAnswer,
)
from kvcheck.conformance.short_repr import short_repr

__all__ = ["GuardedOffloadingManager"]

_BOOL_FIELDS = ("removed", "removal_expected", "metadata_only")


class OffloadEvent(TypedDict):
    """One event as the guard hands it on: exactly ``EVENT_FIELDS``, ``keys`` checked (a
    non-empty list of bytes), the other fields as the tier gave them."""

    keys: list[bytes]
    medium: object
    removed: object
    locality: object
    ownership: object
    removal_expected: object
    metadata_only: object


class GuardedOffloadingManager:
    """An offload tier whose every call is limited and every answer's form validated."""

    # Any: the implementation's tier, whose methods are looked up by name; their answers are
    # checked as they come back.
    def __init__(self, raw: Any, *, impl: str, spec: OffloadSpec, limit: CallLimit) -> None:
        self.raw = raw
        self.impl = impl
        self.spec = spec
        self._limit = limit

    def __repr__(self) -> str:
        return f"<GuardedOffloadingManager of {self.raw!r}>"

    def _violation(self, method: str, args: Sequence[object], value: object,
                   rule: str) -> ProtocolViolation:
        shown = ", ".join(arg_text(a) for a in args)
        return ProtocolViolation(f"{self.impl}.{method}({shown}) returned "
                                 f"{short_repr(value)}: {rule}")

    def _call(self, method: str, *args: object) -> object:
        return self._limit.call(method, getattr(self.raw, method), *args)

    def _none(self, method: str, *args: object) -> None:
        value = self._call(method, *args)
        if value is not None:
            raise self._violation(method, args, value, "must return None")

    def _keys(self, method: str, args: Sequence[object], value: object, what: str,
              keys: object) -> list[bytes]:
        if not isinstance(keys, list) or not all(isinstance(k, bytes) for k in keys):
            raise self._violation(method, args, value, f"{what} must be a list of bytes keys")
        if len(set(keys)) != len(keys):
            raise self._violation(method, args, value, f"{what} lists a key twice")
        return keys

    # --- calls -----------------------------------------------------------------------------

    def on_new_request(self, req_id: str) -> None:
        self._none("on_new_request", req_id)

    def set_key_positions(self, req_id: str, positions: Mapping[bytes, int]) -> None:
        self._none("set_key_positions", req_id, dict(positions))

    def lookup(self, key: bytes, req_id: str) -> str:
        value = self._call("lookup", key, req_id)
        if not isinstance(value, str) or value not in LOOKUP_RESULTS:
            raise self._violation("lookup", (key, req_id), value,
                                  f"must be one of {list(LOOKUP_RESULTS)}")
        return value

    def prepare_load(self, keys: Sequence[bytes], req_id: str) -> list[int] | None:
        args = (list(keys), req_id)
        value = self._call("prepare_load", list(keys), req_id)
        if value is not None and (not isinstance(value, list) or len(value) != len(keys)
                                  or any(type(i) is not int for i in value)):
            raise self._violation("prepare_load", args, value,
                                  f"must be None or one int slot per key ({len(keys)})")
        return None if value is None else list(value)

    def touch(self, keys: Sequence[bytes], req_id: str) -> None:
        self._none("touch", list(keys), req_id)

    def complete_load(self, keys: Sequence[bytes], req_id: str) -> None:
        self._none("complete_load", list(keys), req_id)

    def prepare_store(self, keys: Sequence[bytes], req_id: str) -> StoreAnswer | None:
        args = (list(keys), req_id)
        value = self._call("prepare_store", list(keys), req_id)
        if value is None:
            return None
        if not isinstance(value, Mapping) or not {"keys_to_store", "evicted_keys"} <= set(value):
            raise self._violation("prepare_store", args, value,
                                  "must be None or a dict with keys_to_store, evicted_keys "
                                  "and chunk_ids")
        to_store = self._keys("prepare_store", args, value, "keys_to_store",
                              value["keys_to_store"])
        evicted = self._keys("prepare_store", args, value, "evicted_keys",
                             value["evicted_keys"])
        position = {key: i for i, key in enumerate(keys)}
        places = [position.get(key, -1) for key in to_store]
        if -1 in places or places != sorted(places):
            raise self._violation("prepare_store", args, value,
                                  "keys_to_store must be keys of the offer, in offer order")
        offered = [key for key in evicted if key in position]
        if offered:
            raise self._violation("prepare_store", args, value,
                                  f"evicted key {offered[0].hex()} of the same offer (a key "
                                  "offered for storing is never evicted to make room)")
        chunk_ids = value.get("chunk_ids")
        if chunk_ids is not None and (not isinstance(chunk_ids, list)
                                      or len(chunk_ids) != len(to_store)
                                      or any(type(i) is not int for i in chunk_ids)):
            raise self._violation("prepare_store", args, value,
                                  "chunk_ids must be None or one int slot per key to store")
        return {"keys_to_store": list(to_store), "evicted_keys": list(evicted),
                "chunk_ids": None if chunk_ids is None else list(chunk_ids)}

    def complete_store(self, keys: Sequence[bytes], req_id: str, success: bool = True) -> None:
        self._none("complete_store", list(keys), req_id, success)

    def on_request_finished(self, req_id: str) -> None:
        self._none("on_request_finished", req_id)

    def reset_cache(self) -> None:
        self._none("reset_cache")

    def take_events(self) -> list[OffloadEvent]:
        value = self._call("take_events")
        if not isinstance(value, list):
            raise self._violation("take_events", (), value, "must be a list of event dicts")
        for event in value:
            rule = _event_problem(event)
            if rule:
                raise self._violation("take_events", (), value, rule)
        # _event_problem passed for each: exactly EVENT_FIELDS, keys a list of bytes.
        return [cast("OffloadEvent", {**event, "keys": list(event["keys"])}) for event in value]


def _event_problem(event: object) -> str | None:
    """What is wrong with one event dict's form, or None."""
    if not isinstance(event, Mapping) or set(event) != set(EVENT_FIELDS):
        return f"each event is a dict with exactly the fields {list(EVENT_FIELDS)}"
    keys = event["keys"]
    if not isinstance(keys, list) or not keys or not all(isinstance(k, bytes) for k in keys):
        return "an event's keys are a non-empty list of bytes"
    if not isinstance(event["medium"], str):
        return "an event's medium is a str (e.g. 'CPU')"
    if any(type(event[name]) is not bool for name in _BOOL_FIELDS):
        return f"an event's {', '.join(_BOOL_FIELDS)} are bools"
    if any(event[name] is not None and not isinstance(event[name], str)
           for name in ("locality", "ownership")):
        return "an event's locality and ownership are str or None"
    return None
