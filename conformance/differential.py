"""Differential checking: run one workload on the implementation and on the oracle (the
reference, same spec and profile) and compare every observable after every op.

A mismatch raises ``ConformanceMismatch`` whose message holds the op, both answers and a
runnable snippet of every call made so far; the workload is also written as a JSON trace that
``kvcheck replay TRACE --kv-impl=X`` re-runs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kvcheck.conformance.driver import Driver
from kvcheck.conformance.laws import check_laws
from kvcheck.conformance.protocol import KVCacheSpec
from kvcheck.errors import KVCheckFailure
from kvcheck.plugin.loader import ImplHandle

__all__ = ["ConformanceMismatch", "Pair", "REPRO_DIR", "load_trace", "replay_trace",
           "write_trace"]

REPRO_DIR = Path(".kvcheck") / "repro"
TRACE_VERSION = 1


class ConformanceMismatch(KVCheckFailure):
    """The implementation and the oracle disagree (or a law broke) after some op."""


class Pair:
    """The implementation under test and the oracle, driven in lockstep."""

    def __init__(self, impl: ImplHandle, oracle: ImplHandle | None, spec: KVCacheSpec) -> None:
        self.spec = spec
        self.impl = Driver(impl, spec)
        self.oracle = Driver(oracle, spec) if oracle is not None else None
        self.ops: list[dict[str, Any]] = []
        self.trace_name: str | None = None

    def apply(self, op: dict[str, Any]) -> dict[str, Any]:
        """Run ``op`` on both sides, check laws and compare; returns the implementation's
        answer (``{"hits": (ids, n), "new": ids | None}`` for a schedule)."""
        __tracebackhide__ = True  # failures point at the test, not at the harness
        self.ops.append(op)
        try:
            got = self.impl.apply(op)
        except Exception as exc:
            self.fail(f"{type(exc).__name__} from the implementation: {exc}", op)
        laws = check_laws(self.impl)
        if laws:
            self.fail("; ".join(laws), op)
        if self.oracle is None:
            return got
        want = self.oracle.apply(op)
        if got != want:
            self.fail(f"answer differs: implementation {got!r}, {self.oracle.impl.name} {want!r}",
                      op)
        for what, mine, theirs in observe(self.impl, self.oracle):
            if mine != theirs:
                self.fail(f"{what} differs: implementation {mine!r}, "
                          f"{self.oracle.impl.name} {theirs!r}", op)
        return got

    def run(self, ops: Iterable[dict[str, Any]]) -> None:
        __tracebackhide__ = True
        for op in ops:
            self.apply(op)

    def fail(self, problem: str, op: dict[str, Any]) -> None:
        __tracebackhide__ = True
        path = None
        if self.trace_name:
            path = write_trace(self.trace_name, self.impl.impl.target, self.spec, self.ops)
        message = [f"after op #{len(self.ops)} {op}: {problem}"]
        if path is not None:
            message.append(f"trace written to {path} (kvcheck replay {path} "
                           f"--kv-impl={self.impl.impl.target})")
        message.append("runnable repro of the calls made:\n" + self.impl.snippet(problem[:80]))
        raise ConformanceMismatch("\n".join(message))


def observe(impl: Driver, oracle: Driver) -> list[tuple[str, Any, Any]]:
    """Every observable the implementation declares, paired with the oracle's value."""
    mine, theirs = impl.manager, oracle.manager
    # Only what both sides can show (an oracle such as vLLM may lack an observation).
    caps = impl.impl.info.capabilities & oracle.impl.info.capabilities
    out: list[tuple[str, Any, Any]] = [
        ("block tables", impl.tables(), oracle.tables()),
        ("num_free_blocks()", mine.num_free_blocks(), theirs.num_free_blocks()),
    ]
    if "free_queue_order" in caps:
        out.append(("free queue (head first)", list(mine.free_block_ids()),
                    list(theirs.free_block_ids())))
    if "ref_counts" in caps:
        n = impl.spec.num_blocks
        out.append(("ref counts", [mine.ref_cnt(i) for i in range(1, n)],
                    [theirs.ref_cnt(i) for i in range(1, n)]))
    if "block_hashes" in caps:
        for rid in sorted(impl.running):
            out.append((f"block_hashes({rid!r})", [bytes(h) for h in mine.block_hashes(rid)],
                        list(theirs.block_hashes(rid))))
    if "events" in caps and impl.spec.enable_kv_cache_events:
        out.append(("KV events", normalize_events(mine.take_events()),
                    normalize_events(theirs.take_events())))
    if "slot_mapping" in caps:
        for rid in sorted(impl.running):
            end = impl.views[rid].num_computed_tokens
            out.append((f"slot_mapping({rid!r}, 0, {end})", list(mine.slot_mapping(rid, 0, end)),
                        list(theirs.slot_mapping(rid, 0, end))))
    return out


def normalize_events(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events with tuples turned into lists and hashes into bytes, for comparison."""
    def norm(value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            return [norm(v) for v in value]
        if isinstance(value, bytearray):
            return bytes(value)
        return value
    return [{k: norm(v) for k, v in e.items()} for e in events]


# ---------------------------------------------------------------------- traces
def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:120]


def write_trace(name: str, target: str, spec: KVCacheSpec, ops: list[dict[str, Any]],
                directory: Path | None = None) -> Path:
    """Write a replayable JSON trace atomically; returns its path."""
    from kvcheck.results.io import write_atomic

    directory = directory or REPRO_DIR
    trace = {"trace_version": TRACE_VERSION, "impl": target, "spec": asdict(spec), "ops": ops}
    return write_atomic(directory / f"{_safe(name)}.json", json.dumps(trace, indent=1) + "\n")


def load_trace(path: str | Path) -> dict[str, Any]:
    """Read and check a trace file.

    Raises:
        ValueError: unreadable, not JSON, a newer trace_version, or missing fields; the
            message names the file and the field.
    """
    path = Path(path)
    try:
        trace = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{path}: cannot read trace ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not a JSON trace ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(trace, dict):
        raise ValueError(f"{path}: a trace is a JSON object")
    version = trace.get("trace_version")
    if not isinstance(version, int) or version > TRACE_VERSION:
        raise ValueError(f"{path}: field 'trace_version' must be an int <= {TRACE_VERSION}")
    for key, kind in (("spec", dict), ("ops", list)):
        if not isinstance(trace.get(key), kind):
            raise ValueError(f"{path}: field {key!r} missing or not a {kind.__name__}")
    try:
        trace["spec"] = KVCacheSpec(**trace["spec"])
    except TypeError as exc:
        raise ValueError(f"{path}: field 'spec' is not a KVCacheSpec ({exc})") from None
    return trace


def replay_trace(trace: dict[str, Any], impl: ImplHandle, oracle: ImplHandle | None) -> None:
    """Re-run a loaded trace; raises ``ConformanceMismatch`` where it diverges."""
    pair = Pair(impl, oracle, trace["spec"])
    pair.run(trace["ops"])
