"""Lengths before elements (issue 23 item 3): every list answer the guard checks is refused at
once when it is longer than a correct answer can be, naming its length and the bound, and
nothing on the failure path shows or stores a flooding answer in full."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from kv_helpers import reference_capabilities_source

from kvcheck.conformance.call_limit import CallLimit
from kvcheck.conformance.guard import GuardedBlockPool, GuardedManager, ProtocolViolation
from kvcheck.conformance.protocol import KVCacheGroupSpec, KVCacheSpec, RequestView
from kvcheck.conformance.short_repr import short_repr

SPEC = KVCacheSpec(num_blocks=8, block_size=4)
HYBRID = KVCacheSpec(num_blocks=16, block_size=2, enable_caching=False,
                     kv_cache_groups=(KVCacheGroupSpec("full_attention", 2),
                                      KVCacheGroupSpec("sliding_window", 2, sliding_window=4)))
FLOOD = 10**7
#: One id ten million times: 80 MB of pointers to one int (the answers below share it).
IDS = [5] * FLOOD


class Answers:
    """A manager whose every method returns what the test put in ``answers``."""

    def __init__(self, **answers: Any) -> None:
        self.answers = answers

    def __getattr__(self, name: str) -> Any:
        answers = self.__dict__["answers"]
        if name not in answers:
            raise AttributeError(name)
        return lambda *args, **kwargs: answers[name]


def view(rid: str = "a", n: int = 9) -> RequestView:
    return RequestView(rid, tuple(range(n)))


def guarded(spec: KVCacheSpec, **answers: Any) -> GuardedManager:
    return GuardedManager(Answers(**answers), impl="flood", spec=spec, reserved=(0,),
                          limit=CallLimit(5, "flood"))


def refused(call: Any, rule: str) -> str:
    """``call()`` raises ProtocolViolation matching ``rule`` within a second; the message."""
    start = time.perf_counter()
    with pytest.raises(ProtocolViolation, match=rule) as info:
        call()
    assert time.perf_counter() - start < 1.0, "the length is checked before the elements"
    message = str(info.value)
    assert len(message) < 1000, "the answer is shown abbreviated"
    return message


@pytest.mark.parametrize(("method", "args", "answer", "rule"), [
    ("get_block_ids", ("a",), IDS,
     (r"the block table: 10000000 entries, more than the 8 possible \(distinct block ids of a "
     r"pool of num_blocks=8\)")),
    ("free_block_ids", (), IDS, r"the free queue: 10000000 entries, more than the 8 possible"),
    ("get_computed_blocks", (view(),), (IDS, 4),
     r"the hit block ids: 10000000 entries, more than the 8 possible"),
    ("allocate_slots", (view(), 9), tuple(IDS),
     r"the new block ids: 10000000 entries, more than the 8 possible"),
    ("block_hashes", ("a",), [b"h"] * FLOOD,
     (r"the block hashes: 10000000 entries, more than the 32 possible \(at most one per token "
     r"of the pool, 32, or of the longest request passed in so far, 0\)")),
    ("take_events", (), [{"type": "BlockStored"}] * FLOOD,
     (r"the events: 10000000 entries, more than the 10 possible \(10 per state-changing call, "
     r"0 since the last take_events, plus one\)")),
    ("take_events", (), [{"type": "BlockStored", "token_ids": IDS}],
     (r"field 'token_ids' of a 'BlockStored' event: 10000000 entries, more than the 32 "
     r"possible \(the tokens of the whole pool")),
    ("take_events", (), [{"type": "BlockStored", **{f"f{i}": 0 for i in range(100)}}],
     r"an event has 101 fields, more than the 64 an event can have"),
    ("slot_mapping", ("a", 0, 4), IDS,
     r"the slot mapping: 10000000 entries, more than the 4 possible \(one slot per position"),
    ("build_batch", ([[1]], [0], [4], 4), (IDS, [0], [0]),
     r"slot_mapping: 10000000 entries, more than the 4 possible \(num_padded_tokens=4\)"),
    ("build_batch", ([[1]], [0], [4], 4), ([1, 2, 3, 4], IDS, [0]),
     r"positions: 10000000 entries, more than the 4 possible \(one per scheduled token, 4\)"),
    ("flashinfer_csr", ([[1, 2]], [5]), ([0, 2], IDS, [1]),
     r"kv_indices: 10000000 entries, more than the 2 possible"),
    ("flashinfer_csr", ([[1, 2]], [5]), (IDS, [1, 2], [1]),
     r"kv_indptr: 10000000 entries, more than the 2 possible \(len\(seq_lens\) \+ 1 = 2\)"),
    ("req_to_token", ([[1]], [3]), [[4]] * FLOOD,
     r"the answer: 10000000 entries, more than the 1 possible \(one row per request"),
    ("req_to_token", ([[1]], [3]), [IDS],
     r"row 0: 10000000 entries, more than the 3 possible \(the longest seq_len, 3\)"),
], ids=["get_block_ids", "free_block_ids", "get_computed_blocks", "allocate_slots",
        "block_hashes", "take_events", "event_field", "event_fields", "slot_mapping",
        "build_batch_slots", "build_batch_positions", "flashinfer_csr_indices",
        "flashinfer_csr_indptr", "req_to_token_rows", "req_to_token_row"])
def test_a_flooding_answer_is_refused_by_its_length(method: str, args: tuple[Any, ...],
                                                    answer: Any, rule: str) -> None:
    mgr = guarded(SPEC, **{method: answer})
    message = refused(lambda: getattr(mgr, method)(*args), rule)
    assert message.startswith(f"flood.{method}(")


@pytest.mark.parametrize(("method", "args", "answer", "rule"), [
    ("get_block_ids", ("a",), [IDS, []],
     (r"the block tables of group 0: 10000000 entries, more than the 16 possible "
     r"\(num_blocks=16 or the 0 positions of the longest request passed in so far, 0 tokens")),
    ("allocate_slots", (view(), 9), [[], IDS],
     r"the new block ids of group 1: 10000000 entries, more than the 16 possible"),
    ("get_computed_blocks", (view(n=40),), ([IDS, []], 4),
     (r"the hit block ids of group 0: 10000000 entries, more than the 20 possible "
     r"\(num_blocks=16 or the 20 positions of the longest request passed in so far, 40")),
], ids=["tables", "new_ids", "hits"])
def test_per_group_lists_are_bounded_too(method: str, args: tuple[Any, ...], answer: Any,
                                         rule: str) -> None:
    mgr = guarded(HYBRID, **{method: answer})
    refused(lambda: getattr(mgr, method)(*args), rule)


def test_block_pool_answers_are_bounded() -> None:
    pool = GuardedBlockPool(Answers(get_new_blocks=IDS), impl="flood", spec=SPEC,
                            reserved=(0,), limit=CallLimit(5, "flood"))
    refused(lambda: pool.get_new_blocks(2),
            r"the new block ids: 10000000 entries, more than the 8 possible")


def test_one_id_repeated_across_a_large_pool_is_found_in_one_pass() -> None:
    """Within the bound, a million copies of one id: the duplicate search was quadratic
    (``ids.count`` per id: 10^12 steps), now one pass."""
    spec = KVCacheSpec(num_blocks=1 << 20, block_size=4)
    mgr = guarded(spec, get_block_ids=[5] * (1 << 20))
    refused(lambda: mgr.get_block_ids("a"), r"lists block id\(s\) \[5\] more than once")


def test_bounds_follow_the_requests_shown() -> None:
    """A correct long answer still passes: the hash bound grows with the longest request,
    the event bound with the calls made since the last drain."""
    hashes = [b"h"] * 100
    mgr = guarded(SPEC, get_computed_blocks=([], 0), block_hashes=hashes,
                  take_events=[{"type": "BlockRemoved"}] * 25)
    mgr.get_computed_blocks(view(n=400))
    assert mgr.block_hashes("a") == hashes
    with pytest.raises(ProtocolViolation, match="the events: 25 entries, more than the 10"):
        mgr.take_events()
    for rid in ("x", "y"):
        mgr._raw.answers["free"] = None
        mgr.free(rid)
    assert len(mgr.take_events()) == 25  # two frees: (2 + 1) * 10 events possible


def test_short_repr_is_bounded_by_its_limit() -> None:
    # Paired with repr() of the same list in the same run (the machine may be loaded): the
    # bounded form is at least 20 times cheaper (about 10^4 times on an idle machine).
    start = time.perf_counter()
    text = short_repr(IDS)
    nested = short_repr({"tables": [IDS, IDS]}, 80)
    bounded = time.perf_counter() - start
    start = time.perf_counter()
    repr(IDS)
    assert bounded * 20 < time.perf_counter() - start
    assert text.startswith("[5, 5, 5") and text.endswith("... (10000000 items)]")
    assert len(text) <= 120 and len(nested) <= 80
    assert short_repr(10**5000) == "<int of 16610 bits>"
    assert short_repr("x" * 10**6, 40).endswith("...") and len(short_repr("x" * 10**6, 40)) == 40
    for value in ([], (), (1,), set(), frozenset(), {}, {1: "a"}, [True, None, 1.5, b"b"]):
        assert short_repr(value) == repr(value)


FLOOD_IMPL = f"""
from kvcheck.adapters.reference import IMPL_INFO as _R, ReferenceManager
from kvcheck.conformance.protocol import ImplInfo
IMPL_INFO = ImplInfo("flood", "0", {reference_capabilities_source("_R.capabilities",
                                                                  drop={"block_pool"})})
FLOOD = [5] * 10**7
class M(ReferenceManager):
    def get_block_ids(self, request_id):
        return FLOOD
def make_kv_cache_manager(spec):
    return M(spec)
"""


def test_get_block_ids_flood_fails_its_test_in_seconds(pytester: pytest.Pytester) -> None:
    """The hostile user's case: ``get_block_ids`` returning 10^7 ids gave no output for
    minutes. Now the test fails at once naming the rule, and the message, the repro and the
    trace written for it hold the answer abbreviated."""
    pytester.makepyfile(flood_impl=FLOOD_IMPL)
    pytester.syspathinsert()
    start = time.perf_counter()
    result = pytester.runpytest("-p", "no:cacheprovider", "--kv-impl=flood_impl",
                                "-k", "test_first_allocation")
    assert time.perf_counter() - start < 60  # about 3 s idle; it took minutes before
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    out = result.stdout.str()
    assert re.search(r"protocol violation: flood\.get_block_ids\('r0'\) returned \[5, (5, )+"
                     r"\.\.\. \(10000000 items\)\]: the block table: 10000000 entries, more "
                     r"than the 10 possible \(distinct block ids of a pool of num_blocks=10\)",
                     out)
    assert len(out) < 50_000
    written = list((pytester.path / ".kvcheck" / "repro").iterdir())
    assert {p.suffix for p in written} == {".json", ".py"}
    for path in written:
        text = path.read_text()
        assert len(text) < 10_000, path
        assert not re.search(r"(5, ){1000}", text)
