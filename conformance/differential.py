"""Differential checking: run one workload on the implementation and on the oracle (the
reference, same spec and profile) and compare every observable after every op.

A mismatch raises ``ConformanceMismatch`` whose message holds the op, both answers and a
runnable snippet of every call made so far; the workload is also written as a JSON trace that
``kvcheck replay TRACE --kv-impl=X`` re-runs.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import NoReturn, Protocol, TypedDict

from kvcheck.atomic import write_atomic
from kvcheck.conformance import bounds
from kvcheck.conformance.call_limit import AdapterRaised, AdapterTimeout
from kvcheck.conformance.driver import Check, Driver, StepResult
from kvcheck.conformance.errors import ConformanceMismatch
from kvcheck.conformance.groups import shown_result, shown_tables
from kvcheck.conformance.guard import ProtocolViolation, read_block_hashes, read_ref_cnts
from kvcheck.conformance.laws import check_laws
from kvcheck.conformance.loader import ImplHandle
from kvcheck.conformance.memory_limit import MemoryLimitExceeded
from kvcheck.conformance.ops import Op
from kvcheck.conformance.protocol import KVCacheSpec, KVEvent, spec_to_dict
from kvcheck.conformance.trace_check import TraceError, check_encoder_ops, check_ops, check_spec

__all__ = [
    "REPRO_DIR",
    "ConformanceMismatch",
    "Pair",
    "PairFactory",
    "Trace",
    "TraceError",
    "load_trace",
    "replay_trace",
    "safe_name",
    "write_trace",
]

REPRO_DIR = Path(".kvcheck") / "repro"
TRACE_VERSION = 1


class Trace(TypedDict):
    """A loaded, checked trace file (``load_trace``); ``impl`` is the ``--kv-impl`` value it
    was recorded with (None if the file does not say)."""

    trace_version: int
    impl: str | None
    spec: KVCacheSpec
    ops: list[Op]


class Pair:
    """The implementation under test and the oracle, driven in lockstep, for one or many
    KV-cache groups alike."""

    def __init__(self, impl: ImplHandle, oracle: ImplHandle | None, spec: KVCacheSpec) -> None:
        self.spec = spec
        self.impl = Driver(impl, spec)
        self.oracle = Driver(oracle, spec) if oracle is not None else None
        self.ops: list[Op] = []
        self.trace_name: str | None = None

    def apply(self, op: Op) -> StepResult:
        """Run ``op`` on both sides, check laws and compare; returns the implementation's
        answer, block ids one list per group (``{"hits": (per-group ids, n), "new": per-group
        ids | None}`` for a schedule, one list for a single-group spec)."""
        __tracebackhide__ = True  # failures point at the test, not at the harness
        self.ops.append(op)
        try:
            got = self.impl.apply(op)
        except Exception as exc:  # noqa: BLE001 - whatever it raises fails the test, named
            self.fail(_failure_text(exc, "the implementation"), op)
        try:  # the laws and observations call the adapters too (guarded, time-limited)
            laws = check_laws(self.impl)
        except _ADAPTER_FAILURES as exc:
            self.fail(_failure_text(exc, "the implementation"), op)
        if laws:
            self.fail("; ".join(laws), op)
        if self.oracle is None:
            return got
        try:
            want = self.oracle.apply(op)
        except Exception as exc:  # noqa: BLE001 - whatever it raises fails the test, named
            self.fail(_failure_text(exc, f"the oracle ({self.oracle.impl.name})"), op)
        if got != want:
            # Shown as the adapters answered (one list for a single-group spec).
            shown, wanted = shown_result(self.spec, got), shown_result(self.spec, want)
            self.fail(f"answer differs: implementation {shown!r}, {self.oracle.impl.name} "
                      f"{wanted!r}", op, _answer_check(shown, wanted))
        try:
            observed = observe(self.impl, self.oracle)
        except _ADAPTER_FAILURES as exc:
            self.fail(_failure_text(exc, "an observation"), op)
        for what, mine, theirs, expression in observed:
            if mine != theirs:
                check = Check(what, theirs, expression) if expression else None
                self.fail(f"{what} differs: implementation {mine!r}, "
                          f"{self.oracle.impl.name} {theirs!r}", op, check)
        return got

    def run(self, ops: Iterable[Op]) -> None:
        __tracebackhide__ = True
        for op in ops:
            self.apply(op)

    def fail(self, problem: str, op: Op, check: Check | None = None) -> NoReturn:
        """Raise ``ConformanceMismatch`` with the op, the problem, the trace (written for
        ``kvcheck replay``) and a runnable repro, also written beside the trace as
        ``<trace>.py``; with ``check`` the repro ends by comparing that value."""
        __tracebackhide__ = True
        path = repro = None
        message = [f"after op #{len(self.ops)} {op}: {problem}"]
        snippet = self.impl.snippet(problem, check)
        if self.trace_name:
            try:
                path = write_trace(self.trace_name, self.impl.impl.target, self.spec, self.ops)
                repro = write_atomic(path.with_suffix(".py"), snippet + "\n")
            except OSError as exc:  # an unwritable directory must not hide the failure
                message.append(f"trace not written ({REPRO_DIR}: {exc.strerror or exc})")
        if path is not None and repro is not None:
            message.append(f"trace written to {path} (kvcheck replay {path} "
                           f"--kv-impl={self.impl.impl.target}); repro: python {repro}")
            wire = _write_wire_transcript(self.impl.manager, path)
            if wire is not None:
                message.append(f"wire transcript of the manager: {wire}")
        message.append("runnable repro of the calls made:\n" + snippet)
        raise ConformanceMismatch("\n".join(message))


class PairFactory(Protocol):
    """What the ``kv_pair`` fixture provides: ``kv_pair(spec=None, *, with_oracle=True,
    **spec_fields)`` builds a ``Pair`` for ``spec``, or for a ``KVCacheSpec`` of
    ``spec_fields`` under the active profile (16 blocks of 4 tokens unless given)."""

    def __call__(self, spec: KVCacheSpec | None = None, /, *, with_oracle: bool = True,
                 **spec_fields: object) -> Pair: ...


# Failures an adapter call raises through the guard; named as such wherever they surface.
_ADAPTER_FAILURES = (ProtocolViolation, AdapterTimeout, AdapterRaised, MemoryLimitExceeded)


def _failure_text(exc: Exception, source: str) -> str:
    """How an exception raised while driving reads in a failure message."""
    if isinstance(exc, ProtocolViolation):
        return f"protocol violation: {exc}"
    if isinstance(exc, AdapterTimeout):
        return f"timeout: {exc}"
    if isinstance(exc, AdapterRaised):
        return f"BaseException from {source}: {exc}"
    return f"{type(exc).__name__} from {source}: {exc}"


def _answer_check(got: Mapping[str, object], want: Mapping[str, object]) -> Check | None:
    """The repro's check for a differing answer (both in the adapter's form,
    ``shown_result``): the call whose answer differs."""
    if got.get("hits") != want.get("hits"):
        return Check("get_computed_blocks answer", want["hits"], call="get_computed_blocks",
                     normalize="(list({0}[0]), {0}[1])")
    if got.get("new") != want.get("new"):
        return Check("allocate_slots answer", want["new"], call="allocate_slots",
                     normalize="None if {0} is None else list({0})")
    return None


def observe(impl: Driver, oracle: Driver) -> list[tuple[str, object, object, str | None]]:
    """Every observable the implementation declares: ``(what, implementation's value, oracle's
    value, Python expression computing it from the repro's manager m, or None)``."""
    mine, theirs = impl.manager, oracle.manager
    # Only what both sides can show (an oracle such as vLLM may lack an observation).
    caps = impl.impl.info.capabilities & oracle.impl.info.capabilities
    rids = sorted(impl.running)
    out: list[tuple[str, object, object, str | None]] = [
        ("block tables", shown_tables(impl.spec, impl.tables()),
         shown_tables(oracle.spec, oracle.tables()),
         f"{{rid: list(m.get_block_ids(rid)) for rid in {rids!r}}}"),
        ("num_free_blocks()", mine.num_free_blocks(), theirs.num_free_blocks(),
         "m.num_free_blocks()"),
    ]
    if "free_queue_order" in caps:
        out.append(("free queue (head first)", list(mine.free_block_ids()),
                    list(theirs.free_block_ids()), "list(m.free_block_ids())"))
    if "ref_counts" in caps:
        # Every id but the reserved ones (vLLM's null block 0; none under generic).
        ids = [i for i in impl.ordinary_block_ids if i not in oracle.reserved]
        out.append(("ref counts", read_ref_cnts(mine, ids), read_ref_cnts(theirs, ids),
                    f"[m.ref_cnt(i) for i in {ids!r}]"))
    algo = impl.spec.hash_algo
    if ("block_hashes" in caps and algo in impl.impl.info.hash_algos
            and algo in oracle.impl.info.hash_algos):
        # Hashes are comparable only for an algorithm both reproduce byte for byte.
        out.extend((f"block_hashes({rid!r})", [bytes(h) for h in h_mine], list(h_theirs),
                    f"[bytes(h) for h in m.block_hashes({rid!r})]")
                   for rid, h_mine, h_theirs in zip(rids, read_block_hashes(mine, rids),
                                                    read_block_hashes(theirs, rids), strict=True))
    if "events" in caps and impl.spec.enable_kv_cache_events:
        # Events are drained per op; a replay from the start would see them all at once.
        out.append(("KV events", normalize_events(mine.take_events()),
                    normalize_events(theirs.take_events()), None))
    if "boundary_state_offloads" in caps and impl.offloads:
        # Every drain so far (the drivers drain at the same points): vLLM's hand-offs.
        out.append(("boundary-state hand-offs drained (take_boundary_state_offloads)",
                    impl.drained_offloads, oracle.drained_offloads, None))
        out.append(("partial tails finalized (finalize_partial_tail_offloads)",
                    impl.finalized_tails, oracle.finalized_tails, None))
    # slot_mapping speaks the single-group protocol: with KV-cache groups it would show group 0
    # only, which the block tables above already compare (and vLLM computes it with a Triton
    # kernel, interpreted on a CPU: most of a multi-group run's time).
    if "slot_mapping" in caps and not impl.spec.kv_cache_groups:
        for rid in sorted(impl.running):
            end = impl.views[rid].num_computed_tokens
            out.append((f"slot_mapping({rid!r}, 0, {end})", list(mine.slot_mapping(rid, 0, end)),
                        list(theirs.slot_mapping(rid, 0, end)),
                        f"list(m.slot_mapping({rid!r}, 0, {end}))"))
    return out


def normalize_events(events: Iterable[KVEvent]) -> list[KVEvent]:
    """Events with tuples turned into lists and hashes into bytes, for comparison."""
    def norm(value: object) -> object:
        if isinstance(value, (list, tuple)):
            return [norm(v) for v in value]
        if isinstance(value, bytearray):
            return bytes(value)
        return value
    return [{k: norm(v) for k, v in e.items()} for e in events]


# ---------------------------------------------------------------------- traces
#: Largest trace file ``load_trace`` reads: ``kvcheck.conformance.bounds.MAX_TRACE_BYTES``.
MAX_TRACE_BYTES = bounds.MAX_TRACE_BYTES


def safe_name(name: str) -> str:
    """A file name for ``name``: readable (runs of other characters become ``_``), and when
    sanitising changed the name, followed by a short stable hash of the raw name, so names
    that sanitise alike (``test_x[a b]``, ``test_x[a/b]``: both ``test_x_a_b_``) never share
    a trace file; names that are already safe are kept as they are."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
    if safe == name and len(safe) <= 120:
        return safe
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{safe[:109]}-{digest}"


def _write_wire_transcript(manager: object, trace: Path) -> Path | None:
    """An ``exec:`` implementation's manager keeps the exact lines exchanged with its engine
    (``wire_transcript()``, docs/wire-protocol.md): written beside the trace as
    ``NAME.wire.txt``; None for an in-process manager (or an unwritable folder)."""
    raw = getattr(manager, "_raw", manager)
    transcript = getattr(raw, "wire_transcript", None)
    if not callable(transcript):
        return None
    try:
        lines = transcript()
        return write_atomic(trace.with_name(trace.stem + ".wire.txt"),
                            "".join(f"{line}\n" for line in lines))
    except OSError:
        return None


def write_trace(name: str, target: str, spec: KVCacheSpec, ops: Sequence[Op],
                directory: Path | None = None) -> Path:
    """Write a replayable JSON trace atomically; returns its path (``safe_name(name)`` + .json)."""
    directory = directory or REPRO_DIR
    trace = {"trace_version": TRACE_VERSION, "impl": target, "spec": spec_to_dict(spec), "ops": ops}
    return write_atomic(directory / f"{safe_name(name)}.json", json.dumps(trace, indent=1) + "\n")


def load_trace(path: str | Path) -> Trace:
    """Read and fully check a trace file (``kvcheck.conformance.trace_check``) before anything
    runs.

    Raises:
        TraceError: (a ``ValueError``) unreadable, not UTF-8 JSON, too large, a newer
            trace_version, an unknown op or request id, a mistyped or out-of-bounds field;
            the message names the file, the op and the problem.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_TRACE_BYTES:
            raise TraceError(f"{path}: {size} bytes; a trace is at most {MAX_TRACE_BYTES}")
        trace = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise TraceError(f"{path}: cannot read trace ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not a JSON trace (not UTF-8 text: byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}: not a JSON trace ({exc.msg} at line {exc.lineno})") from None
    except (ValueError, RecursionError) as exc:  # e.g. a 5000-digit number, deep nesting
        raise TraceError(f"{path}: not a usable JSON trace ({type(exc).__name__}: "
                         f"{str(exc)[:120]})") from None
    if not isinstance(trace, dict):
        raise TraceError(f"{path}: a trace is a JSON object")
    version = trace.get("trace_version")
    if type(version) is not int or not 1 <= version <= TRACE_VERSION:
        raise TraceError(f"{path}: field 'trace_version' must be an int <= {TRACE_VERSION} "
                         f"(and >= 1), got {version!r}")
    impl = trace.get("impl")
    if impl is not None and (not isinstance(impl, str) or not impl.strip()):
        raise TraceError(f"{path}: field 'impl' must be a module name (a string), got {impl!r}")
    trace["spec"] = check_spec(trace.get("spec"), str(path))
    trace["ops"] = check_ops(trace.get("ops"), str(path))
    check_encoder_ops(trace["spec"], trace["ops"], str(path))
    return Trace(trace_version=version, impl=impl, spec=trace["spec"], ops=trace["ops"])


def replay_trace(trace: Trace, impl: ImplHandle, oracle: ImplHandle | None) -> None:
    """Re-run a loaded trace; raises ``ConformanceMismatch`` where it diverges."""
    pair = Pair(impl, oracle, trace["spec"])
    pair.run(trace["ops"])
