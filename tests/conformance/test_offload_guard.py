"""The offload tier's answer guard (kvcheck.conformance.offload_guard, issue 30 item 6): every
rule of its docstring, broken by a tier that wraps the reference and answers one call wrongly,
raises ProtocolViolation naming the call, its arguments, the answer and the rule; a
well-behaved tier passes untouched, and what a tier raises passes through unchanged."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from kvcheck.adapters.offload_tier import OffloadTier
from kvcheck.adapters.reference import make_offloading_manager
from kvcheck.conformance.call_limit import AdapterTimeout, CallLimit
from kvcheck.conformance.guard import ProtocolViolation
from kvcheck.conformance.offload_guard import GuardedOffloadingManager
from kvcheck.conformance.offload_protocol import EVENT_FIELDS, OffloadSpec
from kvcheck.reference_impl.errors import OffloadMisuseError
from kvcheck.reference_impl.offload_manager import LookupResult
from kvcheck.reference_impl.offload_policy import make_offload_key

SPEC = OffloadSpec(num_chunks=4)
K = [make_offload_key(bytes([i]) * 32, 0) for i in range(8)]

#: ``change(answer, *args)``: the wrong answer a broken tier gives instead of the reference's.
Change = Callable[..., Any]


class Tier:
    """The reference tier (``kvcheck.adapters.reference.make_offloading_manager``), with the
    answers of the methods named in ``changes`` replaced by ``change(answer, *args)``."""

    def __init__(self, **changes: Change) -> None:
        self.inner: OffloadTier = make_offloading_manager(SPEC)
        self.changes = changes

    def __getattr__(self, name: str) -> Any:
        real = getattr(self.inner, name)
        change = self.changes.get(name)
        if change is None:
            return real

        def wrong(*args: Any) -> Any:
            return change(real(*args), *args)

        return wrong


def guarded(raw: Any, limit: float | None = None) -> GuardedOffloadingManager:
    return GuardedOffloadingManager(raw, impl="fake", spec=SPEC, limit=CallLimit(limit, "fake"))


def drive(tier: Any) -> list[Any]:
    """Every call of the protocol, in an order vLLM's scheduler makes them: ``a`` stores K0..K2
    (positions 4, 8, 12), loads K0 and finishes; ``b`` offers K3, K4 (one eviction). The
    answers, in order."""
    seen: list[Any] = []
    tier.on_new_request("a")
    tier.set_key_positions("a", {K[0]: 4, K[1]: 8, K[2]: 12})
    seen.append(tier.lookup(K[0], "a"))
    out = tier.prepare_store([K[0], K[1], K[2]], "a")
    seen.append(out)
    tier.complete_store(out["keys_to_store"], "a")
    seen.append(tier.take_events())
    seen.append(tier.lookup(K[0], "a"))
    seen.append(tier.prepare_load([K[0]], "a"))
    tier.touch([K[1]], "a")
    tier.complete_load([K[0]], "a")
    tier.on_request_finished("a")
    tier.on_new_request("b")
    out = tier.prepare_store([K[3], K[4]], "b")
    seen.append(out)
    seen.append(tier.lookup(K[3], "b"))
    tier.complete_store(out["keys_to_store"], "b", False)
    seen.append(tier.take_events())
    tier.on_request_finished("b")
    tier.reset_cache()
    seen.append([tier.lookup(k, "b") for k in K[:5]])
    return seen


def violation(tier: Tier, method: str, rule: str) -> str:
    """``drive`` through the guard fails at ``method`` with ``rule``; the message."""
    with pytest.raises(ProtocolViolation) as info:
        drive(guarded(tier))
    message = str(info.value)
    assert message.startswith(f"fake.{method}("), message
    assert message.endswith(f": {rule}"), message
    return message


# --- a well-behaved tier -----------------------------------------------------------------------

def test_a_well_behaved_tier_passes_untouched() -> None:
    answers = drive(guarded(Tier()))
    assert answers == drive(make_offloading_manager(SPEC))
    assert answers[1] == {"keys_to_store": K[:3], "evicted_keys": [], "chunk_ids": [0, 1, 2]}
    assert answers[5]["evicted_keys"] == [K[2]]  # LRU: the tail of a's prefix goes first
    assert answers[2][0]["keys"] == K[:3] and set(answers[2][0]) == set(EVENT_FIELDS)


@pytest.mark.parametrize(("method", "change"), [
    ("prepare_load", lambda out, keys, rid: None),  # a tier without slots
    ("prepare_store", lambda out, keys, rid: {**out, "chunk_ids": None}),
    ("prepare_store", lambda out, keys, rid: {k: v for k, v in out.items() if k != "chunk_ids"}),
    ("take_events", lambda out: []),  # events disabled
])
def test_the_optional_forms_are_accepted(method: str, change: Change) -> None:
    drive(guarded(Tier(**{method: change})))


def test_prepare_store_may_answer_none() -> None:
    tier = guarded(Tier(prepare_store=lambda out, keys, rid: None))
    assert tier.prepare_store([K[0]], "a") is None


def test_the_guard_hands_each_call_a_copy_of_the_keys() -> None:
    """A tier that changes the key list it was given changes nothing of the driver's, and its
    answer is judged against the offer as the driver made it."""
    def clears(out: Any, keys: list[bytes], *rest: object) -> Any:
        keys.clear()
        return out

    tier = guarded(Tier(prepare_store=clears, prepare_load=clears, touch=clears,
                        complete_load=clears, complete_store=clears))
    offer = [K[0], K[1]]
    tier.on_new_request("a")
    assert tier.prepare_store(offer, "a") == {"keys_to_store": offer, "evicted_keys": [],
                                              "chunk_ids": [0, 1]}
    tier.complete_store(offer, "a")
    assert tier.prepare_load(offer, "a") == [0, 1]
    tier.touch(offer, "a")
    tier.complete_load(offer, "a")
    assert offer == [K[0], K[1]]


def test_what_a_tier_raises_passes_through_unchanged() -> None:
    """The reference's misuse errors (and any other) are not protocol violations."""
    tier = guarded(Tier())
    tier.on_new_request("a")
    with pytest.raises(OffloadMisuseError, match=f"prepare_load: key {K[5].hex()} is absent"):
        tier.prepare_load([K[5]], "a")

    def boom(out: Any, key: bytes, rid: str) -> Any:
        raise ZeroDivisionError("the tier broke")

    with pytest.raises(ZeroDivisionError, match="the tier broke"):
        guarded(Tier(lookup=boom)).lookup(K[0], "a")


def test_a_hanging_call_fails_with_the_call_named() -> None:
    def hangs(out: Any, key: bytes, rid: str) -> Any:
        time.sleep(60)

    with pytest.raises(AdapterTimeout, match=r"fake\.lookup\("):
        guarded(Tier(lookup=hangs), limit=0.3).lookup(K[0], "a")


# --- lookup ------------------------------------------------------------------------------------

LOOKUP_RULE = "must be one of ['MISS', 'HIT', 'HIT_PENDING', 'RETRY']"


@pytest.mark.parametrize("answer", ["PRESENT", "hit", "", None, 1, LookupResult.HIT, b"HIT"],
                         ids=["unknown", "lowercase", "empty", "None", "int", "enum", "bytes"])
def test_lookup_answers_one_of_the_results(answer: object) -> None:
    message = violation(Tier(lookup=lambda out, key, rid: answer), "lookup", LOOKUP_RULE)
    assert message.startswith("fake.lookup(b'") and f"'a') returned {answer!r}" in message, \
        message


# --- prepare_load ------------------------------------------------------------------------------

@pytest.mark.parametrize("change", [
    lambda out, keys, rid: [],
    lambda out, keys, rid: [*out, 7],
    lambda out, keys, rid: tuple(out),
    lambda out, keys, rid: [str(i) for i in out],
    lambda out, keys, rid: [True for _ in out],
    lambda out, keys, rid: [float(i) for i in out],
    lambda out, keys, rid: {"block_ids": out},
], ids=["too-few", "too-many", "tuple", "str", "bool", "float", "dict"])
def test_prepare_load_answers_none_or_one_int_slot_per_key(change: Change) -> None:
    violation(Tier(prepare_load=change), "prepare_load",
              "must be None or one int slot per key (1)")


# --- prepare_store -----------------------------------------------------------------------------

FORM = "must be None or a dict with keys_to_store, evicted_keys and chunk_ids"


def _without(name: str) -> Change:
    return lambda out, keys, rid: {k: v for k, v in out.items() if k != name}


def _with(name: str, value: Callable[[Any, list[bytes]], Any]) -> Change:
    return lambda out, keys, rid: {**out, name: value(out, keys)}


@pytest.mark.parametrize(("change", "rule"), [
    (lambda out, keys, rid: list(out["keys_to_store"]), FORM),
    (lambda out, keys, rid: True, FORM),
    (_without("keys_to_store"), FORM),
    (_without("evicted_keys"), FORM),
    (_with("keys_to_store", lambda out, keys: tuple(out["keys_to_store"])),
     "keys_to_store must be a list of bytes keys"),
    (_with("keys_to_store", lambda out, keys: [k.hex() for k in keys]),
     "keys_to_store must be a list of bytes keys"),
    (_with("keys_to_store", lambda out, keys: [keys[0], keys[0]]),
     "keys_to_store lists a key twice"),
    (_with("evicted_keys", lambda out, keys: None), "evicted_keys must be a list of bytes keys"),
    (_with("evicted_keys", lambda out, keys: [bytearray(K[7])]),
     "evicted_keys must be a list of bytes keys"),
    (_with("evicted_keys", lambda out, keys: [K[7], K[7]]), "evicted_keys lists a key twice"),
    (_with("keys_to_store", lambda out, keys: [*out["keys_to_store"], K[7]]),
     "keys_to_store must be keys of the offer, in offer order"),
    (_with("keys_to_store", lambda out, keys: out["keys_to_store"][::-1]),
     "keys_to_store must be keys of the offer, in offer order"),
    (_with("evicted_keys", lambda out, keys: [keys[1]]),
     (f"evicted key {K[1].hex()} of the same offer (a key offered for storing is never "
      "evicted to make room)")),
    (_with("chunk_ids", lambda out, keys: out["chunk_ids"][:-1]),
     "chunk_ids must be None or one int slot per key to store"),
    (_with("chunk_ids", lambda out, keys: tuple(out["chunk_ids"])),
     "chunk_ids must be None or one int slot per key to store"),
    (_with("chunk_ids", lambda out, keys: [str(i) for i in out["chunk_ids"]]),
     "chunk_ids must be None or one int slot per key to store"),
    (_with("chunk_ids", lambda out, keys: [i == 0 for i in out["chunk_ids"]]),
     "chunk_ids must be None or one int slot per key to store"),
], ids=["list", "bool", "no-keys_to_store", "no-evicted_keys", "to-store-tuple",
        "to-store-str", "to-store-twice", "evicted-None", "evicted-bytearray", "evicted-twice",
        "to-store-not-offered", "to-store-out-of-order", "evicted-offered", "chunk-ids-short",
        "chunk-ids-tuple", "chunk-ids-str", "chunk-ids-bool"])
def test_prepare_store_answers_the_store_form(change: Change, rule: str) -> None:
    violation(Tier(prepare_store=change), "prepare_store", rule)


def test_an_evicted_key_of_the_offer_is_named_when_eviction_is_real() -> None:
    """At ``b``'s offer (the tier full) a tier that evicts the offered K3 instead of K2."""
    def evicts_offered(out: Any, keys: list[bytes], rid: str) -> Any:
        return {**out, "evicted_keys": [keys[0]]} if out["evicted_keys"] else out

    message = violation(Tier(prepare_store=evicts_offered), "prepare_store",
                        f"evicted key {K[3].hex()} of the same offer (a key offered for "
                        "storing is never evicted to make room)")
    assert "'b') returned {'keys_to_store':" in message, message


# --- take_events -------------------------------------------------------------------------------

_DROP = object()


def _event(**fields: Any) -> Change:
    """take_events' answer with the first event's ``fields`` replaced (``_DROP``: left out)."""
    def change(out: list[dict[str, Any]]) -> Any:
        if not out:
            return out
        first = {k: v for k, v in {**out[0], **fields}.items() if v is not _DROP}
        return [first, *out[1:]]
    return change


EXACT = f"each event is a dict with exactly the fields {list(EVENT_FIELDS)}"
BOOLS = "an event's removed, removal_expected, metadata_only are bools"


@pytest.mark.parametrize(("change", "rule"), [
    (lambda out: None, "must be a list of event dicts"),
    (tuple, "must be a list of event dicts"),
    (iter, "must be a list of event dicts"),
    (lambda out: [tuple(out[0].values())], EXACT),
    (_event(medium=_DROP), EXACT),
    (_event(block_size=16), EXACT),
    (_event(keys=[]), "an event's keys are a non-empty list of bytes"),
    (_event(keys=tuple(K[:3])), "an event's keys are a non-empty list of bytes"),
    (_event(keys=[k.hex() for k in K[:3]]), "an event's keys are a non-empty list of bytes"),
    (_event(medium=None), "an event's medium is a str (e.g. 'CPU')"),
    (_event(medium=LookupResult.HIT), "an event's medium is a str (e.g. 'CPU')"),
    (_event(removed=0), BOOLS),
    (_event(removal_expected=None), BOOLS),
    (_event(metadata_only="no"), BOOLS),
    (_event(locality=0), "an event's locality and ownership are str or None"),
    (_event(ownership=b"me"), "an event's locality and ownership are str or None"),
], ids=["None", "tuple", "iterator", "event-tuple", "missing-field", "extra-field",
        "no-keys", "keys-tuple", "keys-str", "medium-None", "medium-enum", "removed-int",
        "removal_expected-None", "metadata_only-str", "locality-int", "ownership-bytes"])
def test_take_events_answers_event_dicts(change: Change, rule: str) -> None:
    violation(Tier(take_events=change), "take_events", rule)


def test_events_in_vllms_form_pass() -> None:
    tier = guarded(Tier())
    tier.on_new_request("a")
    out = tier.prepare_store([K[0]], "a")
    assert out is not None
    tier.complete_store(out["keys_to_store"], "a")
    events = tier.take_events()
    assert events == [{"keys": [K[0]], "medium": "CPU", "removed": False, "locality": None,
                       "ownership": None, "removal_expected": False, "metadata_only": False}]


# --- calls that answer nothing ----------------------------------------------------------------

@pytest.mark.parametrize(("method", "answer"), [
    ("on_new_request", True),
    ("set_key_positions", {}),
    ("touch", []),
    ("complete_load", 0),
    ("complete_store", True),
    ("on_request_finished", "done"),
    ("reset_cache", False),
])
def test_every_other_call_returns_none(method: str, answer: object) -> None:
    message = violation(Tier(**{method: lambda out, *args: answer}), method, "must return None")
    assert f") returned {answer!r}: must return None" in message, message


def test_reset_cache_violation_shows_no_arguments() -> None:
    with pytest.raises(ProtocolViolation) as info:
        guarded(Tier(reset_cache=lambda out: 0)).reset_cache()
    assert str(info.value) == "fake.reset_cache() returned 0: must return None"
