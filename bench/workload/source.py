"""The one resolver of a workload's name (``--kv-bench-workload``, the tools' ``--scenarios``
and ``--workload``): a built-in scenario (``kvcheck.bench.workload.scenarios``), ``trace:PATH`` of a
request trace file (``kvcheck.bench.workload.request_trace``) or ``trace:PATH.cbor.xz`` of a
recorded corpus (``kvcheck.bench.replay.recorded``), and the scheduler benchmark each one becomes
(``scheduler_bench_maker``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvcheck.bench.measure.allocator import SchedulerBench
from kvcheck.bench.measure.rounds import Bench
from kvcheck.bench.workload.request_trace import TRACE_PREFIX, load_trace_workload
from kvcheck.bench.workload.scenarios import (
    SCENARIOS,
    Workload,
    make_workload,
)
from kvcheck.bench.workload.trace_file import (
    TraceFileError,
)
from kvcheck.conformance.loader import ImplHandle
from kvcheck.conformance.recorded import Corpus
from kvcheck.errors import KVCheckInputError

__all__ = [
    "TRACE_PREFIX",
    "RecordedWorkload",
    "WorkloadSource",
    "is_recorded_corpus",
    "is_trace_workload",
    "resolve_workload",
    "scheduler_bench_maker",
    "trace_path",
]



def is_trace_workload(value: str) -> bool:
    """Whether a ``--kv-bench-workload`` value names a trace file (``trace:PATH``)."""
    return value.startswith(TRACE_PREFIX)


def trace_path(value: str) -> Path:
    """The path of a ``trace:PATH`` value.

    Raises:
        TraceFileError: no path after ``trace:``.
    """
    path = value[len(TRACE_PREFIX):] if is_trace_workload(value) else value
    if not path:
        raise TraceFileError(f"{value!r}: no file after 'trace:'; write "
                             "--kv-bench-workload=trace:path/to/trace.jsonl")
    return Path(path)


@dataclass(frozen=True)
class RecordedWorkload:
    """A recorded corpus named as a workload (``trace:PATH.cbor.xz``): its calls are replayed
    as recorded (``kvcheck.bench.replay.recorded``), not scheduled by kvcheck's loop."""

    scenario: str  # trace:<file name>
    corpus: Corpus


def is_recorded_corpus(path: Path) -> bool:
    """Whether a trace path names a recorded corpus (``kvcheck record`` output: ``.cbor.xz``
    or ``.cbor``) rather than a JSON Lines request trace."""
    return path.name.endswith((".cbor.xz", ".cbor"))


#: What a workload's name resolves to: requests kvcheck's scheduler loop schedules, or a
#: recorded corpus whose calls are replayed as recorded.
WorkloadSource = Workload | RecordedWorkload


def resolve_workload(value: str, seed: int = 0, scale: float = 1.0) -> WorkloadSource:
    """The workload a ``--kv-bench-workload`` value names: a built-in scenario (built with
    ``seed`` and ``scale``), ``trace:PATH`` of a request trace (seed and scale are the file's),
    or ``trace:PATH.cbor.xz`` of a recorded corpus.

    Raises:
        KVCheckInputError: an unknown scenario name (the message lists the known ones), or
            any ``TraceFileError`` / ``CorpusError`` of the file.
    """
    if is_trace_workload(value):
        path = trace_path(value)
        if is_recorded_corpus(path):
            from kvcheck.bench.replay.recorded import load_recorded_workload

            return RecordedWorkload(f"{TRACE_PREFIX}{path.name}", load_recorded_workload(path))
        return load_trace_workload(path)
    if value not in SCENARIOS:
        raise KVCheckInputError(
            f"unknown workload {value!r}: give a built-in scenario ({', '.join(SCENARIOS)}) "
            "or trace:PATH for a request trace file (JSON Lines: kvcheck bench trace "
            "--help)")
    return make_workload(value, seed, scale)


def scheduler_bench_maker(workload: WorkloadSource, impl: ImplHandle,
                          reference: ImplHandle) -> Callable[[ImplHandle], Bench]:
    """``make(side) -> RoundBench`` for ``BenchSession.run_allocator``: kvcheck's scheduler
    loop over a ``Workload``, or the recorded calls of a corpus, restricted to the traces both
    ``impl`` and ``reference`` can run so that paired rounds replay the same calls."""
    if isinstance(workload, Workload):
        return lambda side: SchedulerBench(side, workload)
    from kvcheck.bench.replay.recorded import recorded_pair

    mine, theirs = recorded_pair(impl, reference, workload.corpus, workload.scenario)
    return lambda side: mine if side is impl else theirs
