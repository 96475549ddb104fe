"""Answer validation: every adapter answer is checked against the protocol before anyone
compares it (issue 10 item 3), in every profile.

``ImplHandle.make_manager(spec)`` returns a ``GuardedManager`` around the adapter's manager
(``make_block_pool`` a ``GuardedBlockPool``), so the Driver, the oracle and scripted tests that
call manager methods directly all go through it. Every call also runs under the handle's
per-call limit (``kvcheck.conformance.call_limit``).

The guard is the adapter boundary of the one-group/many-groups split
(``kvcheck.conformance.groups``): its ``*_per_group`` methods, which the driver calls, answer
one list of block ids per KV-cache group whatever form the adapter speaks (a single-group
adapter's flat answer is the one-group case ``[answer]``); the protocol methods
(``get_computed_blocks``, ``allocate_slots``, ``get_block_ids``), which repros and scripted
tests call, hand back the adapter's own form. Each answer is checked once, by the rules of
the form the adapter speaks.

Rules (a broken one raises ``ProtocolViolation`` naming the method, its arguments, the
returned value and the rule):

* types: block-id answers are lists (or tuples) of ``int``, never ``bool``, ``str`` or None
  where a list is due; counts are ``int``; ``reset_prefix_cache()`` a ``bool``;
* ranges: block ids in ``[0, num_blocks)``, never a reserved id
  (``reserved_block_ids(info, spec.profile)``), no id twice in one answer;
  ``num_free_blocks()`` in ``[0, num_blocks]``;
* ``get_computed_blocks(view)`` is ``(ids, n)`` with ``0 <= n <= view.num_tokens`` and
  ``len(ids) == ceil(n / block_size)``;
* ``allocate_slots`` returns None or the *new* blocks only: none of them is one of the hits
  passed in, and none is held by a live request (a cache hit, i.e. an id returned by
  ``get_computed_blocks`` and passed back, is legitimately shared; a newly allocated block
  never is);
* ``get_block_ids(rid)`` equals what the calls imply: the previous table + the hits passed to
  ``allocate_slots`` + the new ids it returned; ``[]`` after ``free`` or for an unknown id.
  With ``dedup_on_insert`` (a ``Rebindings`` judge attached by the driver,
  ``judge_rebindings``; single-group specs) an entry of a computed full block may have been
  rebound to a block of identical content, which the guard then follows; without it, the
  violation names the capability when the change is such a rebinding
  (``kvcheck.conformance.rebinding``);
* optional capabilities: ``free_block_ids()`` an id list, ``ref_cnt(b)`` an int >= 0,
  ``block_hashes(rid)`` a list of bytes, ``take_events()`` a list of dicts with a ``"type"``,
  ``slot_mapping(...)`` a list of int;
* the adapter does not mutate the ``RequestView`` it is given (it is frozen; a write through
  ``object.__setattr__`` still counts);
* ``pinning_lookup`` (``follow_pins``, called by the loader for an implementation declaring
  it): a lookup pins its hits until the request's next successful ``allocate_slots`` or its
  ``release_computed``; ``allocate_slots`` never returns a pinned block as new
  (``kvcheck.conformance.pinning``; the ledger is ``pin_ledger``);
* multi-group specs (``spec.kv_cache_groups`` non-empty): ``get_computed_blocks`` is ``(one
  list per group, n)``, ``allocate_slots`` None or one list of new ids per group,
  ``get_block_ids`` one table per group. Id ``0`` is the null block: allowed in hits and
  tables, never a new block; no other id twice across the groups of one answer. A table
  equals the previous one + the hits + the new ids, except that entries may have become ``0``
  (skipped by a window);
* fine-grained partial hits (a layout where ``kvcheck.conformance.fine_grained`` says vLLM
  0.33 has them): a hit may end inside a block (``len(ids) == ceil(n / block_size)`` still),
  and a new request's table may show its last hit block of such a group replaced by the
  first new id (its copy-on-write block; the hit list and the new ids otherwise as above).
  ``take_kv_cache_block_copies()`` answers ``(src, dst)`` pairs of block ids: each
  replacement seen is drained exactly once as ``(the hit block, the CoW block)``, the CoW
  block held by its request alone; any other pair is a Mamba group's copy of a running
  request's own state (``src`` in a Mamba table, ``dst`` held by no request); no block is a
  destination twice in one answer; the pairs come group by group, in group order.

Lengths come before elements (issue 23 item 3): every list answer is first checked against
a bound it cannot exceed when correct, so a flood (10^7 ids) is refused at once, naming its
length and the bound, before anything walks its elements:

* a list of distinct block ids (hits, new ids, a single-group table, the free queue,
  ``get_new_blocks``): at most ``num_blocks``;
* a per-group list that may hold the null block (hits, tables): at most ``num_blocks`` or the
  positions of the longest request kvcheck has shown the adapter, whichever is more;
* ``block_hashes``: at most one hash per token of the pool or of the longest request shown;
* ``take_events``: at most ``num_blocks + groups + 1`` events per state-changing call since
  the last drain (plus one call's worth), each with at most 64 fields, each list field at
  most the pool's tokens (``num_blocks * block_size``);
* ``slot_mapping(rid, start, end)``: at most ``end - start`` slots;
* batch metadata: ``build_batch`` at most ``max(num_padded_tokens, sum of scheduled)``
  entries per list, ``flashinfer_csr`` ``len(seq_lens) + 1`` / the rows' pages /
  ``len(seq_lens)``, ``req_to_token`` ``len(seq_lens)`` rows of at most ``max(seq_lens)``.

Failure messages show answers through ``short_repr`` (bounded by its limit, not by the
answer's size).

Validation is a few C-level set/min/max operations per answer (the ``ref_cnt`` loop of the
observations makes it a hot path). After an adapter call raised, the guard stops checking
table consistency for that manager (its state is unknown; the test fails anyway).

Every guard is registered (weakly) so that a process-wide stop can divert every guarded call
at once, with no per-call check: ``divert_calls(call)`` makes every live and future guard run
``call(method, fn, *args)`` instead of its call limit (the memory limit,
``kvcheck.conformance.memory_limit``, and a forked child, ``kvcheck.conformance.forked``, use
it); ``restore_calls()`` undoes it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, NoReturn, Protocol, TypeVar, cast

from kvcheck.conformance.block_zeroing import ZeroingLedger
from kvcheck.conformance.call_limit import CallLimit, arg_text
from kvcheck.conformance.errors import ProtocolViolation
from kvcheck.conformance.fine_grained import CowLedger, fine_grained_hits, partial_hit_groups
from kvcheck.conformance.groups import NULL_BLOCK, adapter_form, null_of
from kvcheck.conformance.pinning import PinLedger, pinned_ids
from kvcheck.conformance.protocol import KVCacheSpec, KVEvent, RequestView
from kvcheck.conformance.short_repr import short_repr as abbreviate

if TYPE_CHECKING:
    from typing_extensions import TypeVarTuple, Unpack

    _Args = TypeVarTuple("_Args")

_T = TypeVar("_T")

#: ``allocate_slots`` without external-KV arguments (shared, never changed).
_NO_EXTERNAL: dict[str, object] = {}

__all__ = [
    "AdapterCall",
    "Diversion",
    "GuardedBlockPool",
    "GuardedManager",
    "ProtocolViolation",
    "RebindingJudge",
    "divert_calls",
    "live_guards",
    "read_block_hashes",
    "read_ref_cnts",
    "read_tables",
    "restore_calls",
]


def _read_many(manager: object, many: str, one: str, keys: Sequence[object]) -> list[object]:
    """``manager.<many>(keys)`` where the manager has that bulk read (a ``GuardedManager``
    does: one checked call), else ``manager.<one>(key)`` key by key."""
    bulk = getattr(manager, many, None)
    if bulk is not None:
        return cast("list[object]", bulk(keys))
    each = getattr(manager, one)
    return [each(k) for k in keys]


def read_tables(manager: object, request_ids: Sequence[str]) -> list[list[list[int]]]:
    """``manager.get_block_ids_per_group`` of each of ``request_ids``."""
    return cast("list[list[list[int]]]", _read_many(manager, "get_block_ids_many",
                                                    "get_block_ids_per_group", request_ids))


def read_block_hashes(manager: object, request_ids: Sequence[str]) -> list[list[bytes]]:
    """``manager.block_hashes`` of each of ``request_ids``."""
    return cast("list[list[bytes]]", _read_many(manager, "block_hashes_many", "block_hashes",
                                                request_ids))


def read_ref_cnts(manager: object, block_ids: Sequence[int]) -> list[int]:
    """``manager.ref_cnt`` of each of ``block_ids`` (``GuardedManager.ref_cnts``)."""
    return cast("list[int]", _read_many(manager, "ref_cnts", "ref_cnt", block_ids))


def _view_state(view: object) -> tuple[object, ...] | None:
    if type(view) is not RequestView:
        return None
    return (view.request_id, view.prompt_token_ids, view.output_token_ids,
            view.num_computed_tokens, view.lora, view.mm_features, view.cache_salt,
            view.skip_reading_prefix_cache)


_INT_ONLY = frozenset({int})
#: ``GuardedManager._follow``'s "read the tables yourself" (a bulk read passes its answer).
_ASK: Final = object()
#: Most fields an event may have (far more than vLLM's events carry).
_EVENT_FIELDS = 64


def _type_name(value: object) -> str:
    t = type(value)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _table_matches(got: list[int], want: list[int], null: int | None) -> bool:
    """Whether table ``got`` is ``want``, some entries possibly replaced by the ``null``
    block (None: no null block)."""
    return got == want or (null is not None and len(got) == len(want) and all(
        a in (b, null) for a, b in zip(got, want, strict=True)))


def _nulls_inserted(got: list[int], want: list[int], null: int) -> bool:
    """Whether table ``got`` is ``want`` with ``len(got) - len(want)`` null entries inserted
    anywhere, some of ``want``'s entries possibly replaced by the ``null`` block too."""
    extra = len(got) - len(want)
    if extra < 0:
        return False
    deleted = {0}  # the numbers of inserted nulls that the entries read so far can hold
    for i, block in enumerate(got):
        after: set[int] = set()
        for d in deleted:
            if block == null and d < extra:
                after.add(d + 1)  # an inserted null
            if i - d < len(want) and block in (want[i - d], null):
                after.add(d)  # want's entry, or a null in its place
        deleted = after
    return extra in deleted


def _duplicates(ids: Sequence[int]) -> list[int]:
    """The ids listed more than once, sorted (one pass: ``ids.count`` per id is quadratic)."""
    seen: set[int] = set()
    dup: set[int] = set()
    for b in ids:
        (dup if b in seen else seen).add(b)
    return sorted(dup)


def _ints_problem(value: object, what: str) -> str | None:
    """Why ``value`` is not a list of int (None if it is)."""
    if type(value) is not list and type(value) is not tuple:
        return f"{what} must be a list of int, not a {_type_name(value)}"
    if value and not _INT_ONLY.issuperset(map(type, value)):
        for x in value:
            if type(x) is not int:
                return (f"{what} must be a list of int; element {abbreviate(x, 30)} is a "
                        f"{_type_name(x)}")
    return None


class AdapterCall(Protocol):
    """How a guard makes an adapter call: ``call(method, fn, *args)`` (``CallLimit.call``)."""

    def __call__(self, method: str, fn: Callable[[Unpack[_Args]], _T],
                 *args: Unpack[_Args]) -> _T: ...


class RebindingJudge(Protocol):
    """What judges a changed table entry under ``dedup_on_insert``
    (``kvcheck.conformance.rebinding.Rebindings``): ``judge`` returns whether ``got`` is
    ``expected`` with valid rebindings, and the note a violation ends with otherwise."""

    declared: bool

    def judge(self, request_id: str, expected: Sequence[int], got: Sequence[int], *,
              computed: int, fresh: int | None) -> tuple[bool, str]: ...


#: What ``divert_calls`` takes: the implementation's name -> the call its guards make.
Diversion = Callable[[str], AdapterCall]

# Every live guard, and the diversion in force (None: each guard's own call limit).
_LIVE: weakref.WeakSet[_Guard] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()
_DIVERSION: list[Diversion | None] = [None]


def divert_calls(diversion: Diversion) -> None:
    """From now on every guarded call, of every live guard and of those built later, runs
    ``diversion(impl)(method, fn, *args)`` instead of the guard's call limit (``impl``: the
    guard's implementation name). Safe from any thread; costs nothing per call (each guard's
    call attribute is swapped once)."""
    with _LIVE_LOCK:
        _DIVERSION[0] = diversion
        guards = list(_LIVE)
    for guard in guards:
        guard._call = diversion(guard._impl)


def restore_calls() -> None:
    """Undo ``divert_calls``: every guard calls through its own call limit again."""
    with _LIVE_LOCK:
        _DIVERSION[0] = None
        guards = list(_LIVE)
    for guard in guards:
        guard._call = guard._own_call


def live_guards() -> tuple[threading.Lock, weakref.WeakSet[_Guard]]:
    """The registry's lock and set (``kvcheck.conformance.forked`` holds the lock across a
    fork, so the child never inherits it held)."""
    return _LIVE_LOCK, _LIVE


class _Guard:
    """What the manager and block-pool guards share: the raw object, the spec's bounds and
    the violation message."""

    __slots__ = ("__weakref__", "_bs", "_call", "_impl", "_n", "_own_call", "_raw",
                 "_reserved")

    def __init__(self, raw: object, *, impl: str, spec: KVCacheSpec, reserved: Sequence[int],
                 limit: CallLimit) -> None:
        # The adapter: any object. Its answers are untrusted (``object``) until checked.
        # Any: its methods are looked up by name (the protocols' and any other).
        self._raw: Any = raw
        self._impl = impl
        self._own_call: AdapterCall = limit.call
        self._n = spec.num_blocks
        self._bs = spec.block_size
        self._reserved = frozenset(reserved)
        with _LIVE_LOCK:
            diversion = _DIVERSION[0]
            self._call: AdapterCall = self._own_call if diversion is None else diversion(impl)
            _LIVE.add(self)

    def __getattr__(self, name: str) -> Any:  # Any: whatever the adapter has, passed through
        return getattr(object.__getattribute__(self, "_raw"), name)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self._raw!r}>"

    def _violation(self, method: str, args: tuple[object, ...], value: object,
                   rule: str) -> NoReturn:
        __tracebackhide__ = True
        shown = ", ".join(arg_text(a) for a in args)
        raise ProtocolViolation(f"{self._impl}.{method}({shown}) returned "
                                f"{abbreviate(value)}: {rule}")

    def _too_long(self, method: str, args: tuple[object, ...], value: object, part: object,
                  what: str, bound: int, why: str) -> None:
        """``part`` (a list in ``value``) has at most ``bound`` entries (checked before any of
        its elements is looked at); ``why`` says where the bound comes from."""
        __tracebackhide__ = True
        if (type(part) is list or type(part) is tuple) and len(part) > bound:
            self._violation(method, args, value,
                            f"{what}: {len(part)} entries, more than the {bound} possible "
                            f"({why})")

    def _ids(self, method: str, args: tuple[object, ...], value: object, what: str) -> list[int]:
        """``value`` checked as block ids (length, types, range, reserved, duplicates); as a
        list."""
        __tracebackhide__ = True
        self._too_long(method, args, value, value, what, self._n,
                       f"distinct block ids of a pool of num_blocks={self._n}")
        problem = _ints_problem(value, what)
        if problem is not None:
            self._violation(method, args, value, problem)
        ids = cast("list[int] | tuple[int, ...]", value)  # what _ints_problem checked
        if ids:
            low, high = min(ids), max(ids)
            if low < 0 or high >= self._n:
                bad = low if low < 0 else high
                problem = f"block id {bad} in {what} is outside [0, num_blocks={self._n})"
            elif not self._reserved.isdisjoint(ids):
                bad_ids = sorted(self._reserved.intersection(ids))
                problem = (f"{what} contains reserved block id(s) {bad_ids} (reserved: "
                           f"{sorted(self._reserved)}; ImplInfo.reserved_block_ids or the "
                           "profile's default)")
            elif len(set(ids)) != len(ids):
                problem = (f"{what} lists block id(s) {abbreviate(_duplicates(ids), 80)} "
                           "more than once")
        if problem is not None:
            self._violation(method, args, value, problem)
        return ids if type(ids) is list else list(ids)

    def _count(self, method: str, args: tuple[object, ...], value: object, high: int) -> int:
        __tracebackhide__ = True
        if type(value) is not int or not 0 <= value <= high:
            what = (f"an int in [0, {high}]" if type(value) is int
                    else f"an int, not a {_type_name(value)}")
            self._violation(method, args, value, f"must be {what}")
        return value

    def _unchanged(self, method: str, args: tuple[object, ...], before: object, after: object,
                   value: object) -> None:
        __tracebackhide__ = True
        if before != after:
            self._violation(method, args, value,
                            f"the adapter mutated the RequestView it was given (before: "
                            f"{abbreviate(before, 80)}, after: {abbreviate(after, 80)}); "
                            "views are immutable snapshots: keep your own request state")

    # ---------------------------------------------------------- shared pool observations
    def num_free_blocks(self) -> int:
        return self._count("num_free_blocks", (), self._call(
            "num_free_blocks", self._raw.num_free_blocks), self._n)

    def free_block_ids(self) -> list[int]:
        value: object = self._call("free_block_ids", self._raw.free_block_ids)
        return self._ids("free_block_ids", (), value, "the free queue")


class GuardedManager(_Guard):
    """A ``KVCacheManagerAdapter`` whose every answer is validated (see the module doc)."""

    __slots__ = ("_cows", "_drained", "_events_per_op", "_fine", "_group_bs",
                 "_grouped", "_held", "_holds", "_longest", "_lost", "_moving", "_null",
                 "_null_new", "_ops", "_pins", "_pool_tokens", "_rebinding", "_spec",
                 "_spec_blocks", "_steps", "_tables", "_zeroing")

    def __init__(self, raw: object, *, impl: str, spec: KVCacheSpec, reserved: Sequence[int],
                 limit: CallLimit) -> None:
        super().__init__(raw, impl=impl, spec=spec, reserved=reserved, limit=limit)
        self._spec = spec
        # The adapter's form: one list per group (spec.kv_cache_groups) or a flat list.
        self._grouped = bool(spec.kv_cache_groups)
        self._null = null_of(spec)
        self._group_bs = tuple(spec.group_block_size(g) for g in range(len(spec.groups)))
        # The tables the answers imply, one list per group whatever the form (a single-group
        # adapter's table is the one-group case), and the holds: per request the real block
        # ids its tables hold, per block id the number of live requests holding it.
        self._tables: dict[str, list[list[int]]] = {}
        self._holds: dict[str, set[int]] = {}
        self._held: dict[int, int] = {}
        # Whether a table may change without an answer saying so (a grouped spec: entries a
        # window skips become null, even in a refused call): then it is read back after every
        # allocate_slots. A single-group table changes only by the answers (and, with
        # dedup_on_insert, by judged rebindings), so the hot path reads nothing back.
        self._moving = self._grouped
        # Groups whose allocate_slots answer may hold the null block (mamba: vLLM returns the
        # table from its previous end on, null padding and relocated speculative blocks
        # included; its tables are not append-only: the read-back judges them).
        self._null_new = frozenset(g for g, group in enumerate(spec.kv_cache_groups)
                                   if group.kind == "mamba")
        # Per group, the speculative blocks a table holds past its tokens' positions (mamba).
        self._spec_blocks = tuple(g.num_speculative_blocks for g in spec.groups)
        self._lost = False  # an adapter call raised: its state is unknown from then on
        # For the length bounds: the most tokens (lookahead included) of any request shown
        # to the adapter, and the state-changing calls since the last take_events.
        self._longest = 0
        self._ops = 0
        self._events_per_op = spec.num_blocks + len(spec.groups) + 1
        self._pool_tokens = spec.num_blocks * max(spec.group_block_size(g)
                                                  for g in range(len(spec.groups)))
        self._pins: PinLedger | None = None  # pinning_lookup: see follow_pins
        self._drained = 0  # self._ops at the last take_events (_ops only grows)
        # dedup_on_insert (judge_rebindings): the judge, and per request its last
        # allocate_slots as (start, end, self._ops after it).
        self._rebinding: RebindingJudge | None = None
        self._steps: dict[str, tuple[int, int, int]] = {}
        # Fine-grained partial hits (kvcheck.conformance.fine_grained): the copy-on-write
        # replacements seen in tables and not yet drained.
        self._fine = fine_grained_hits(spec)
        self._cows = CowLedger()
        # Worker-side block zeroing (kvcheck.conformance.block_zeroing): what the next
        # take_new_block_ids must drain; None without needs_kv_cache_zeroing.
        self._zeroing = ZeroingLedger(spec) if spec.needs_kv_cache_zeroing else None

    @property
    def grouped(self) -> bool:
        """Whether the adapter speaks the per-group form (``spec.kv_cache_groups`` given)."""
        return self._grouped

    # ---------------------------------------------------------- dedup_on_insert
    def judge_rebindings(self, judge: RebindingJudge) -> None:
        """From now on a table that differs from the one the answers imply is shown to
        ``judge`` (``kvcheck.conformance.rebinding``) before it is a violation: with
        ``dedup_on_insert`` an entry may have been rebound to an identical block, which the
        guard then follows as a release of the old block and a share of the new one."""
        self._rebinding = judge

    def _judge_table(self, rid: str, expected: list[int], ids: list[int]) -> tuple[bool, str]:
        """``ids``, ``rid``'s table as the adapter shows it, differs from ``expected``:
        ``(True, "")`` when the judge accepts it as rebindings (the guard then follows it),
        else ``(False, the note the violation ends with)``."""
        if self._rebinding is None:
            return False, ""
        start, end, ops = self._steps.get(rid, (0, 0, -1))
        # Fresh: no state-changing call since rid's allocate_slots, whose forward pass has
        # therefore not run.
        ok, note = self._rebinding.judge(rid, expected, ids, computed=end,
                                         fresh=start if ops == self._ops else None)
        if ok:
            self._set_tables(rid, [list(ids)])
        return ok, note

    def _follow_own_rebinding(self, rid: str, table: list[int], tail: list[int]) -> None:
        """Under ``dedup_on_insert``, right after ``allocate_slots(rid)`` answered: entries of
        its previous ``table`` may have been rebound during the call, and the block released
        handed out again; read the table first, so the hand-out checks see it (anything else
        wrong with it is left to the next ``get_block_ids``)."""
        value: object = self._call("get_block_ids", self._raw.get_block_ids, rid)
        ids = self._ids("get_block_ids", (rid,), value, "the block table")
        n = len(table)
        if ids[n:] == tail and ids[:n] != table:
            self._judge_table(rid, table, ids[:n])

    # ---------------------------------------------------------- the tables and the holds
    def _set_tables(self, rid: str, tables: list[list[int]]) -> None:
        """``rid``'s tables are now ``tables`` (read back, or rebound): the holds follow."""
        null = self._null
        now = {b for t in tables for b in t if b != null}
        before = self._holds.get(rid, set())
        held = self._held
        for b in before - now:
            left = held[b] - 1
            if left:
                held[b] = left
            else:
                del held[b]
        for b in now - before:
            held[b] = held.get(b, 0) + 1
        if any(tables):
            self._tables[rid], self._holds[rid] = tables, now
        else:
            self._tables.pop(rid, None)
            self._holds.pop(rid, None)

    def _extend(self, rid: str, hits: list[list[int]], new: list[list[int]]) -> None:
        """``rid``'s tables grow by the hits passed and the new ids returned (a table that
        cannot move, so nothing is read back: the hot path)."""
        tables = self._tables.get(rid)
        if tables is None:
            tables = self._tables[rid] = [[] for _ in self._group_bs]
            hold = self._holds[rid] = set()
        else:
            hold = self._holds[rid]
        held, null = self._held, self._null
        for table, part_hits, part_new in zip(tables, hits, new, strict=True):
            for b in part_hits:
                if b != null and b not in hold:
                    hold.add(b)
                    held[b] = held.get(b, 0) + 1
            for b in part_new:
                hold.add(b)
                held[b] = held.get(b, 0) + 1
            table.extend(part_hits)
            table.extend(part_new)

    def _owners(self, block: int, rid: str) -> list[str]:
        """The live requests other than ``rid`` holding ``block``."""
        return sorted(r for r, hold in self._holds.items() if r != rid and block in hold)

    # ---------------------------------------------------------- pinning_lookup
    def follow_pins(self) -> None:
        """The implementation declares ``pinning_lookup``: from now on lookups pin their hits
        (``kvcheck.conformance.pinning``), an ``allocate_slots`` may not hand a pinned block
        out anew, and ``release_computed`` drops a request's pins."""
        self._pins = PinLedger()

    @property
    def pin_ledger(self) -> PinLedger | None:
        """The pins outstanding (None: the implementation does not declare
        ``pinning_lookup``)."""
        return self._pins

    def new_step_starts(self) -> None:
        """``new_step_starts()`` (``SupportsNewStep``): passed on when the adapter has it (a
        no-op otherwise: it keeps no per-step state)."""
        fn: Callable[[], None] | None = getattr(self._raw, "new_step_starts", None)
        if fn is None:
            return None
        self._ops += 1
        return self._raising("new_step_starts", fn)

    @property
    def copy_on_writes(self) -> list[tuple[str, int, int, int, int]]:
        """The copy-on-write replacements seen in tables since the last
        ``take_kv_cache_block_copies``, as ``(rid, group, index, src, dst)`` (a copy)."""
        return list(self._cows.pending)

    def take_new_block_ids(self) -> list[int]:
        """``take_new_block_ids()`` (``SupportsBlockZeroing``) checked: a list of block ids,
        exactly the blocks handed out fresh in the recording groups since the last call
        (``kvcheck.conformance.block_zeroing``)."""
        __tracebackhide__ = True
        method, args = "take_new_block_ids", ()
        self._ops += 1
        value: object = self._raising(method, self._raw.take_new_block_ids)
        if (type(value) is not list and type(value) is not tuple) or any(
                type(b) is not int or not 0 <= b < self._n for b in value):
            self._violation(method, args, value,
                            f"must be a list of block ids in [0, num_blocks={self._n})")
        ids = [int(b) for b in cast("list[int]", value)]
        if self._zeroing is not None and not self._lost:
            problem = self._zeroing.drain(ids)
            if problem is not None:
                self._violation(method, args, value, problem)
        return ids

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        """``record_blocks_for_zeroing`` (``SupportsBlockZeroing``): the request's blocks from
        ``start_token`` on are owed to the next drain."""
        self._ops += 1
        fn: Callable[[str, int], None] = self._raw.record_blocks_for_zeroing
        self._raising("record_blocks_for_zeroing", fn, request_id, start_token)
        if self._zeroing is not None and not self._lost:
            self._zeroing.recorded(request_id, self.get_block_ids_per_group(request_id),
                                   start_token)

    def take_kv_cache_block_copies(self) -> list[tuple[int, int]]:
        """``take_kv_cache_block_copies()`` (``SupportsBlockCopies``) checked: the ``(src,
        dst)`` pairs, each copy-on-write replacement seen in a table since the last call among
        them, the others a Mamba group's state copies (see the module doc). An adapter without
        the method made no copies: ``[]``."""
        __tracebackhide__ = True
        fn: Callable[[], object] | None = getattr(self._raw, "take_kv_cache_block_copies",
                                                  None)
        pending = self._cows.take()
        value: object = []
        if fn is not None:
            self._ops += 1
            value = self._raising("take_kv_cache_block_copies", fn)
        method, args = "take_kv_cache_block_copies", ()
        if type(value) is not list and type(value) is not tuple:
            self._violation(method, args, value, "must be a list of (src_block_id, "
                            "dst_block_id) pairs")
        self._too_long(method, args, value, value, "the copies", self._n,
                       f"num_blocks={self._n} (a copy takes a new block)")
        pairs: list[tuple[int, int]] = []
        for pair in cast("list[object]", value):
            if ((type(pair) is not list and type(pair) is not tuple) or len(pair) != 2
                    or any(type(b) is not int or not 0 <= b < self._n for b in pair)
                    or any(b in self._reserved for b in pair)):
                self._violation(method, args, value,
                                f"{abbreviate(pair, 40)} is not a (src_block_id, "
                                f"dst_block_id) pair of block ids in [0, num_blocks={self._n})"
                                ", none reserved")
            pairs.append((int(pair[0]), int(pair[1])))
        if self._lost:
            return pairs
        twice = _duplicates([dst for _, dst in pairs])
        if twice:
            self._violation(method, args, value,
                            f"block {twice[0]} is the destination of two copies: each copy "
                            "takes a new block, and copies are drained once")
        left = list(pairs)
        order: list[int] = []  # the group of each pair, in the answer's order
        for rid, g, index, src, dst in pending:
            if (src, dst) not in left:
                self._violation(method, args, value,
                                f"allocate_slots({rid!r}) replaced its hit block {src} at "
                                f"index {index} of group {g} by the new block {dst} (a "
                                f"copy-on-write), but the copies drained lack ({src}, {dst})")
            left.remove((src, dst))
            owners = self._owners(dst, rid)
            if owners:
                self._violation(method, args, value,
                                f"the copy-on-write block {dst} of request {rid!r} is also "
                                f"held by {owners}: a copy-on-write block is private")
        for src, dst in pairs:
            match = [p for p in pending if (p[3], p[4]) == (src, dst)]
            if match:
                order.append(match[0][1])
                pending.remove(match[0])
                continue
            groups = sorted({g for tables in self._tables.values()
                             for g, table in enumerate(tables)
                             if src in table and self._spec.groups[g].kind == "mamba"})
            holders = sorted(r for r, hold in self._holds.items() if dst in hold)
            problem = ""
            if not groups:
                problem = (f"the copy ({src}, {dst}) matches no copy-on-write seen in a table, "
                           f"and block {src} is in no live request's Mamba table (only a "
                           "Mamba group copies a running request's own state)")
            elif holders:
                problem = (f"the copy ({src}, {dst}) of a Mamba state writes block {dst}, "
                           f"which request(s) {holders} hold")
            if problem:
                self._violation(method, args, value, problem)
            order.append(groups[0])
        if order != sorted(order):
            self._violation(method, args, value,
                            f"the copies come from groups {order} in that order; vLLM drains "
                            "them group by group, in group order")
        return pairs

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        """``take_boundary_state_offloads()`` (``SupportsBoundaryStateOffloads``) checked
        for shape: ``{request_id: [(group_id, block_id, boundary_tokens), ...]}`` with a
        group index of the spec, a block id in ``[0, num_blocks)`` (none reserved) and a
        positive token count. An adapter without the method hands nothing off: ``{}``. What
        the hand-offs must hold is a law (``kvcheck.conformance.boundary_offloads``)."""
        __tracebackhide__ = True
        fn: Callable[[], object] | None = getattr(self._raw, "take_boundary_state_offloads",
                                                  None)
        if fn is None:
            return {}
        self._ops += 1
        value = self._raising("take_boundary_state_offloads", fn)
        method = "take_boundary_state_offloads"
        if type(value) is not dict:
            self._violation(method, (), value, "must be a dict {request_id: [(group_id, "
                            "block_id, boundary_tokens), ...]}")
        out: dict[str, list[tuple[int, int, int]]] = {}
        for rid, entries in cast("dict[object, object]", value).items():
            if type(rid) is not str:
                self._violation(method, (), value, f"key {abbreviate(rid, 40)} is not a "
                                "request id (str)")
            out[rid] = self._offload_entries(method, (), value, entries)
        return out

    def finalize_partial_tail_offloads(self, request: RequestView, *,
                                       num_in_flight_tokens: int = 0,
                                       ) -> list[tuple[int, int, int]]:
        """``finalize_partial_tail_offloads(request)`` (``SupportsBoundaryStateOffloads``)
        checked for shape: a list of ``(group_id, block_id, boundary_tokens)``, at most one
        per group. An adapter without the method has no partial tails: ``[]``.
        ``num_in_flight_tokens`` (``async_scheduling``) goes to it only when not 0."""
        __tracebackhide__ = True
        fn: Callable[..., object] | None = getattr(
            self._raw, "finalize_partial_tail_offloads", None)
        if fn is None:
            return []
        self._ops += 1
        method = "finalize_partial_tail_offloads"
        args: tuple[object, ...] = (request,)
        if num_in_flight_tokens:
            value = self._raising(method, lambda: fn(
                request, num_in_flight_tokens=num_in_flight_tokens))
            args += (num_in_flight_tokens,)
        else:
            value = self._raising(method, fn, request)
        entries = self._offload_entries(method, args, value, value)
        twice = _duplicates([g for g, _, _ in entries])
        if twice:
            self._violation(method, args, value, f"group {twice[0]} hands off two partial "
                            "tails: a request keys at most one per group")
        return entries

    def _offload_entries(self, method: str, args: tuple[object, ...], value: object,
                         entries: object) -> list[tuple[int, int, int]]:
        """``entries`` checked as a list of ``(group_id, block_id, boundary_tokens)``."""
        __tracebackhide__ = True
        if type(entries) is not list and type(entries) is not tuple:
            self._violation(method, args, value, f"{abbreviate(entries, 40)} is not a list of "
                            "(group_id, block_id, boundary_tokens) triples")
        self._too_long(method, args, value, entries, "the hand-offs", self._n,
                       f"num_blocks={self._n} (one per block at most)")
        groups = len(self._spec.groups)
        out: list[tuple[int, int, int]] = []
        for entry in cast("list[object]", entries):
            if ((type(entry) is not list and type(entry) is not tuple) or len(entry) != 3
                    or any(type(x) is not int for x in entry)
                    or not 0 <= entry[0] < groups or not 0 <= entry[1] < self._n
                    or entry[1] in self._reserved or entry[2] <= 0):
                self._violation(method, args, value,
                                f"{abbreviate(entry, 40)} is not a (group_id, block_id, "
                                f"boundary_tokens) triple: a group index in [0, {groups}), a "
                                f"block id in [0, num_blocks={self._n}) not reserved, a "
                                "positive token count")
            out.append((int(entry[0]), int(entry[1]), int(entry[2])))
        return out

    def release_computed(self, request_id: str) -> None:
        fn: Callable[[str], None] = self._raw.release_computed
        self._ops += 1
        result = self._raising("release_computed", fn, request_id)
        if self._pins is not None:
            self._pins.release(request_id)
        return result

    def _check_pins(self, args: tuple[object, ...], value: object, rid: str,
                    new: list[int]) -> None:
        """``allocate_slots`` for ``rid`` returned the ``new`` ids: none may be pinned; the
        request's own pins become its references."""
        __tracebackhide__ = True
        assert self._pins is not None
        problem = self._pins.clash(rid, new)
        if problem is not None:
            self._violation("allocate_slots", args, value, problem)
        self._pins.consume(rid)
        self._pins.handed_out(new)

    def _raising(self, method: str, fn: Callable[[Unpack[_Args]], _T],
                 *args: Unpack[_Args]) -> _T:
        try:
            return self._call(method, fn, *args)
        except BaseException:
            self._lost = True
            raise

    # ---------------------------------------------------------- the manager
    # Each answer is checked once, in the per-group form (``*_per_group``, what the driver
    # calls): a single-group adapter's flat answer is the one-group case ``[answer]``, checked
    # by the flat rules (``_ids``) and named as the adapter wrote it. The protocol methods
    # (repros and scripted tests call them) hand back the adapter's own form.

    # Any: the protocol methods answer in the adapter's own form, flat (KVCacheManagerAdapter)
    # or per group (SupportsKVCacheGroups): the guard stands for both protocols.
    def get_computed_blocks(self, request: RequestView) -> tuple[Any, int]:
        __tracebackhide__ = True
        hits, num = self.get_computed_blocks_per_group(request)
        return adapter_form(self._spec, hits), num

    def get_computed_blocks_per_group(self, request: RequestView) -> tuple[list[list[int]], int]:
        """``get_computed_blocks(request)`` checked, its hits one list per group."""
        __tracebackhide__ = True
        before = _view_state(request)
        value: object = self._call("get_computed_blocks", self._raw.get_computed_blocks, request)
        args = (request,)
        if before is not None:
            self._unchanged("get_computed_blocks", args, before, _view_state(request), value)
        if (type(value) is not tuple and type(value) is not list) or len(value) != 2:
            form = ("one list of block ids per KV-cache group" if self._grouped
                    else "block_ids: list[int]")
            self._violation("get_computed_blocks", args, value,
                            f"must be a pair ({form}, num_computed_tokens: int)")
        total = request.num_tokens
        if total > self._longest:
            self._longest = total
        hits = self._answer_groups("get_computed_blocks", args, value[0], "the hit block ids",
                                   nulls=True)
        num = value[1]
        if type(num) is not int or not 0 <= num <= total:
            self._violation("get_computed_blocks", args, value,
                            f"num_computed_tokens must be an int in [0, {total}] (the "
                            "request's tokens)")
        for g, (ids, bs) in enumerate(zip(hits, self._group_bs, strict=True)):
            if len(ids) != -(-num // bs):
                self._violation("get_computed_blocks", args, value,
                                f"{num} hit tokens fill {-(-num // bs)} block(s) of group {g} "
                                f"(block size {bs}), but its list has {len(ids)} ids"
                                if self._grouped else
                                f"{num} hit tokens fill {-(-num // bs)} block(s) of {bs}, but "
                                f"{len(ids)} block ids were returned")
        if self._pins is not None:
            self._pins.pin(request.request_id, pinned_ids(hits, null=self._null))
        return hits, num

    def _answer_groups(self, method: str, args: tuple[object, ...], value: object, what: str,
                       *, nulls: bool) -> list[list[int]]:
        """``value`` checked as the block ids of an answer, as one list per group: a
        single-group adapter's list by the flat rules (``_ids``: no id twice, none reserved),
        a grouped adapter's lists by ``_groups``."""
        __tracebackhide__ = True
        if not self._grouped:
            return [self._ids(method, args, value, what)]
        return self._groups(method, args, value, what, nulls=nulls)

    def _groups(self, method: str, args: tuple[object, ...], value: object, what: str, *,
                nulls: bool) -> list[list[int]]:
        """``value`` checked as one list of block ids per group (length, types, range,
        reserved ids, an id twice across the groups; ``0`` allowed only with ``nulls``)."""
        __tracebackhide__ = True
        n = len(self._group_bs)
        if (type(value) is not list and type(value) is not tuple) or len(value) != n:
            self._violation(method, args, value,
                            f"{what} must be a list of {n} lists of int (one per KV-cache "
                            f"group, spec.kv_cache_groups order), not "
                            f"{abbreviate(value, 40)}")
        out: list[list[int]] = []
        seen: set[int] = set()
        for g, part in enumerate(value):
            label = f"{what} of group {g}"
            if nulls or g in self._null_new:  # a position each: null ids repeat
                positions = -(-self._longest // self._group_bs[g]) + self._spec_blocks[g]
                self._too_long(method, args, value, part, label, max(self._n, positions),
                               f"num_blocks={self._n} or the {positions} positions of the "
                               f"longest request passed in so far, {self._longest} tokens"
                               + (f", and {self._spec_blocks[g]} speculative blocks"
                                  if self._spec_blocks[g] else "") + ", whichever is more")
            else:
                self._too_long(method, args, value, part, label, self._n,
                               f"distinct block ids of a pool of num_blocks={self._n}")
            problem = _ints_problem(part, label)
            if problem is not None:
                self._violation(method, args, value, problem)
            ids = list(cast("list[int]", part))
            real = [b for b in ids if b != NULL_BLOCK]
            if NULL_BLOCK in ids and not nulls and g not in self._null_new:
                problem = (f"{label} contains the null block {NULL_BLOCK}; a newly allocated "
                           "block is never the null block")
            elif real and (min(real) < 0 or max(real) >= self._n):
                bad = min(real) if min(real) < 0 else max(real)
                problem = f"block id {bad} in {label} is outside [0, num_blocks={self._n})"
            elif not self._reserved.isdisjoint(real):
                problem = (f"{label} contains reserved block id(s) "
                           f"{sorted(self._reserved.intersection(real))} (only the null block "
                           f"{NULL_BLOCK} may appear, as a skipped position)")
            elif len(set(real)) != len(real) or not seen.isdisjoint(real):
                dup = sorted(set(_duplicates(real)) | seen.intersection(real))
                problem = (f"{label} lists block id(s) {abbreviate(dup, 80)} twice (in one "
                           "group or in two groups: a block belongs to one group at a time)")
            if problem is not None:
                self._violation(method, args, value, problem)
            seen.update(real)
            out.append(ids)
        return out

    def _allocate(self, request: RequestView, num_new_tokens: int,
                  num_new_computed_tokens: int, hits: object, hits_copy: object,
                  num_lookahead_tokens: int, external: dict[str, object],
                  ) -> tuple[tuple[object, ...], object]:
        """``(args, answer)`` of the adapter's ``allocate_slots``, given ``hits_copy`` (its own
        copy of the hits: the caller's ``hits`` stay what they were) and ``external`` (the
        external-KV keyword arguments not at their default); the view checked unchanged.
        ``args`` is what violations show (the lookahead only when non-zero, the external
        arguments as a trailing dict)."""
        __tracebackhide__ = True
        args: tuple[object, ...] = (request, num_new_tokens, num_new_computed_tokens, hits)
        if num_lookahead_tokens or external:
            args += (num_lookahead_tokens,)
        self._ops += 1
        try:  # the most positions this call may give the request (for the length bounds)
            tokens = max(request.num_tokens, request.num_computed_tokens
                         + num_new_computed_tokens + num_new_tokens) + num_lookahead_tokens
        except (AttributeError, TypeError):  # not a RequestView: the answer checks say so
            tokens = 0
        if tokens > self._longest:
            self._longest = tokens
        before = _view_state(request)
        call_args = (num_new_tokens, num_new_computed_tokens, hits_copy) + args[4:]
        if external:
            value: object = self._raising(
                "allocate_slots", lambda: self._raw.allocate_slots(request, *call_args,
                                                                    **external))
            args += (external,)
        else:
            value = self._raising("allocate_slots", self._raw.allocate_slots, request,
                                  *call_args)
        if before is not None:
            self._unchanged("allocate_slots", args, before, _view_state(request), value)
        return args, value

    def allocate_slots(self, request: RequestView, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_block_ids: Sequence[Any] = (),  # Any: either form
                       num_lookahead_tokens: int = 0, *,
                       num_external_computed_tokens: int = 0,
                       delay_cache_blocks: bool = False,
                       num_encoder_tokens: int = 0,
                       full_sequence_must_fit: bool = False, reserved_blocks: int = 0,
                       has_scheduled_reqs: bool = True,
                       skip_zeroing_group_ids: Sequence[int] = (),
                       num_in_flight_tokens: int = 0) -> Any:  # Any: either form
        __tracebackhide__ = True
        hits = ([list(h) for h in new_computed_block_ids] if self._grouped
                else [list(new_computed_block_ids)])
        gates: dict[str, bool | int | list[int]] = {name: value for name, value, default in (
            ("full_sequence_must_fit", full_sequence_must_fit, False),
            ("reserved_blocks", reserved_blocks, 0),
            ("has_scheduled_reqs", has_scheduled_reqs, True),
            ("num_in_flight_tokens", num_in_flight_tokens, 0)) if value != default}
        if skip_zeroing_group_ids:  # block_zeroing: only when non-empty
            gates["skip_zeroing_group_ids"] = list(skip_zeroing_group_ids)
        new = self.allocate_slots_per_group(
            request, num_new_tokens, num_new_computed_tokens, hits, num_lookahead_tokens,
            num_external_computed_tokens=num_external_computed_tokens,
            delay_cache_blocks=delay_cache_blocks, num_encoder_tokens=num_encoder_tokens,
            gates=gates or None)
        return None if new is None else adapter_form(self._spec, new)

    def allocate_slots_per_group(self, request: RequestView, num_new_tokens: int,
                                 num_new_computed_tokens: int,
                                 new_computed_block_ids: Sequence[Sequence[int]],
                                 num_lookahead_tokens: int = 0, *,
                                 num_external_computed_tokens: int = 0,
                                 delay_cache_blocks: bool = False,
                                 num_encoder_tokens: int = 0,
                                 gates: Mapping[str, bool | int | list[int]] | None = None,
                                 ) -> list[list[int]] | None:
        """``allocate_slots`` checked, the hits passed and the new ids one list per group
        (the adapter is called with, and violations show, its own form): the new ids are no
        null block, none of the hits and held by no other request; the tables follow (read
        back where they may move; rebindings judged under ``dedup_on_insert``). A refused
        admission holds nothing (all-or-nothing): where tables may move, that is read back
        too; a single-group table a refused call kept breaks conservation instead
        (``kvcheck.conformance.laws``). External-KV arguments (``external_kv``) go to the
        adapter only when not at their default; the answer then also lists the external
        tokens' blocks (a window may leave nulls before them in a table). Encoder tokens
        (``cross_attention``) go to the adapter the same way, only when there are some, and
        so do ``gates``, vLLM 0.33's admission gates (``admission_gates``: the keyword
        arguments ``full_sequence_must_fit``, ``reserved_blocks``, ``has_scheduled_reqs``,
        only those not at their default)."""
        __tracebackhide__ = True
        given = [list(h) for h in new_computed_block_ids]  # [] for a running request
        external = _NO_EXTERNAL  # the hot path: no dict built
        if num_external_computed_tokens or delay_cache_blocks:
            external = {"num_external_computed_tokens": num_external_computed_tokens}
            if delay_cache_blocks:
                external["delay_cache_blocks"] = True
        if num_encoder_tokens:
            external = {**external, "num_encoder_tokens": num_encoder_tokens}
        if gates:
            external = {**external, **gates}
        args, value = self._allocate(request, num_new_tokens, num_new_computed_tokens,
                                     adapter_form(self._spec, given),
                                     adapter_form(self._spec, [list(h) for h in given]),
                                     num_lookahead_tokens, external)
        hits = given + [[] for _ in range(len(self._group_bs) - len(given))]
        new = None if value is None else self._answer_groups(
            "allocate_slots", args, value, "the new block ids", nulls=False)
        if self._lost:
            return new
        rid = request.request_id
        old = self._tables.get(rid)
        # External tokens' blocks are part of the answer: the table is read back to check it.
        moving = self._moving or bool(num_external_computed_tokens)
        if new is None:
            if moving:  # entries may change even in a refused call
                self._follow(rid, [list(t) for t in old] if old is not None else
                             [[] for _ in self._group_bs],
                             f"allocate_slots({rid!r}) returned None"
                             + (" for a request holding no blocks" if old is None else "")
                             + "; then get_block_ids")
            return None
        fresh = [b for part in new for b in part]
        if self._null_new:  # mamba: nulls padding the answer, a relocated block of its own
            fresh = [b for b in fresh if b != NULL_BLOCK]
        if self._pins is not None:
            self._check_pins(args, value, rid, fresh)
        dedup = self._rebinding is not None and self._rebinding.declared
        if self._rebinding is not None:
            start = request.num_computed_tokens + num_new_computed_tokens
            self._steps[rid] = (start, start + num_new_tokens, self._ops)
            if dedup and old is not None:
                self._follow_own_rebinding(rid, old[0], hits[0] + new[0])
                old = self._tables.get(rid)
        # A window may skip a hit passed in with external tokens (vLLM 0.33 does not adopt
        # it), which may then come back as a fresh block: there the table read back below
        # (never a block twice) is the check.
        passed = (set() if num_external_computed_tokens and self._grouped
                  else {b for h in hits for b in h})
        for b in fresh:
            if b in passed:
                self._new_is_a_hit(args, value, b)
        if moving:
            expected = ([list(t) for t in old] if old is not None
                        else [[] for _ in self._group_bs])
            for table, part_hits, part_new in zip(expected, hits, new, strict=False):
                table.extend(part_hits)
                table.extend(part_new)
            cow: dict[int, list[int]] = {}
            cow_at: dict[int, int] = {}
            if self._fine and old is None:
                # A hit ending inside a block: its last hit block may be replaced by the
                # first new id (the copy-on-write block), the rest of the answer after it.
                # With external tokens the answer lists only the blocks after the hits, so
                # the copy replaces the hit in place and only the table shows it.
                for g in partial_hit_groups(self._spec, hits, num_new_computed_tokens):
                    part_hits, part_new = hits[g], new[g]
                    if num_external_computed_tokens:
                        cow_at[g] = len(part_hits) - 1
                    elif part_new and part_new[0] != NULL_BLOCK:
                        cow[g] = part_hits[:-1] + part_new
            tables = self._follow(
                rid, expected, f"allocate_slots({rid!r}) returned "
                f"{abbreviate(value)}; then get_block_ids",
                pad_at=([len(t) - len(n) for t, n in zip(expected, new, strict=False)]
                        if num_external_computed_tokens else None), cow=cow, cow_at=cow_at)
            for g in cow:
                index = len(hits[g]) - 1
                if tables[g][index] == new[g][0] != hits[g][index]:
                    self._cows.record(rid, g, index, hits[g][index], new[g][0])
            for g, index in cow_at.items():
                dst = tables[g][index]
                # A hit of another group there is a block listed twice, which _follow's read
                # of the tables refused already; a block another request holds is refused
                # below with the new ids.
                if dst not in (hits[g][index], NULL_BLOCK):
                    fresh.append(dst)
                    self._cows.record(rid, g, index, hits[g][index], dst)

        else:
            mine = self._holds.get(rid, ())
            for b in fresh:
                if b in mine:
                    self._new_is_held(args, value, b, [rid])
            self._extend(rid, hits, new)
        held = self._held
        clash = [b for b in fresh if held.get(b, 0) > 1]
        if clash and dedup:
            # A rebinding since the holders' tables were last read may have released it.
            for owner in sorted({r for b in clash for r in self._owners(b, rid)}):
                self.get_block_ids(owner)
            clash = [b for b in fresh if held.get(b, 0) > 1]
        if clash:
            self._new_is_held(args, value, clash[0], self._owners(clash[0], rid))
        if self._zeroing is not None:
            self._zeroing.allocated(
                rid, self._tables[rid], new,
                request.num_computed_tokens + num_new_computed_tokens,
                num_external_computed_tokens,
                cast("list[int]", (gates or {}).get("skip_zeroing_group_ids", [])))
        return new

    def _new_is_a_hit(self, args: tuple[object, ...], value: object, block: int) -> NoReturn:
        __tracebackhide__ = True
        self._violation("allocate_slots", args, value,
                        f"block {block} is one of the cache hits passed in "
                        "(new_computed_block_ids); allocate_slots returns only newly "
                        "allocated blocks")

    def _new_is_held(self, args: tuple[object, ...], value: object, block: int,
                     owners: list[str]) -> NoReturn:
        __tracebackhide__ = True
        self._violation("allocate_slots", args, value,
                        f"block {block} is handed out anew but request(s) {owners} still "
                        "hold it (only cache hits passed back may be shared)")

    def free(self, request_id: str) -> None:
        # None-returning calls pass the adapter's answer on as it is (repros show it).
        fn: Callable[[str], None] = self._raw.free
        self._ops += 1
        if self._pins is not None:
            self._pins.check_free(request_id)
        result = self._raising("free", fn, request_id)
        self._forget(request_id)
        return result

    def _forget(self, request_id: str) -> None:
        """Drop a freed request's tables and its holds."""
        self._steps.pop(request_id, None)
        self._set_tables(request_id, [])

    def get_block_ids(self, request_id: str) -> Any:  # Any: either form
        __tracebackhide__ = True
        return adapter_form(self._spec, self.get_block_ids_per_group(request_id))

    def get_block_ids_per_group(self, request_id: str) -> list[list[int]]:
        """``get_block_ids(request_id)`` checked against the tables the answers imply, one
        table per group."""
        __tracebackhide__ = True
        if self._lost:
            value: object = self._call("get_block_ids", self._raw.get_block_ids, request_id)
            return self._answer_groups("get_block_ids", (request_id,), value,
                                       self._table_what, nulls=True)
        return self._follow(request_id, self._known_tables(request_id), "")

    def get_block_ids_many(self, request_ids: Sequence[str]) -> list[list[list[int]]]:
        """``get_block_ids_per_group`` of each of ``request_ids``, in order, each answer
        checked as that method's. An adapter object that has its own
        ``get_block_ids_many(request_ids)`` answers them in one call (kvcheck's ``exec:``
        proxies do: the requests go down the pipe together instead of one round trip each);
        otherwise they are asked one by one."""
        __tracebackhide__ = True
        rids = list(request_ids)
        values = None if self._lost else self._ask_many("get_block_ids", "get_block_ids_many",
                                                        rids, "answer per request")
        if values is None:
            return [self.get_block_ids_per_group(r) for r in rids]
        return [self._follow(rid, self._known_tables(rid), "", value=value)
                for rid, value in zip(rids, values, strict=True)]

    def _known_tables(self, rid: str) -> list[list[int]]:
        """What ``rid``'s tables must be now: the last ones read or implied ([] per group for
        a request that holds nothing)."""
        old = self._tables.get(rid)
        return [list(t) for t in old] if old is not None else [[] for _ in self._group_bs]

    def _ask_many(self, method: str, many: str, keys: Sequence[object], unit: str,
                  ) -> list[object] | None:
        """The adapter's own bulk read ``many`` (``ref_cnts``, ``*_many``) of ``keys``, in
        one call of ``method``'s, checked to be a list of one ``unit`` per key; None where the
        adapter has no such method (ask key by key) or there is no key."""
        __tracebackhide__ = True
        bulk = getattr(self._raw, many, None)
        if bulk is None or not keys:
            return None
        values: object = self._call(method, bulk, keys)
        if type(values) is not list or len(values) != len(keys):
            self._violation(method, tuple(keys), values, f"must be one {unit} ({len(keys)})")
        return values

    @property
    def _table_what(self) -> str:
        return "the block tables" if self._grouped else "the block table"

    def _follow(self, rid: str, expected: list[list[int]], context: str,
                pad_at: list[int] | None = None,
                cow: Mapping[int, list[int]] | None = None,
                cow_at: Mapping[int, int] | None = None,
                value: object = _ASK) -> list[list[int]]:
        """Read ``rid``'s tables, check them against ``expected`` (the previous tables + the
        hits + the new ids; entries may have become null where there is a null block, or
        been rebound under ``dedup_on_insert``; with ``pad_at``, per group the end of the
        hits, after which nulls may have been inserted among the new ids (external tokens:
        a window's skipped blocks come before the external ones, a Mamba group's also
        between its external state block and its running one); with ``cow``, per
        group the table its copy-on-write would make, accepted too; with ``cow_at``, per
        group the index of a hit that a copy-on-write block not in the answer may have
        replaced in place), and remember them.
        ``context`` (the call before, if any) ends the message; ``value``: the answer, when
        a bulk read (``get_block_ids_many``) has asked already."""
        __tracebackhide__ = True
        if value is _ASK:
            value = self._call("get_block_ids", self._raw.get_block_ids, rid)
        # A table holds shared hits, but never a block twice (nor, grouped, in two groups).
        tables = self._answer_groups("get_block_ids", (rid,), value, self._table_what,
                                     nulls=True)
        null = self._null
        if cow_at:
            expected = [list(t) for t in expected]
            for g, at in cow_at.items():
                got, want = tables[g], expected[g]
                if at < min(len(got), len(want)) and got[at] not in (want[at], null):
                    want[at] = got[at]
        padded = [False] * len(expected)
        if pad_at is not None and null is not None:
            padded = [_table_matches(got[:at], want[:at], null)
                      and _nulls_inserted(got[at:], want[at:], null)
                      for got, want, at in zip(tables, expected, pad_at, strict=False)]
            expected = [want[:at] + [null] * max(0, len(got) - len(want)) + want[at:]
                        for got, want, at in zip(tables, expected, pad_at, strict=False)]
        for g, (got, want) in enumerate(zip(tables, expected, strict=True)):
            if padded[g] or _table_matches(got, want, null) or (
                    cow and g in cow and _table_matches(got, cow[g], null)):
                continue
            rebound, note = (False, "") if self._grouped else self._judge_table(rid, want, got)
            if rebound:
                continue
            where = (f"group {g}'s table must be {abbreviate(want)} with some entries "
                     "possibly replaced by the null block 0" if self._grouped else
                     f"the block table must be {abbreviate(want)}")
            self._violation("get_block_ids", (rid,), value,
                            f"{where} (the previous table + the hits passed to allocate_slots "
                            "+ the new ids it returned; [] after free or for an unknown "
                            "request)" + (f" [{context}]" if context else "") + note)
        if not self._lost:
            self._set_tables(rid, tables)
        return tables

    def cache_blocks(self, request: RequestView, num_computed_tokens: int) -> None:
        """``cache_blocks`` (``external_kv``): its answer passed on as it is."""
        self._ops += 1
        fn: Callable[[RequestView, int], None] = self._raw.cache_blocks
        return self._raising("cache_blocks", fn, request, num_computed_tokens)

    def evict_blocks(self, block_ids: Sequence[int]) -> None:
        """``evict_blocks`` (``evict_blocks``): tables and holds are unchanged by it."""
        self._ops += 1
        fn: Callable[[Sequence[int]], None] = self._raw.evict_blocks
        return self._raising("evict_blocks", fn, list(block_ids))

    def reset_prefix_cache(self) -> bool:
        __tracebackhide__ = True
        self._ops += 1
        value: object = self._raising("reset_prefix_cache", self._raw.reset_prefix_cache)
        if type(value) is not bool:
            self._violation("reset_prefix_cache", (), value,
                            f"must be a bool, not a {_type_name(value)}")
        return value

    # ---------------------------------------------------------- optional capabilities
    def ref_cnt(self, block_id: int) -> int:
        value: object = self._call("ref_cnt", self._raw.ref_cnt, block_id)
        if type(value) is not int or value < 0:
            self._ref_cnt_violation(block_id, value)
        return value

    def ref_cnts(self, block_ids: Sequence[int]) -> list[int]:
        """``ref_cnt`` of each of ``block_ids``, in order, each answer checked as
        ``ref_cnt``'s. An adapter object that has its own ``ref_cnts(block_ids)`` answers them
        in one call (kvcheck's ``exec:`` proxies do: the requests of a sweep over the pool
        go down the pipe together instead of one round trip each); otherwise ``ref_cnt`` is
        asked block by block."""
        ids = list(block_ids)
        values = self._ask_many("ref_cnt", "ref_cnts", ids, "count per block")
        if values is None:
            return [self.ref_cnt(b) for b in ids]
        for block_id, value in zip(ids, values, strict=True):
            if type(value) is not int or value < 0:
                self._ref_cnt_violation(block_id, value)
        return cast("list[int]", values)

    def _ref_cnt_violation(self, block_id: int, value: object) -> NoReturn:
        __tracebackhide__ = True
        self._violation("ref_cnt", (block_id,), value, "must be an int >= 0" if type(value)
                        is int else f"must be an int >= 0, not a {_type_name(value)}")

    def block_hashes(self, request_id: str) -> list[bytes]:
        __tracebackhide__ = True
        value: object = self._call("block_hashes", self._raw.block_hashes, request_id)
        return self._checked_hashes(request_id, value)

    def block_hashes_many(self, request_ids: Sequence[str]) -> list[list[bytes]]:
        """``block_hashes`` of each of ``request_ids``, in order, each answer checked as
        ``block_hashes``'s; in one call to the adapter's own ``block_hashes_many`` where it
        has one (as ``get_block_ids_many``)."""
        __tracebackhide__ = True
        rids = list(request_ids)
        values = self._ask_many("block_hashes", "block_hashes_many", rids, "answer per request")
        if values is None:
            return [self.block_hashes(r) for r in rids]
        return [self._checked_hashes(rid, value) for rid, value in zip(rids, values, strict=True)]

    def _checked_hashes(self, request_id: str, value: object) -> list[bytes]:
        __tracebackhide__ = True
        if type(value) is not list and type(value) is not tuple:
            self._violation("block_hashes", (request_id,), value,
                            f"must be a list of bytes, not a {_type_name(value)}")
        most = max(self._pool_tokens, self._longest)
        self._too_long("block_hashes", (request_id,), value, value, "the block hashes", most,
                       f"at most one per token of the pool, {self._pool_tokens}, or of the "
                       f"longest request passed in so far, {self._longest}")
        for h in value:
            if not isinstance(h, (bytes, bytearray)):
                self._violation("block_hashes", (request_id,), value,
                                f"must be a list of bytes; element {abbreviate(h, 40)} is a "
                                f"{_type_name(h)}")
        return list(value)

    def take_events(self) -> list[KVEvent]:
        __tracebackhide__ = True
        value: object = self._call("take_events", self._raw.take_events)
        if type(value) is not list and type(value) is not tuple:
            self._violation("take_events", (), value,
                            f"must be a list of dicts, not a {_type_name(value)}")
        ops, self._drained = self._ops - self._drained, self._ops
        self._too_long("take_events", (), value, value, "the events",
                       (ops + 1) * self._events_per_op,
                       f"{self._events_per_op} per state-changing call, {ops} since the last "
                       "take_events, plus one")
        for event in value:
            if not isinstance(event, dict) or "type" not in event:
                self._violation("take_events", (), value,
                                f"every event must be a dict with a 'type' key; got "
                                f"{abbreviate(event, 60)}")
            self._event_sizes(value, event, self._event_tokens())
        return list(value)

    def _event_tokens(self) -> int:
        """The most entries a list field of one event may have: the pool's tokens, or (a Mamba
        group, whose stores' ``token_ids`` span its null blocks too) the longest request's
        tokens when more."""
        if self._null_new and self._longest > self._pool_tokens:
            return self._longest
        return self._pool_tokens

    def take_event_batch(self, ts: float) -> bytes:
        """The encoded batch: bytes, at most what the events since the last drain can take
        (the events bound of ``take_events``, each at most the pool's tokens and hashes at
        9 bytes apiece, the widest msgpack int, plus 1 KiB of fields)."""
        __tracebackhide__ = True
        value: object = self._call("take_event_batch", self._raw.take_event_batch, ts)
        if not isinstance(value, (bytes, bytearray, memoryview)):
            self._violation("take_event_batch", (ts,), value,
                            f"must be bytes (the msgpack payload), not a {_type_name(value)}")
        payload = bytes(value)
        ops, self._drained = self._ops - self._drained, self._ops
        most = (ops + 1) * self._events_per_op * (2 * 9 * self._event_tokens() + 1024)
        if len(payload) > most:
            self._violation("take_event_batch", (ts,), f"<{len(payload)} bytes>",
                            f"{len(payload)} bytes, more than the {most} the events of "
                            f"{ops} state-changing calls can take")
        return payload

    def _event_sizes(self, value: object, event: Mapping[object, object], tokens: int) -> None:
        """One event of a ``take_events`` answer: at most ``_EVENT_FIELDS`` fields, each list
        field at most ``tokens`` (the pool's) entries."""
        __tracebackhide__ = True
        if len(event) > _EVENT_FIELDS:
            self._violation("take_events", (), value,
                            f"an event has {len(event)} fields, more than the {_EVENT_FIELDS} "
                            f"an event can have: {abbreviate(event, 60)}")
        for key, field in event.items():
            self._too_long("take_events", (), value, field, f"field {abbreviate(key, 30)} of "
                           f"a {abbreviate(event['type'], 30)} event", tokens,
                           f"the tokens of the whole pool, num_blocks * block_size = "
                           f"{self._pool_tokens}" + (
                               f", or of the longest request passed in so far, {tokens} (a "
                               "Mamba group's stores span its null blocks)"
                               if tokens > self._pool_tokens else ""))

    def slot_mapping(self, request_id: str, start: int, end: int) -> list[int]:
        __tracebackhide__ = True
        args = (request_id, start, end)
        value: object = self._call("slot_mapping", self._raw.slot_mapping, *args)
        self._too_long("slot_mapping", args, value, value, "the slot mapping", max(0, end - start),
                       "one slot per position in [start, end)")
        problem = _ints_problem(value, "the slot mapping")
        if problem is not None:
            self._violation("slot_mapping", args, value, problem)
        return cast("list[int]", value)  # a list (or tuple) of int: checked just above

    def check_invariants(self) -> None:
        fn: Callable[[], None] = self._raw.check_invariants
        return self._call("check_invariants", fn)

    # ------------------------------------------------- capability "batch_metadata"
    # Run under the call limit and checked for shape and types only; the values are compared
    # with the reference by conformance/test_batch_metadata.py.
    def _int_lists(self, method: str, args: tuple[object, ...], value: object,
                   names: tuple[str, ...],
                   bounds: Sequence[tuple[int, str]]) -> list[list[int]]:
        """``value`` checked as ``len(names)`` lists of int, list ``i`` at most ``bounds[i] =
        (entries, why)`` long (lengths first)."""
        __tracebackhide__ = True
        if (type(value) is not tuple and type(value) is not list) or len(value) != len(names):
            self._violation(method, args, value,
                            f"must be a tuple of {len(names)} lists of int ({', '.join(names)})")
        for name, part, (bound, why) in zip(names, value, bounds, strict=True):
            self._too_long(method, args, value, part, name, bound, why)
        parts: list[list[int]] = []
        for name, part in zip(names, value, strict=True):
            problem = _ints_problem(part, name)
            if problem is not None:
                self._violation(method, args, value, problem)
            parts.append(list(cast("list[int]", part)))
        return parts

    def build_batch(self, block_tables: Sequence[Sequence[int]],
                    num_computed_tokens: Sequence[int], num_scheduled_tokens: Sequence[int],
                    num_padded_tokens: int, dcp_world_size: int = 1, dcp_rank: int = 0,
                    cp_kv_cache_interleave_size: int = 1,
                    ) -> tuple[list[int], list[int], list[int]]:
        __tracebackhide__ = True
        args = (block_tables, num_computed_tokens, num_scheduled_tokens, num_padded_tokens,
                dcp_world_size, dcp_rank, cp_kv_cache_interleave_size)
        value: object = self._call("build_batch", self._raw.build_batch, *args)
        scheduled = sum(int(n) for n in num_scheduled_tokens)
        tokens = (num_padded_tokens, f"num_padded_tokens={num_padded_tokens}")
        per_token = (max(num_padded_tokens, scheduled),
                     f"one per scheduled token, {scheduled}")
        slots, positions, req_indices = self._int_lists(
            "build_batch", args, value, ("slot_mapping", "positions", "req_indices"),
            (tokens, per_token, per_token))
        if len(slots) != num_padded_tokens:
            self._violation("build_batch", args, value,
                            f"slot_mapping has {len(slots)} entries; it must have "
                            f"num_padded_tokens={num_padded_tokens} (padding is -1)")
        return slots, positions, req_indices

    def flashinfer_csr(self, block_tables: Sequence[Sequence[int]], seq_lens: Sequence[int],
                       ) -> tuple[list[int], list[int], list[int]]:
        __tracebackhide__ = True
        args = (block_tables, seq_lens)
        value: object = self._call("flashinfer_csr", self._raw.flashinfer_csr, *args)
        num_reqs = len(seq_lens)
        pages = max(sum(len(row) for row in block_tables[:num_reqs]),
                    sum(-(-int(n) // self._bs) for n in seq_lens))
        indptr, indices, last = self._int_lists(
            "flashinfer_csr", args, value, ("kv_indptr", "kv_indices", "kv_last_page_len"),
            ((num_reqs + 1, f"len(seq_lens) + 1 = {num_reqs + 1}"),
             (pages, f"the pages of the {num_reqs} requests' rows, {pages}"),
             (num_reqs, f"one per request, len(seq_lens) = {num_reqs}")))
        return indptr, indices, last

    def req_to_token(self, block_tables: Sequence[Sequence[int]],
                     seq_lens: Sequence[int]) -> list[list[int]]:
        __tracebackhide__ = True
        args = (block_tables, seq_lens)
        value: object = self._call("req_to_token", self._raw.req_to_token, *args)
        if type(value) is not list and type(value) is not tuple:
            self._violation("req_to_token", args, value,
                            f"must be a list of rows (lists of int), not a {_type_name(value)}")
        num_reqs = len(seq_lens)
        self._too_long("req_to_token", args, value, value, "the answer", num_reqs,
                       f"one row per request, len(seq_lens) = {num_reqs}")
        width = max((int(n) for n in seq_lens), default=0)
        return self._int_lists("req_to_token", args, value,
                               tuple(f"row {b}" for b in range(len(value))),
                               [(width, f"the longest seq_len, {width}")] * len(value))


class GuardedBlockPool(_Guard):
    """A ``BlockPoolAdapter`` whose answers are checked for types, ranges, reserved ids and
    duplicates, under the per-call limit."""

    __slots__ = ()

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        __tracebackhide__ = True
        value: object = self._call("get_new_blocks", self._raw.get_new_blocks, num_blocks)
        ids = self._ids("get_new_blocks", (num_blocks,), value, "the new block ids")
        if len(ids) != num_blocks:
            self._violation("get_new_blocks", (num_blocks,), value,
                            f"must return exactly {num_blocks} block ids")
        return ids

    def free_blocks(self, ordered_block_ids: Sequence[int]) -> None:
        fn: Callable[[list[int]], None] = self._raw.free_blocks
        return self._call("free_blocks", fn, list(ordered_block_ids))

    def touch(self, block_ids: Sequence[int]) -> None:
        fn: Callable[[list[int]], None] = self._raw.touch
        return self._call("touch", fn, list(block_ids))

    def cache_full_blocks(self, request: RequestView, block_ids: Sequence[int],
                          num_cached_blocks: int, num_full_blocks: int) -> None:
        __tracebackhide__ = True
        args = (request, list(block_ids), num_cached_blocks, num_full_blocks)
        before = _view_state(request)
        fn: Callable[[RequestView, list[int], int, int], None] = self._raw.cache_full_blocks
        value = self._call("cache_full_blocks", fn, *args)
        if before is not None:
            self._unchanged("cache_full_blocks", args, before, _view_state(request), value)
        return value

    def get_cached_block(self, block_hash: bytes) -> int | None:
        __tracebackhide__ = True
        value: object = self._call("get_cached_block", self._raw.get_cached_block, block_hash)
        if value is not None:
            if type(value) is not int:
                self._violation("get_cached_block", (block_hash,), value,
                                f"must be None or an int block id, not a {_type_name(value)}")
            self._ids("get_cached_block", (block_hash,), [value], "the cached block id")
        return value
