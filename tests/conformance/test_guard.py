"""The answer-validating guard (kvcheck.conformance.guard): every rule, broken by a small fake
manager, raises ProtocolViolation naming the method, the arguments, the answer and the rule;
a well-behaved fake and the reference pass untouched."""

from __future__ import annotations

import re
from typing import Any

import pytest

from kvcheck.conformance.call_limit import CallLimit
from kvcheck.conformance.differential import ConformanceMismatch, Pair
from kvcheck.conformance.guard import (
    GuardedBlockPool,
    GuardedManager,
    ProtocolViolation,
    read_block_hashes,
    read_ref_cnts,
    read_tables,
)
from kvcheck.conformance.loader import load_impl
from kvcheck.conformance.ops import add, schedule
from kvcheck.conformance.protocol import KVCacheGroupSpec, KVCacheSpec, RequestView
from kvcheck.errors import KVCheckFailure

SPEC = KVCacheSpec(num_blocks=8, block_size=4)


class Fake:
    """A tiny well-behaved manager: blocks 1.. handed out in order, no caching."""

    def __init__(self) -> None:
        self.free_ids = list(range(1, SPEC.num_blocks))
        self.tables: dict[str, list[int]] = {}

    def get_computed_blocks(self, request: RequestView) -> Any:
        return [], 0

    def allocate_slots(self, request: RequestView, num_new_tokens: int,
                       num_new_computed_tokens: int = 0, new_computed_block_ids: Any = (),
                       num_lookahead_tokens: int = 0) -> Any:
        table = self.tables.setdefault(request.request_id, list(new_computed_block_ids))
        need = -(-(request.num_computed_tokens + num_new_computed_tokens + num_new_tokens)
                 // SPEC.block_size) - len(table)
        if need > len(self.free_ids):
            return None
        new = [self.free_ids.pop(0) for _ in range(max(need, 0))]
        table += new
        return new

    def free(self, request_id: str) -> None:
        self.free_ids += self.tables.pop(request_id, [])

    def get_block_ids(self, request_id: str) -> Any:
        return list(self.tables.get(request_id, []))

    def reset_prefix_cache(self) -> Any:
        return not self.tables

    def num_free_blocks(self) -> Any:
        return len(self.free_ids)

    def free_block_ids(self) -> Any:
        return list(self.free_ids)

    def ref_cnt(self, block_id: int) -> Any:
        return sum(block_id in t for t in self.tables.values())

    def block_hashes(self, request_id: str) -> Any:
        return []

    def take_events(self) -> Any:
        return []

    def slot_mapping(self, request_id: str, start: int, end: int) -> Any:
        ids = self.tables[request_id]
        return [ids[p // 4] * 4 + p % 4 for p in range(start, end)]


def guarded(fake: Any, reserved: tuple[int, ...] = (0,)) -> GuardedManager:
    return GuardedManager(fake, impl="fake", spec=SPEC, reserved=reserved,
                          limit=CallLimit(5, "fake"))


def view(rid: str = "a", n: int = 9) -> RequestView:
    return RequestView(rid, tuple(range(n)))


def test_well_behaved_fake_passes_every_method() -> None:
    m = guarded(Fake())
    a = view("a")
    assert m.get_computed_blocks(a) == ([], 0)
    assert m.allocate_slots(a, 9, 0, []) == [1, 2, 3]
    assert m.get_block_ids("a") == [1, 2, 3] and m.get_block_ids("nobody") == []
    assert m.num_free_blocks() == 4 and m.free_block_ids() == [4, 5, 6, 7]
    assert m.ref_cnt(1) == 1 and m.block_hashes("a") == [] and m.take_events() == []
    assert m.slot_mapping("a", 0, 2) == [4, 5]
    assert m.reset_prefix_cache() is False
    m.free("a")
    assert m.get_block_ids("a") == [] and m.reset_prefix_cache() is True


def test_single_group_answers_are_the_one_group_case_per_group() -> None:
    """The per-group methods (the driver's) wrap a flat answer as one group and pass the
    adapter its own flat form; the protocol methods hand the flat answer back."""
    fake = Fake()
    seen: list[Any] = []
    allocate = fake.allocate_slots

    def recording(request: RequestView, n: int, k: int = 0, hits: Any = (), la: int = 0) -> Any:
        seen.append(hits)
        return allocate(request, n, k, hits, la)

    fake.allocate_slots = recording  # type: ignore[method-assign]
    m = guarded(fake)
    a = view("a")
    assert m.get_computed_blocks_per_group(a) == ([[]], 0)
    assert m.allocate_slots_per_group(a, 9, 0, [[]]) == [[1, 2, 3]]
    assert seen == [[]], "the adapter gets flat hits"
    assert m.get_block_ids_per_group("a") == [[1, 2, 3]] and m.get_block_ids("a") == [1, 2, 3]
    assert m.allocate_slots_per_group(a, 0, 0, []) == [[]], "a running request passes no hits"
    assert m.allocate_slots_per_group(view("b", 40), 40, 0, [[]]) is None
    assert not m.grouped
    # The flat rules name the answer as the adapter wrote it (no group in the message).
    bad = _allocate_returning([1, 1])
    with pytest.raises(ProtocolViolation, match=re.escape(
            "the new block ids lists block id(s) [1] more than once")):
        guarded(bad).allocate_slots_per_group(a, 9, 0, [[]])


def _allocate_returning(value: Any) -> Fake:
    fake = Fake()
    fake.allocate_slots = lambda *args: value  # type: ignore[method-assign]
    return fake


@pytest.mark.parametrize(("answer", "rule"), [
    ([True, False], "element True is a bool"),
    (["1", "2"], "element '1' is a str"),
    ("1,2,3,4", "must be a list of int, not a str"),
    ([-1], "block id -1 in the new block ids is outside [0, num_blocks=8)"),
    ([8], "block id 8 in the new block ids is outside [0, num_blocks=8)"),
    ([1, 1, 1, 1], "lists block id(s) [1] more than once"),
    ([0, 1], "contains reserved block id(s) [0]"),
    ({1, 2}, "must be a list of int, not a set"),
    ([1.0], "element 1.0 is a float"),
])
def test_allocate_slots_answer_types_and_ranges(answer: Any, rule: str) -> None:
    m = guarded(_allocate_returning(answer))
    with pytest.raises(ProtocolViolation) as info:
        m.allocate_slots(view("a"), 9, 0, [])
    message = str(info.value)
    assert message.startswith("fake.allocate_slots(RequestView('a', 9 tokens, "
                              "num_computed_tokens=0), 9, 0, []) returned ")
    assert rule in message
    assert isinstance(info.value, KVCheckFailure)


def test_reserved_rule_follows_the_declaration() -> None:
    """Under a design that reserves nothing, block 0 is an ordinary block."""
    assert guarded(_allocate_returning([0, 1]), reserved=()).allocate_slots(
        view("a"), 8, 0, []) == [0, 1]
    with pytest.raises(ProtocolViolation, match=r"reserved block id\(s\) \[3\]"):
        guarded(_allocate_returning([3]), reserved=(3,)).allocate_slots(view("a"), 4, 0, [])


def test_block_handed_to_two_live_requests() -> None:
    fake = Fake()
    m = guarded(fake)
    m.allocate_slots(view("a"), 9, 0, [])
    fake.allocate_slots = lambda *args: [3]  # type: ignore[method-assign]
    with pytest.raises(ProtocolViolation,
                       match=r"block 3 is handed out anew but request\(s\) \['a'\] still hold"):
        m.allocate_slots(view("b", 2), 2, 0, [])


def test_new_block_may_not_be_a_hit_passed_in() -> None:
    fake = Fake()
    m = guarded(fake)
    fake.allocate_slots = lambda *args: [5]  # type: ignore[method-assign]
    with pytest.raises(ProtocolViolation, match="block 5 is one of the cache hits passed in"):
        m.allocate_slots(view("b", 9), 1, 8, [5, 6])


def test_shared_hits_are_legitimate() -> None:
    """Hits returned by get_computed_blocks and passed back may be held by another request."""
    fake = Fake()
    m = guarded(fake)
    m.allocate_slots(view("a"), 9, 0, [])                 # a holds 1, 2, 3
    fake.get_computed_blocks = lambda r: ([1, 2], 8)      # type: ignore[method-assign]
    hits, n = m.get_computed_blocks(view("b", 10))
    fake.allocate_slots = lambda *args: [4]               # type: ignore[method-assign]
    fake.get_block_ids = lambda rid: {"a": [1, 2, 3], "b": [1, 2, 4]}[rid]  # type: ignore[method-assign]
    assert m.allocate_slots(view("b", 10), 2, n, hits) == [4]
    assert m.get_block_ids("b") == [1, 2, 4] and m.get_block_ids("a") == [1, 2, 3]


def test_freed_shared_block_is_still_held_by_the_other_request() -> None:
    fake = Fake()
    m = guarded(fake)
    m.allocate_slots(view("a"), 9, 0, [])
    fake.allocate_slots = lambda *args: [4]  # type: ignore[method-assign]
    m.allocate_slots(view("b", 10), 2, 8, [1, 2])
    m.free("b")
    fake.allocate_slots = lambda *args: [2]  # type: ignore[method-assign]
    with pytest.raises(ProtocolViolation, match=r"block 2 is handed out anew but request"):
        m.allocate_slots(view("c", 2), 2, 0, [])


def test_get_block_ids_must_match_the_answers() -> None:
    fake = Fake()
    m = guarded(fake)
    m.allocate_slots(view("a"), 9, 0, [])
    fake.get_block_ids = lambda rid: [1, 2]  # type: ignore[method-assign]
    with pytest.raises(ProtocolViolation) as info:
        m.get_block_ids("a")
    assert "fake.get_block_ids('a') returned [1, 2]: the block table must be [1, 2, 3]" in str(
        info.value)
    m.free("a")
    fake.get_block_ids = lambda rid: [1, 2, 3]  # type: ignore[method-assign]
    with pytest.raises(ProtocolViolation, match=r"must be \[\] \(the previous table"):
        m.get_block_ids("a")


@pytest.mark.parametrize(("answer", "rule"), [
    (None, "must be an int, not a NoneType"),
    (True, "must be an int, not a bool"),
    (-1, r"must be an int in \[0, 8\]"),
    (9, r"must be an int in \[0, 8\]"),
    ("4", "must be an int, not a str"),
])
def test_num_free_blocks_is_an_int_in_range(answer: Any, rule: str) -> None:
    fake = Fake()
    fake.num_free_blocks = lambda: answer  # type: ignore[method-assign]
    with pytest.raises(ProtocolViolation, match=rf"fake.num_free_blocks\(\) returned .*: {rule}"):
        guarded(fake).num_free_blocks()


@pytest.mark.parametrize(("method", "args", "answer", "rule"), [
    ("free_block_ids", (), None, "the free queue must be a list of int, not a NoneType"),
    ("free_block_ids", (), [4, 4], r"the free queue lists block id\(s\) \[4\] more than once"),
    ("free_block_ids", (), [0, 4], r"reserved block id\(s\) \[0\]"),
    ("ref_cnt", (3,), -1, "must be an int >= 0"),
    ("ref_cnt", (3,), None, "must be an int >= 0, not a NoneType"),
    ("block_hashes", ("a",), ["ab"], "element 'ab' is a str"),
    ("block_hashes", ("a",), None, "must be a list of bytes, not a NoneType"),
    ("take_events", (), [{"kind": "x"}], "every event must be a dict with a 'type' key"),
    ("take_events", (), None, "must be a list of dicts, not a NoneType"),
    ("take_event_batch", (0.0,), [b"x"], r"must be bytes \(the msgpack payload\), not a list"),
    ("take_event_batch", (0.0,), b"\x93" * 10_000_000,
     "10000000 bytes, more than the .* the events of 0 state-changing calls can take"),
    ("slot_mapping", ("a", 0, 2), [True, 1], "element True is a bool"),
    ("reset_prefix_cache", (), 1, "must be a bool, not a int"),
    ("get_computed_blocks", (view("a"),), [1], "must be a pair"),
    ("get_computed_blocks", (view("a"),), ([1], 3.0), r"must be an int in \[0, 9\]"),
    ("get_computed_blocks", (view("a"),), ([1], 10), r"must be an int in \[0, 9\]"),
    ("get_computed_blocks", (view("a"),), ([1], 8),
     r"8 hit tokens fill 2 block\(s\) of 4, but 1 block ids were returned"),
    ("get_computed_blocks", (view("a"),), ([0], 4), r"reserved block id\(s\) \[0\]"),
])
def test_observation_rules(method: str, args: tuple[Any, ...], answer: Any, rule: str) -> None:
    fake = Fake()
    setattr(fake, method, lambda *a: answer)
    with pytest.raises(ProtocolViolation, match=rule) as info:
        getattr(guarded(fake), method)(*args)
    assert str(info.value).startswith(f"fake.{method}(")


def test_mutating_the_request_view_is_a_violation() -> None:
    fake = Fake()
    inner = fake.allocate_slots

    def mutating(request: RequestView, *args: Any) -> Any:
        object.__setattr__(request, "num_computed_tokens", 5)
        return inner(request, *args)

    fake.allocate_slots = mutating  # type: ignore[method-assign]
    with pytest.raises(ProtocolViolation, match="mutated the RequestView it was given"):
        guarded(fake).allocate_slots(view("a"), 9, 0, [])


def test_caller_hits_list_is_not_shared_with_the_adapter() -> None:
    fake = Fake()
    seen: list[Any] = []

    def grabbing(request: RequestView, n: int, k: int, hits: Any) -> Any:
        seen.append(hits)
        hits.clear()
        return [4]

    fake.allocate_slots = grabbing  # type: ignore[method-assign]
    mine = [1, 2]
    guarded(fake).allocate_slots(view("a", 9), 1, 8, mine)
    assert mine == [1, 2] and seen[0] == []


def test_block_pool_guard() -> None:
    class Pool:
        def get_new_blocks(self, n: int) -> Any:
            return [1] * n

        def get_cached_block(self, h: bytes) -> Any:
            return "3"

        def num_free_blocks(self) -> Any:
            return None

    pool = GuardedBlockPool(Pool(), impl="pool", spec=SPEC, reserved=(0,),
                            limit=CallLimit(5, "pool"))
    with pytest.raises(ProtocolViolation, match="more than once"):
        pool.get_new_blocks(2)
    with pytest.raises(ProtocolViolation, match="must be None or an int"):
        pool.get_cached_block(b"x")
    with pytest.raises(ProtocolViolation, match="must be an int, not a NoneType"):
        pool.num_free_blocks()


def test_reference_through_the_handle_is_guarded_and_clean() -> None:
    """make_manager returns the guard; the reference's answers pass it, and attributes the
    guard does not know reach the adapter."""
    ref = load_impl("reference")
    m = ref.make_manager(SPEC)
    assert isinstance(m, GuardedManager)
    assert m.allocate_slots(view("a"), 9, 0, []) == [1, 2, 3]
    assert m.get_block_ids("a") == [1, 2, 3] and m.spec == SPEC
    assert not isinstance(ref.make_manager(SPEC, guard=False), GuardedManager)


def _count_calls(m: GuardedManager) -> list[str]:
    """The methods ``m`` calls the adapter with from now on, in order (its ``_call`` wrapped)."""
    calls: list[str] = []
    own_call = m._call

    def counting(method: str, fn: Any, *args: Any) -> Any:
        calls.append(method)
        return own_call(method, fn, *args)

    m._call = counting
    return calls


def test_reference_answers_a_sweep_of_ref_cnts_in_one_call() -> None:
    """The reference's bulk ``ref_cnts`` (one guarded call per sweep) gives what ``ref_cnt``
    gives block by block, and the guard reads it through that one call."""
    ref = load_impl("reference")
    raw = ref.make_manager(SPEC, guard=False)
    raw.allocate_slots(view("a"), 9, 0, [])
    ids = list(range(SPEC.num_blocks))
    assert raw.ref_cnts(ids) == [raw.ref_cnt(b) for b in ids] == [0, 1, 1, 1] + [0] * (
        SPEC.num_blocks - 4)
    m = ref.make_manager(SPEC)
    m.allocate_slots(view("a"), 9, 0, [])
    calls = _count_calls(m)
    assert m.ref_cnts(ids) == [0, 1, 1, 1] + [0] * (SPEC.num_blocks - 4)
    assert calls == ["ref_cnt"]


@pytest.mark.parametrize("groups", [(), (KVCacheGroupSpec("full_attention", 4),
                                         KVCacheGroupSpec("sliding_window", 4, sliding_window=8))],
                         ids=["one-group", "two-groups"])
def test_reference_reads_every_requests_tables_and_hashes_in_one_call(
        groups: tuple[KVCacheGroupSpec, ...]) -> None:
    """The reference's bulk ``get_block_ids_many`` / ``block_hashes_many`` answer what the
    per-request reads answer, in the adapter's own form (a flat table for one group), for
    requests holding blocks and one holding none; the guard reads each through one call."""
    spec = KVCacheSpec(num_blocks=16, block_size=4, kv_cache_groups=groups)
    ref = load_impl("reference")
    raw = ref.make_manager(spec, guard=False)
    raw.allocate_slots(view("a"), 9, 0, [])
    raw.allocate_slots(view("b", 5), 5, 0, [])
    rids = ["a", "b", "gone"]
    tables = raw.get_block_ids_many(rids)
    assert tables == [raw.get_block_ids(r) for r in rids]
    # 9 and 5 tokens at block size 4 hold 3 and 2 blocks (per group: a window of 8 tokens
    # skips none of a fresh request's): one list per group, or one flat table.
    if groups:
        assert [[len(g) for g in t] for t in tables] == [[3, 3], [2, 2], [0, 0]]
    else:
        assert [len(t) for t in tables] == [3, 2, 0] and type(tables[0][0]) is int
    hashes = raw.block_hashes_many(rids)
    assert hashes == [raw.block_hashes(r) for r in rids]
    assert [len(h) for h in hashes] == [2, 1, 0]  # full blocks only
    m = ref.make_manager(spec)
    m.allocate_slots(view("a"), 9, 0, [])
    m.allocate_slots(view("b", 5), 5, 0, [])
    one_by_one = [m.get_block_ids_per_group(r) for r in rids]
    assert one_by_one[2] == [[] for _ in (groups or [None])]
    calls = _count_calls(m)
    assert read_tables(m, rids) == one_by_one
    assert read_block_hashes(m, rids) == hashes
    assert calls == ["get_block_ids", "block_hashes"]


class BulkFake(Fake):
    """``Fake`` with the optional bulk reads (what kvcheck's ``exec:`` proxies have), which
    count their calls; ``bulk_tables`` / ``bulk_hashes`` replace their answers."""

    def __init__(self) -> None:
        super().__init__()
        self.bulk_calls: list[tuple[str, list[str]]] = []
        self.bulk_tables: Any = None
        self.bulk_hashes: Any = None

    def get_block_ids_many(self, request_ids: list[str]) -> Any:
        self.bulk_calls.append(("get_block_ids_many", list(request_ids)))
        if self.bulk_tables is not None:
            return self.bulk_tables
        return [self.get_block_ids(r) for r in request_ids]

    def block_hashes_many(self, request_ids: list[str]) -> Any:
        self.bulk_calls.append(("block_hashes_many", list(request_ids)))
        if self.bulk_hashes is not None:
            return self.bulk_hashes
        return [[bytes([i]) * 4] for i, _ in enumerate(request_ids)]


def test_bulk_reads_take_one_call_and_are_checked_as_each_answer() -> None:
    fake = BulkFake()
    m = guarded(fake)
    m.allocate_slots(view("a"), 9, 0, [])
    m.allocate_slots(view("b", 4), 4, 0, [])
    assert read_tables(m, ["a", "b", "gone"]) == [[[1, 2, 3]], [[4]], [[]]]
    assert read_block_hashes(m, ["a", "b"]) == [[b"\0" * 4], [b"\1" * 4]]
    assert fake.bulk_calls == [("get_block_ids_many", ["a", "b", "gone"]),
                               ("block_hashes_many", ["a", "b"])]
    # An answer the per-request call would refuse is refused in a bulk answer too, named.
    fake.bulk_tables = [[1, 2, 3], [5]]
    with pytest.raises(ProtocolViolation, match=re.escape(
            "fake.get_block_ids('b') returned [5]: the block table must be [4]")):
        read_tables(m, ["a", "b"])
    fake.bulk_hashes = [[b"ok"], ["not bytes"]]
    with pytest.raises(ProtocolViolation, match=r"fake\.block_hashes\('b'\) returned "
                       r".*must be a list of bytes"):
        read_block_hashes(m, ["a", "b"])
    fake.bulk_hashes = [[b"ok"]]
    with pytest.raises(ProtocolViolation, match=re.escape(
            "fake.block_hashes('a', 'b') returned [[b'ok']]: must be one answer per request "
            "(2)")):
        read_block_hashes(m, ["a", "b"])
    fake.ref_cnts = lambda block_ids: [1]  # type: ignore[attr-defined]
    with pytest.raises(ProtocolViolation, match=re.escape(
            "fake.ref_cnt(1, 2) returned [1]: must be one count per block (2)")):
        read_ref_cnts(m, [1, 2])


def test_without_bulk_reads_each_request_is_asked() -> None:
    m = guarded(Fake())
    m.allocate_slots(view("a"), 9, 0, [])
    assert read_tables(m, ["a", "b"]) == [[[1, 2, 3]], [[]]]
    assert read_block_hashes(m, ["a"]) == [[]]


def test_violation_in_a_pair_reads_as_protocol_violation_with_repro(tmp_path: Any,
                                                                    monkeypatch: Any) -> None:
    """Through Pair.apply: the op number, the rule and a runnable repro."""
    monkeypatch.chdir(tmp_path)
    ref = load_impl("reference")
    pair = Pair(ref, None, KVCacheSpec(num_blocks=8, block_size=4))
    pair.trace_name = "test_x[bad]"
    raw = pair.impl.manager._raw
    raw.allocate_slots = lambda *args: [1, 1, 1]
    with pytest.raises(ConformanceMismatch) as info:
        pair.run([add("a", range(9)), schedule("a")])
    message = str(info.value)
    assert re.search(r"after op #2 \{'op': 'schedule'.*: protocol violation: "
                     r"reference\.allocate_slots\(RequestView\('a', 9 tokens, "
                     r"num_computed_tokens=0\), 9, 0, \[\]\) returned \[1, 1, 1\]: the new "
                     r"block ids lists block id\(s\) \[1\] more than once", message)
    assert "runnable repro of the calls made" in message and "trace written to" in message


def test_unwritable_repro_directory_keeps_the_failure(tmp_path: Any, monkeypatch: Any) -> None:
    """Pair.fail still reports the violation when the trace cannot be written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".kvcheck").write_text("a file where the directory should be")
    pair = Pair(load_impl("reference"), None, KVCacheSpec(num_blocks=8, block_size=4))
    pair.trace_name = "test_y"
    pair.impl.manager._raw.allocate_slots = lambda *args: [1, 1]
    with pytest.raises(ConformanceMismatch) as info:
        pair.run([add("a", range(5)), schedule("a")])
    message = str(info.value)
    assert "protocol violation: reference.allocate_slots(" in message
    assert "trace not written (.kvcheck/repro: " in message
    assert "runnable repro of the calls made" in message


def test_a_memory_stop_names_a_per_group_call_by_its_protocol_method() -> None:
    """The driver calls the ``*_per_group`` methods; a memory-limit stop during one names
    the adapter method it checks."""
    from kvcheck.conformance.memory_limit import _GUARD_CODES

    for method in ("get_computed_blocks", "allocate_slots", "get_block_ids"):
        assert _GUARD_CODES[getattr(GuardedManager, f"{method}_per_group").__code__] == method
        assert _GUARD_CODES[getattr(GuardedManager, method).__code__] == method
