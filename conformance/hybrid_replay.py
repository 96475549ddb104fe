"""Replay of the hybrid golden scenarios (``kvcheck.conformance.hybrid_golden``,
docs/semantics.md#kv-cache-groups-hybrid-models)
through an implementation's manager, row by row.

After every row the replay compares what the implementation declares with the row's
recorded columns: the call's answer (per-group hits and hit tokens, new blocks, or None), the
block tables of every request of the scenario, the free queue (``free_queue_order``), the
ref count of every non-null block (``ref_counts``: the number of requests holding it in the
recorded tables), the KV events (``events``: type, ``group_idx`` under ``vllm-0.33`` and
none under ``vllm-0.10``, and the hashes), and ``block_hashes`` (``block_hashes``).

The spec names hashes ``Hn`` by first appearance; the replay binds each ``Hn`` to the bytes
the implementation shows for it (an event's hash, a request's ``block_hashes`` entry) the
first time, and then requires the same bytes for the same ``Hn`` and different bytes for a
different one. The ``cache`` column (the prefix-cache map) has no protocol method and is read
only through the hits and events it causes; 0.10.2's ``null_ref_cnt`` is not compared (a
negative count breaks ``ref_cnt``'s contract).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from kvcheck.conformance.errors import GoldenMismatch
from kvcheck.conformance.groups import NULL_BLOCK
from kvcheck.conformance.guard import read_ref_cnts
from kvcheck.conformance.hybrid_golden import GoldenEvent, GoldenRow, GoldenScenario
from kvcheck.conformance.loader import ImplHandle
from kvcheck.conformance.pinning import CAPABILITY as PINNING
from kvcheck.conformance.pinning import release_after_lookup
from kvcheck.conformance.protocol import (
    KIND_CAPABILITIES,
    KVEvent,
    RequestView,
    effective_capabilities,
)

__all__ = ["GoldenMismatch", "needed_capabilities", "replay_golden"]


def needed_capabilities(sc: GoldenScenario) -> list[str]:
    """The capabilities ``sc`` needs: ``kv_cache_groups``, one per group kind, and
    ``caching_off`` for a scenario with caching off (an implementation has them when its
    ``effective_capabilities`` under ``sc.profile`` do)."""
    needed = ["kv_cache_groups"] + [KIND_CAPABILITIES[g.kind] for g in sc.spec.kv_cache_groups]
    if not sc.spec.enable_caching:
        needed.append("caching_off")
    return needed


@dataclass
class _Hashes:
    """The binding of the spec's hash numbers to the implementation's hash bytes."""

    by_number: dict[int, bytes] = field(default_factory=dict)
    by_bytes: dict[bytes, int] = field(default_factory=dict)

    def bind(self, number: int, value: bytes) -> str | None:
        """Bind ``H<number>`` to ``value``; why that contradicts an earlier binding, if so."""
        old = self.by_number.get(number)
        if old is not None and old != value:
            return f"H{number} was {old.hex()[:16]}... earlier but is now {value.hex()[:16]}..."
        other = self.by_bytes.get(value)
        if other is not None and other != number:
            return (f"the spec's H{number} and H{other} are different hashes, but the "
                    f"implementation shows {value.hex()[:16]}... for both")
        self.by_number[number] = value
        self.by_bytes[value] = number
        return None


#: ``replay_golden``'s ``fail(row, column, expected, got)``: raises GoldenMismatch.
_Fail = Callable[[GoldenRow, str, object, object], None]


def _groups(value: Iterable[Iterable[int]]) -> list[list[int]]:
    return [list(part) for part in value]


def _expected_groups(groups: tuple[tuple[int, ...], ...]) -> list[list[int]]:
    return [list(part) for part in groups]


def replay_golden(impl: ImplHandle, sc: GoldenScenario) -> None:
    """Replay ``sc`` on a fresh manager of ``impl``.

    Raises:
        GoldenMismatch: at the first row where a declared column differs.
        UnsupportedSpec: the factory declines the scenario's spec.
    """
    __tracebackhide__ = True
    caps = effective_capabilities(impl.info, sc.profile)
    # Any: the manager speaks the per-group protocol (SupportsKVCacheGroups) for this grouped
    # spec, which ManagerWithCapabilities (the flat form) does not type.
    mgr: Any = impl.make_manager(sc.spec)
    ngroups = sc.num_groups
    transcript: list[str] = []
    hashes = _Hashes()
    views = {req.request_id: RequestView(req.request_id, req.prompt_token_ids)
             for req in sc.requests}
    last_hits: dict[str, tuple[list[list[int]], int]] = {}
    # pinning_lookup: requests whose lookup no allocate_slots has ended yet (kept pins).
    pinning = PINNING in impl.info.capabilities
    looked_up: set[str] = set()

    def fail(row: GoldenRow, column: str, expected: object, got: object) -> None:
        __tracebackhide__ = True
        raise GoldenMismatch(
            f"golden scenario {sc.name} ({sc.profile}: {sc.title}), row {row.index} "
            f"{_call_text(row)}: {column} differs\n  expected (vLLM) {expected!r}\n"
            f"  got             {got!r}\ncalls so far:\n  " + "\n  ".join(transcript))

    for row in sc.rows:
        rid = row.request_id
        req = sc.request(rid)
        transcript.append(_call_text(row))
        if row.op == "get_computed_blocks":
            view = replace(views[rid], output_token_ids=(), num_computed_tokens=0)
            if rid in looked_up:  # looked up again: the earlier lookup's pins end first
                release_after_lookup(mgr, rid, pinning=pinning)
            hit_ids, hit_tokens = mgr.get_computed_blocks(view)
            got_hits = (_groups(hit_ids), hit_tokens)
            last_hits[rid] = got_hits
            looked_up.add(rid)
            want_hits = (_expected_groups(row.hit_blocks or ()), row.hit_tokens)
            if got_hits != want_hits:
                fail(row, "get_computed_blocks answer (per-group hits, hit tokens)",
                     want_hits, got_hits)
        elif row.op == "allocate_slots":
            view = replace(views[rid], output_token_ids=req.output_token_ids[
                :row.num_output_tokens], num_computed_tokens=row.num_computed_tokens)
            hits, num_hit = last_hits.pop(rid) if row.with_hits else ([], 0)
            if not row.with_hits:
                hits = [[] for _ in range(ngroups)]
            new = mgr.allocate_slots(view, row.num_new_tokens, num_hit, hits)
            if rid in looked_up:  # the allocation ends the lookup; a refusal keeps its pins
                looked_up.discard(rid)
                if new is None:
                    release_after_lookup(mgr, rid, pinning=pinning)
            got_new = None if new is None else _groups(new)
            want_new = None if row.refused else _expected_groups(row.new_blocks or ())
            if got_new != want_new:
                fail(row, "allocate_slots answer (per-group new blocks, or None)", want_new,
                     got_new)
        else:
            if rid in looked_up:
                looked_up.discard(rid)
                release_after_lookup(mgr, rid, pinning=pinning)
            mgr.free(rid)
        _check_state(mgr, sc, row, caps, hashes, fail)
    for rid in sorted(looked_up):  # lookups the scenario never followed with an allocation
        release_after_lookup(mgr, rid, pinning=pinning)


# Any: mgr as in replay_golden (the per-group protocol).
def _check_state(mgr: Any, sc: GoldenScenario, row: GoldenRow, caps: frozenset[str],
                 hashes: _Hashes, fail: _Fail) -> None:
    """Compare the declared observations after ``row`` with its recorded columns."""
    __tracebackhide__ = True
    ngroups = sc.num_groups
    holders: Counter[int] = Counter()
    for req in sc.requests:
        rid = req.request_id
        want = _expected_groups(row.block_ids(rid, ngroups))
        got = _groups(mgr.get_block_ids(rid))
        if got != want:
            fail(row, f"get_block_ids({rid!r}) (per-group tables)", want, got)
        holders.update({b for part in want for b in part if b != NULL_BLOCK})
    if "free_queue_order" in caps:
        queue = list(mgr.free_block_ids())
        if queue != list(row.free_queue):
            fail(row, "free queue (head first)", list(row.free_queue), queue)
    elif mgr.num_free_blocks() != len(row.free_queue):
        fail(row, "num_free_blocks()", len(row.free_queue), mgr.num_free_blocks())
    if "ref_counts" in caps:
        ids = range(1, sc.spec.num_blocks)
        want_rc = {b: holders[b] for b in ids}
        got_rc = dict(zip(ids, read_ref_cnts(mgr, ids), strict=True))
        if got_rc != want_rc:
            diff = {b: (want_rc[b], got_rc[b]) for b in ids if want_rc[b] != got_rc[b]}
            fail(row, "ref_cnt of blocks (expected, got)", "as the tables imply", diff)
    if "events" in caps and sc.spec.enable_kv_cache_events:
        _check_events(mgr.take_events(), sc, row, hashes, fail)
    if "block_hashes" in caps:
        for req in sc.requests:
            if not any(rid == req.request_id for rid, _ in row.tables):
                continue
            own = [bytes(h) for h in mgr.block_hashes(req.request_id)]
            for number, value in zip(req.hash_numbers, own, strict=False):
                problem = hashes.bind(number, value)
                if problem:
                    fail(row, f"block_hashes({req.request_id!r})", "the spec's hash numbers",
                         problem)


def _check_events(events: list[KVEvent], sc: GoldenScenario, row: GoldenRow,
                  hashes: _Hashes, fail: _Fail) -> None:
    __tracebackhide__ = True
    want = [_event_text(e) for e in row.events]
    got_events = [e for e in events if e.get("type") in ("BlockStored", "BlockRemoved")]
    got = [f"{e['type']} group {e.get('group_idx')} ({len(e.get('block_hashes', []))} hashes)"
           for e in got_events]
    if len(got_events) != len(row.events):
        fail(row, "KV events", want, got)
    for mine, golden in zip(got_events, row.events, strict=True):
        group = mine.get("group_idx")
        values = [bytes(h) for h in mine.get("block_hashes", [])]
        if mine["type"] != golden.type or group != golden.group_idx or len(values) != len(
                golden.hashes):
            fail(row, "KV events", want, got)
        for number, value in zip(golden.hashes, values, strict=True):
            problem = hashes.bind(number, value)
            if problem:
                fail(row, "KV event hashes", want, problem)
    del sc


def _event_text(e: GoldenEvent) -> str:
    hashes = ",".join(f"H{h}" for h in e.hashes)
    return f"{e.type} group {e.group_idx} ({hashes})"


def _call_text(row: GoldenRow) -> str:
    if row.op == "get_computed_blocks":
        return f"get_computed_blocks({row.request_id})"
    if row.op == "allocate_slots":
        hits = ", hits" if row.with_hits else ""
        return f"allocate_slots({row.request_id}, {row.num_new_tokens}{hits})"
    return f"free({row.request_id})"
