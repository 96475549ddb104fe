"""The reference offload tier refuses calls that vLLM's scheduler never makes (issue 30 item 6,
docs/bad-input.md#the-offload-tier): loads of absent or pending keys, completions of what was
never prepared (or twice), an offer that lists a key twice, keys of the wrong width or type,
new keys for a finished request, bad constructor arguments. Each refusal is an
``OffloadMisuseError`` naming the key (hex) and the rule, and changes nothing: a twin tier
that never saw the call answers every later call the same."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from kvcheck.errors import KVCheckInputError
from kvcheck.reference_impl.errors import KVCacheMisuseError, OffloadMisuseError
from kvcheck.reference_impl.offload_manager import CPUOffloadingManager
from kvcheck.reference_impl.offload_policy import ReqContext, make_offload_key

POLICIES = ("lru", "arc")
NUM_CHUNKS = 4
WIDTH = 36


def key(i: int, group: int = 0) -> bytes:
    """A 36-byte key: a 32-byte hash and a 4-byte group index."""
    return make_offload_key(bytes([i]) * 32, group)


#: Every key a scenario uses (K0..K3 in the tier, K4.. absent).
K = [key(i) for i in range(8)]
SHORT = key(9)[:-1]  # 35 bytes
LONG = key(9) + b"\x00"  # 37 bytes


@dataclass
class Tier:
    """A reference tier and its request contexts, in a known state.

    ``a`` stored and completed K0, K1, K2 (ready, positions 4, 8, 12) and finished; ``b``
    loaded K0 (pinned, ref_cnt 1) and is storing K3 (pending). Every chunk is in use.
    """

    m: CPUOffloadingManager
    ctx: dict[str, ReqContext] = field(default_factory=dict)

    def req(self, rid: str) -> ReqContext:
        if rid not in self.ctx:
            self.ctx[rid] = ReqContext(rid)
            self.m.on_new_request(self.ctx[rid])
        return self.ctx[rid]

    def store(self, keys: list[bytes], rid: str) -> list[bytes]:
        """Offer ``keys`` until the admission filter lets them through; the keys to store."""
        stored: list[bytes] = []
        for _ in range(self.m.store_threshold):
            out = self.m.prepare_store(keys, self.req(rid))
            assert out is not None
            stored = out.keys_to_store
        return stored


def tier(policy: str = "lru", threshold: int = 1) -> Tier:
    t = Tier(CPUOffloadingManager(NUM_CHUNKS, policy, enable_events=True,
                                  store_threshold=threshold, key_width=WIDTH))
    a = t.req("a")
    for i in range(3):
        a.set_offload_key_position(K[i], 4 * (i + 1))
    assert t.store(K[:3], "a") == K[:3]
    t.m.complete_store(K[:3], a)
    b = t.req("b")
    assert t.m.prepare_load([K[0]], b).block_ids == (0,)
    assert t.store([K[3]], "b") == [K[3]]
    t.m.on_request_finished(a)
    list(t.m.take_events())
    return t


def probe(t: Tier, offered: list[bytes]) -> list[Any]:
    """Everything observable, in a fixed order of calls: lookups, events, the answers of
    further stores (one key at a time: they show the eviction order, so the policy's state),
    of an offer of the keys the refused call named (the admission tracker's counts), of
    completing what is in flight, and the events of all of it."""
    m = t.m
    seen: list[Any] = [[m.lookup(k, t.req("probe")).name for k in K]]
    seen.append(list(m.take_events()))
    for rid in sorted(t.ctx):
        m.on_request_finished(t.ctx[rid])
    if offered:
        out = m.prepare_store(offered, t.req("offer"))
        seen.append(None if out is None else (out.keys_to_store, out.evicted_keys,
                                              out.store_spec.block_ids))
    for i in range(16, 16 + NUM_CHUNKS + 2):
        out = m.prepare_store([key(i)], t.req(f"p{i}"))
        seen.append(None if out is None else (out.keys_to_store, out.evicted_keys,
                                              out.store_spec.block_ids))
        if out is not None and out.keys_to_store:
            m.complete_store(out.keys_to_store, t.req(f"p{i}"))
    seen.append([m.lookup(k, t.req("probe")).name for k in K])
    for k in K:  # the pins: complete_load refuses a key once no load is in flight
        pins = 0
        while m.lookup(k, t.req("probe")).name == "HIT" and pins < 8:
            try:
                m.complete_load([k], t.req("b"))
            except OffloadMisuseError:
                break
            pins += 1
        seen.append((k, pins))
    seen.append(list(m.take_events()))
    return seen


def refused(make: Callable[[], Tier], prelude: Callable[[Tier], object],
            call: Callable[[Tier], object], words: list[str],
            offered: Sequence[bytes] = ()) -> str:
    """Run ``prelude`` on two identical tiers and the refused ``call`` on one: the error is
    an OffloadMisuseError containing ``words``, and the two tiers then answer alike."""
    hit, twin = make(), make()
    prelude(hit)
    prelude(twin)
    with pytest.raises(OffloadMisuseError) as info:
        call(hit)
    message = str(info.value)
    for word in words:
        assert word in message, message
    assert list(hit.m.take_events()) == list(twin.m.take_events())
    assert probe(hit, list(offered)) == probe(twin, list(offered))
    return message


def nothing(t: Tier) -> None:
    return None


def test_misuse_errors_are_input_errors() -> None:
    assert issubclass(OffloadMisuseError, KVCacheMisuseError)
    assert issubclass(OffloadMisuseError, KVCheckInputError)


def test_the_twin_probe_sees_a_change() -> None:
    """The probe is sharp: a call that is accepted (one more pin) makes the twins differ."""
    hit, twin = tier(), tier()
    hit.m.prepare_load([K[1]], hit.req("b"))
    assert probe(hit, []) != probe(twin, [])


# --- loads -----------------------------------------------------------------------------------

@pytest.mark.parametrize("policy", POLICIES)
def test_loading_an_absent_key_is_refused(policy: str) -> None:
    refused(lambda: tier(policy), nothing,
            lambda t: t.m.prepare_load([K[1], K[4]], t.req("b")),
            ["prepare_load: key " + K[4].hex(), "is absent",
             "only a key whose lookup is HIT can be loaded"])


@pytest.mark.parametrize("policy", POLICIES)
def test_loading_a_pending_key_is_refused(policy: str) -> None:
    refused(lambda: tier(policy), nothing,
            lambda t: t.m.prepare_load([K[1], K[3]], t.req("c")),
            ["prepare_load: key " + K[3].hex(), "still being written (ref_cnt -1)",
             "only a key whose lookup is HIT can be loaded"])


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(("keys", "bad", "ref_cnt"), [
    ([4], 4, "None"),  # absent
    ([1], 1, "0"),  # ready, never loaded
    ([3], 3, "-1"),  # pending
    ([0, 1], 1, "0"),  # one good key before the bad one: it stays pinned
    ([0, 0], 0, "1"),  # pinned once, completed twice in one call
])
def test_completing_a_load_never_prepared_is_refused(policy: str, keys: list[int], bad: int,
                                                     ref_cnt: str) -> None:
    refused(lambda: tier(policy), nothing,
            lambda t: t.m.complete_load([K[i] for i in keys], t.req("b")),
            [f"complete_load: key {K[bad].hex()} has no load in flight (ref_cnt {ref_cnt})",
             "complete only what prepare_load pinned, once"])


@pytest.mark.parametrize("policy", POLICIES)
def test_completing_a_load_twice_is_refused(policy: str) -> None:
    refused(lambda: tier(policy), lambda t: t.m.complete_load([K[0]], t.req("b")),
            lambda t: t.m.complete_load([K[0]], t.req("b")),
            [f"complete_load: key {K[0].hex()} has no load in flight (ref_cnt 0)",
             "complete only what prepare_load pinned, once"])


# --- stores ----------------------------------------------------------------------------------

@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(("keys", "bad", "state"), [
    ([4], 4, "absent"),  # never prepared
    ([1], 1, "ready (ref_cnt 0)"),  # already completed
    ([0], 0, "ready (ref_cnt 1)"),  # completed and now pinned by a load
    ([3, 1], 1, "ready (ref_cnt 0)"),  # a pending key before the bad one: it stays pending
])
@pytest.mark.parametrize("success", [True, False])
def test_completing_a_store_never_prepared_is_refused(policy: str, keys: list[int], bad: int,
                                                      state: str, success: bool) -> None:
    refused(lambda: tier(policy), nothing,
            lambda t: t.m.complete_store([K[i] for i in keys], t.req("b"), success),
            [f"complete_store: key {K[bad].hex()} is {state}, not being written",
             "complete only the keys_to_store of a prepare_store, once"])


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("success", [True, False])
def test_completing_a_store_twice_is_refused(policy: str, success: bool) -> None:
    state = "ready (ref_cnt 0)" if success else "absent"
    refused(lambda: tier(policy), lambda t: t.m.complete_store([K[3]], t.req("b"), success),
            lambda t: t.m.complete_store([K[3]], t.req("b"), success),
            [f"complete_store: key {K[3].hex()} is {state}, not being written",
             "complete only the keys_to_store of a prepare_store, once"])


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("threshold", [1, 2])
def test_an_offer_listing_a_key_twice_is_refused(policy: str, threshold: int) -> None:
    """Nothing is stored, evicted or counted by the admission filter (``offered``: the twins
    then answer the same offer alike)."""
    refused(lambda: tier(policy, threshold), nothing,
            lambda t: t.m.prepare_store([K[4], K[5], K[4]], t.req("c")),
            [f"prepare_store: key {K[4].hex()} is offered twice in one call",
             "an offer lists each key once"], offered=[K[4], K[5]])


# --- keys of the wrong width or type ---------------------------------------------------------

CALLS: dict[str, Callable[[Tier, list[Any]], object]] = {
    "lookup": lambda t, keys: [t.m.lookup(k, t.req("b")) for k in keys],
    "prepare_load": lambda t, keys: t.m.prepare_load(keys, t.req("b")),
    "touch": lambda t, keys: t.m.touch(keys, t.req("b")),
    "complete_load": lambda t, keys: t.m.complete_load(keys, t.req("b")),
    "prepare_store": lambda t, keys: t.m.prepare_store(keys, t.req("c")),
    "complete_store": lambda t, keys: t.m.complete_store(keys, t.req("b")),
}
#: A valid key each call accepts, listed before the bad one (it must not take effect).
GOOD = {"lookup": [], "prepare_load": [K[1]], "touch": [K[1], K[2]], "complete_load": [K[0]],
        "prepare_store": [K[4]], "complete_store": [K[3]]}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize("bad", [SHORT, LONG, b""], ids=["35-bytes", "37-bytes", "empty"])
def test_keys_of_the_wrong_width_are_refused(policy: str, call: str, bad: bytes) -> None:
    refused(lambda: tier(policy, 2 if call == "prepare_store" else 1), nothing,
            lambda t: CALLS[call](t, [*GOOD[call], bad]),
            [f"{call}: key {bad.hex()} is {len(bad)} bytes",
             "this tier's keys are 36 (a block hash and a 4-byte group index)"], offered=[K[4]])


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize(("bad", "kind"), [
    (K[1].hex(), "str"), (7, "int"), (bytearray(K[1]), "bytearray"), (None, "NoneType"),
    ((1, 2), "tuple")], ids=["str", "int", "bytearray", "None", "tuple"])
def test_keys_that_are_not_bytes_are_refused(policy: str, call: str, bad: object,
                                             kind: str) -> None:
    refused(lambda: tier(policy, 2 if call == "prepare_store" else 1), nothing,
            lambda t: CALLS[call](t, [*GOOD[call], bad]),
            [f"{call}: key {bad!r} is a {kind}",
             "keys are bytes (block hash + 4-byte group index)"], offered=[K[4]])


def test_any_width_is_accepted_without_key_width() -> None:
    m = CPUOffloadingManager(2, key_width=None)
    ctx = ReqContext("a")
    out = m.prepare_store([b"x", SHORT], ctx)
    assert out is not None and out.keys_to_store == [b"x", SHORT]


# --- a finished request ----------------------------------------------------------------------

@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("threshold", [1, 2])
def test_storing_new_keys_for_a_finished_request_is_refused(policy: str,
                                                            threshold: int) -> None:
    refused(lambda: tier(policy, threshold), nothing,
            lambda t: t.m.prepare_store([K[1], K[4]], t.req("a")),
            [("prepare_store: request 'a' finished (on_request_finished) but key "
              f"{K[4].hex()} is new to it"),
             "no prepare_load or prepare_store follows a request's end"], offered=[K[4]])


@pytest.mark.parametrize("policy", POLICIES)
def test_loading_new_keys_for_a_finished_request_is_refused(policy: str) -> None:
    refused(lambda: tier(policy), lambda t: t.m.on_request_finished(t.req("b")),
            lambda t: t.m.prepare_load([K[0], K[1]], t.req("b")),
            [("prepare_load: request 'b' finished (on_request_finished) but key "
              f"{K[1].hex()} is new to it"),
             "no prepare_load or prepare_store follows a request's end"])


@pytest.mark.parametrize("policy", POLICIES)
def test_a_finished_request_may_still_reuse_its_keys_and_complete(policy: str) -> None:
    """What is not new to a finished request stays allowed, and so do completions."""
    t = tier(policy)
    a, b = t.req("a"), t.req("b")
    assert t.m.prepare_load([K[1]], a).block_ids == (1,)
    out = t.m.prepare_store([K[2]], a)
    assert out is not None and out.keys_to_store == []
    t.m.on_request_finished(b)
    t.m.complete_store([K[3]], b)
    t.m.complete_load([K[0]], b)
    t.m.complete_load([K[1]], a)
    assert [t.m.lookup(k, a).name for k in K[:5]] == ["HIT"] * 4 + ["MISS"]


# --- construction ----------------------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "words"), [
    ({"num_chunks": -1}, "num_chunks=-1: the tier's size must be an int >= 0"),
    ({"num_chunks": 2.0}, "num_chunks=2.0: the tier's size must be an int >= 0"),
    ({"num_chunks": True}, "num_chunks=True: the tier's size must be an int >= 0"),
    ({"cache_policy": "fifo"}, "unknown cache_policy 'fifo': use one of ['arc', 'lru']"),
    ({"cache_policy": "LRU"}, "unknown cache_policy 'LRU': use one of ['arc', 'lru']"),
    ({"store_threshold": 0},
     "store_threshold=0, max_tracker_size=64000: both must be ints >= 1"),
    ({"store_threshold": -2}, "store_threshold=-2"),
    ({"store_threshold": 1.5}, "store_threshold=1.5"),
    ({"max_tracker_size": 0}, "store_threshold=1, max_tracker_size=0: both must be ints >= 1"),
])
def test_bad_constructor_arguments_are_refused(kwargs: dict[str, Any], words: str) -> None:
    args: dict[str, Any] = {"num_chunks": 4, **kwargs}
    with pytest.raises(OffloadMisuseError) as info:
        CPUOffloadingManager(**args)
    assert words in str(info.value), str(info.value)
