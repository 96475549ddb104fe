"""Deterministic cost: instructions executed inside a benchmark's measured region (callgrind).

Wall time on a shared 2-core machine moves by 2x between runs; the number of instructions the
implementation executes does not. ``count_group`` runs allocator benchmark cases in a fresh
interpreter under valgrind's callgrind and returns the instructions executed inside the
implementation's measured calls only: no interpreter start-up, imports, setup, warm-up round
or harness bookkeeping.

How the region is delimited, without compiling anything: callgrind starts with collection off
(``--collect-atstart=no``) and toggles it on entry to and exit from one C function,
``_PyEval_CallTracing`` (``--toggle-collect``). That function is what ``sys.call_tracing(fn,
args)`` runs: it calls ``fn(*args)`` and nothing else when no tracer is set. In the child, the
manager is wrapped so that each *measured* method (the ones the benchmark times, see
``COUNTED_METHODS``) is called through ``sys.call_tracing`` during the measured rounds, and
directly otherwise. Nothing else in the process calls ``sys.call_tracing``; a nested call would
toggle collection off inside the region, so the child replaces ``sys.call_tracing`` with a
guard that fails the run if the implementation calls it. The few instructions of the call
itself (``PyObject_Call`` of a bound method) are counted too: a constant per call, the same for
every implementation.

Determinism: ``PYTHONHASHSEED=0``, a fixed minimal environment and argument list (the stack
layout depends on them), an empty working folder, a fresh bytecode cache primed natively
(``_prime``), the benchmark's seeded inputs, GC off inside a round, and one untimed warm-up
round first (lazy imports, CPython's adaptive specialization). Two runs count the same within
0.04% (see ``kvcheck bench spread`` and docs/deterministic-cost.md).

Each benchmark's cases run in one child, in order; ``sys.getallocatedblocks()`` after each
case makes callgrind dump that case's count to a file of its own (``--dump-before`` on its C
function, ``DUMP_SYMBOL``).

The record (``counted_record``) holds one ``instructions`` metric per case (``deterministic:
true``, unit ``instructions``, lower is better) beside the same case's wall-time metrics
measured natively in the same command, under the hardware key ``callgrind:<arch>``: counts
compare across machines of one architecture; the gate compares only the counts of such
records (see ``kvcheck.results.gate``). Valgrind missing: ``CountingUnavailable`` naming
``apt-get install valgrind``.

Command line: ``kvcheck bench counted --help``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, TypeVar, cast

from kvcheck.bench.cli_args import BenchTool, run_tool
from kvcheck.bench.errors import CountingUnavailable
from kvcheck.bench.measure.timing import collector_off
from kvcheck.conformance.loader import ImplHandle
from kvcheck.errors import KVCheckFailure, KVCheckInputError

if TYPE_CHECKING:
    from kvcheck.bench.measure.allocator import HashingBench, SchedulerBench, SlotMappingBench
    from kvcheck.bench.measure.metrics import Metric
    from kvcheck.bench.measure.rounds import Bench
    from kvcheck.conformance.protocol import KVCacheSpec, ManagerWithCapabilities

T = TypeVar("T")

__all__ = [
    "BENCHES",
    "COUNTED_METHODS",
    "DEFAULT_SCALE",
    "DUMP_SYMBOL",
    "HASH_SEED",
    "METHOD",
    "TOGGLE_SYMBOL",
    "CaseCount",
    "CountedCase",
    "CountingUnavailable",
    "count_cases",
    "count_group",
    "counted_hardware_key",
    "counted_record",
    "default_cases",
    "unavailable_reason",
    "wall_time_metrics",
]

METHOD = "callgrind"
#: The C function whose entry and exit switch callgrind's collection on and off.
TOGGLE_SYMBOL = "_PyEval_CallTracing"
#: The C function of ``sys.getallocatedblocks``: entering it dumps the count so far.
DUMP_SYMBOL = "_Py_GetAllocatedBlocks"
HASH_SEED = "0"
#: A short scale: callgrind runs the measured code ~50x slower than natively.
DEFAULT_SCALE = 0.05
BENCHES = ("scheduler", "hashing", "slot_mapping")
#: Per benchmark, the manager methods inside its measured region (what it times).
COUNTED_METHODS: dict[str, tuple[str, ...]] = {
    "scheduler": ("allocate_slots", "get_computed_blocks", "free"),
    "hashing": ("get_computed_blocks", "block_hashes"),
    "slot_mapping": ("slot_mapping",),
}
_SLOT_MAPPING_CASE = "2048-token requests"  # the case name bench_allocator.py records


def unavailable_reason() -> str | None:
    """Why counting is impossible on this machine, or None when valgrind is installed."""
    if shutil.which("valgrind") is None:
        return ("valgrind is not installed, so instructions cannot be counted (Debian/Ubuntu: "
                "apt-get install valgrind)")
    return None


def counted_hardware_key() -> str:
    """The hardware key of counted records: the method and the architecture."""
    return f"{METHOD}:{platform.machine() or 'unknown'}"


@dataclass(frozen=True)
class CountedCase:
    """One benchmark case to count.

    Attributes:
        bench: ``"scheduler"``, ``"hashing"`` or ``"slot_mapping"``.
        case: scenario name (scheduler), hash algorithm (hashing), or the slot_mapping case.
        scale: the benchmark's scale (request counts); small, counting is slow.
        seed: the workload seed.
        rounds: measured rounds (their counts are summed, then divided: per round).
        warmup: untimed, uncounted rounds first.
    """

    bench: str
    case: str
    scale: float = DEFAULT_SCALE
    seed: int = 0
    rounds: int = 1
    warmup: int = 1

    @property
    def key(self) -> str:
        """The metric case, as the benchmark records name it: ``"<bench>/<case>"``."""
        return f"{self.bench}/{self.case}"


@dataclass(frozen=True)
class CaseCount:
    """What one counted run of a case measured.

    ``instructions`` per measured round (callgrind's Ir inside the region), ``calls`` the
    measured calls per round, ``wall_s`` the child's wall time (valgrind included).
    """

    case: CountedCase
    instructions: int
    calls: int
    wall_s: float
    info: dict[str, object] = field(default_factory=dict)


def default_cases(benches: Sequence[str] = BENCHES, scale: float = DEFAULT_SCALE,
                  seed: int = 0) -> list[CountedCase]:
    """Every case of the named benchmarks: scheduler scenarios, hash algorithms, slot_mapping."""
    from kvcheck.bench.workload.scenarios import SCENARIOS
    from kvcheck.reference_impl.hashing import HASH_FUNCTIONS

    names: dict[str, list[str]] = {"scheduler": list(SCENARIOS),
                                   "hashing": list(HASH_FUNCTIONS),
                                   "slot_mapping": [_SLOT_MAPPING_CASE]}
    unknown = [b for b in benches if b not in names]
    if unknown:
        raise KVCheckInputError(f"unknown counted benchmark(s) {unknown}; choose from "
                                f"{list(BENCHES)}")
    return [CountedCase(b, c, scale, seed) for b in benches for c in names[b]]


# ------------------------------------------------------------------------ building a benchmark
def make_bench(impl: ImplHandle, case: CountedCase
               ) -> SchedulerBench | HashingBench | SlotMappingBench:
    """The ``RoundBench`` (``kvcheck.bench.measure.allocator``) that measures ``case`` on
    ``impl``."""
    from kvcheck.bench.measure.allocator import HashingBench, SchedulerBench, SlotMappingBench
    from kvcheck.bench.workload.scenarios import make_workload

    if case.bench == "scheduler":
        return SchedulerBench(impl, make_workload(case.case, seed=case.seed, scale=case.scale))
    if case.bench == "hashing":
        return HashingBench(impl, case.case, case.seed, case.scale)
    if case.bench == "slot_mapping":
        return SlotMappingBench(impl, case.seed, case.scale)
    raise KVCheckInputError(f"unknown counted benchmark {case.bench!r}; choose from "
                            f"{list(BENCHES)}")


def _run_round(bench: Bench) -> None:
    """One round as ``measure_rounds`` runs it: fresh inputs, GC off inside the round."""
    args, kwargs = bench.setup()
    # No collection first: a collection would move the heap, and with it the counts.
    with collector_off(collect=False):
        bench.run(*args, **kwargs)


# ------------------------------------------------------------------------------- the child side
class _Region:
    """Whether measured calls go through ``sys.call_tracing`` (the callgrind toggle) now."""

    def __init__(self) -> None:
        self.armed = False
        self.inside = False
        self.calls = 0
        self.call_tracing = sys.call_tracing

    def call(self, method: Callable[..., T], args: tuple[object, ...]) -> T:
        if not self.armed:
            return method(*args)
        self.calls += 1
        self.inside = True
        try:
            return self.call_tracing(method, args)
        finally:
            self.inside = False

    def guard(self, func: Callable[..., T], args: tuple[object, ...]) -> T:
        """Stands in for ``sys.call_tracing`` in the child: a nested call would switch
        collection off inside the region, so it is refused there."""
        if self.inside:
            raise KVCheckFailure("the implementation called sys.call_tracing inside a counted "
                                 "call; kvcheck counts instructions by toggling on it, so the "
                                 "count would be wrong")
        return self.call_tracing(func, args)


class _CountedManager:
    """A manager whose measured methods run through ``_Region.call``; the rest pass through.

    Keyword arguments are not used by the benchmarks' calls into the protocol; positional
    ones are forwarded as they are.
    """

    def __init__(self, manager: ManagerWithCapabilities, methods: Sequence[str],
                 region: _Region) -> None:
        self._manager = manager
        for name in methods:
            setattr(self, name, self._wrap(getattr(manager, name), region))

    @staticmethod
    def _wrap(method: Callable[..., T], region: _Region) -> Callable[..., T]:
        def counted(*args: object) -> T:
            return region.call(method, args)
        return counted

    def __getattr__(self, name: str) -> object:
        return getattr(self._manager, name)


class _CountedImpl:
    """An ``ImplHandle`` whose managers are ``_CountedManager``\\ s."""

    def __init__(self, impl: ImplHandle, methods: Sequence[str], region: _Region) -> None:
        self._impl = impl
        self._methods = tuple(methods)
        self._region = region

    def make_manager(self, spec: KVCacheSpec, *, guard: bool = True) -> _CountedManager:
        return _CountedManager(self._impl.make_manager(spec, guard=guard), self._methods,
                               self._region)

    def __getattr__(self, name: str) -> object:
        return getattr(self._impl, name)


class _CaseFields(TypedDict):
    """A ``CountedCase`` as the parent sends it (``asdict``)."""

    bench: str
    case: str
    scale: float
    seed: int
    rounds: int
    warmup: int


class _ChildSpec(TypedDict):
    """What the parent sends the child (JSON, ``--child`` / ``--prime``)."""

    impl: str
    cases: list[_CaseFields]


class _ChildResult(TypedDict):
    """What the child prints per case (JSON)."""

    calls: int
    info: dict[str, object]


def _child(spec: _ChildSpec, prime_only: bool = False) -> list[_ChildResult]:
    """Run cases under callgrind (this process), in order: per case the warm-up rounds
    direct, the measured rounds through the toggle, then ``sys.getallocatedblocks()``, whose
    C function (``DUMP_SYMBOL``) makes callgrind dump the case's count to a file of its own.
    Returns, per case, what the parent needs besides the count. ``prime_only``: import and
    build everything, run nothing (``_prime``)."""
    from kvcheck.conformance.loader import load_impl

    region = _Region()
    sys.call_tracing = region.guard
    impl = load_impl(spec["impl"], call_timeout=None)
    out: list[_ChildResult] = []
    for fields in spec["cases"]:
        case = CountedCase(**fields)
        # An ImplHandle in everything but its managers (it forwards every other attribute).
        counted = cast(ImplHandle, _CountedImpl(impl, COUNTED_METHODS[case.bench], region))
        bench = make_bench(counted, case)
        if prime_only:
            _run_round(bench)  # imports what a round imports lazily
            continue
        for _ in range(case.warmup):
            _run_round(bench)
        region.calls = 0
        region.armed = True
        for _ in range(case.rounds):
            _run_round(bench)
        region.armed = False
        sys.getallocatedblocks()  # callgrind dumps this case's count (--dump-before)
        out.append({"calls": region.calls, "info": bench.info()})
    return out


# ------------------------------------------------------------------------------ the parent side
# ``-c``, not ``-m``: ``-m`` puts the (temporary, randomly named) working folder on sys.path,
# and the child's memory must not differ between runs.
_CHILD_CODE = "from kvcheck.bench.counted import main; raise SystemExit(main())"


def _child_env(pycache: Path) -> dict[str, str]:
    """A fixed, minimal environment (the same bytes on the child's stack in every run), with
    bytecode cached in a fresh folder of this count's own (see ``_prime``)."""
    env = {"PYTHONHASHSEED": HASH_SEED, "LC_ALL": "C", "PYTHONPYCACHEPREFIX": str(pycache)}
    for name in ("PATH", "PYTHONPATH"):  # the child imports what this process imports
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def _prime(python: str, spec: str, env: dict[str, str], cwd: str, timeout_s: float) -> None:
    """Import everything the counted child imports, natively, writing bytecode into the
    count's own cache folder.

    Why: a module loaded from a ``.pyc`` and one compiled from its source leave the heap in
    different states, and the implementation's identity-hashed sets and dicts, and glibc's
    ``realloc``, then execute a few different instructions (~0.1% in the scheduler cases).
    Whether the shared ``__pycache__`` is fresh depends on what ran before (an edit, another
    tool); a fresh cache primed the same way every time does not.
    """
    proc = subprocess.run([python, "-c", _CHILD_CODE, "--prime", spec], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout_s, check=False)
    if proc.returncode != 0:
        raise KVCheckFailure(f"preparing the counted child failed (exit {proc.returncode}):\n"
                             f"{proc.stderr.strip()[-2000:]}")


def _parse_total(out_file: Path) -> int:
    """Callgrind's total ``Ir`` (``summary:`` / ``totals:`` line) of one output file."""
    total = None
    for line in out_file.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith(("summary:", "totals:")):
            total = int(line.split()[1])
    if total is None:
        raise KVCheckFailure(f"{out_file}: callgrind wrote no summary line")
    return total


def count_group(cases: Sequence[CountedCase], impl: str = "reference", *,
                python: str = sys.executable, timeout_s: float = 900.0) -> list[CaseCount]:
    """Count the instructions of ``cases``, in order, on ``impl`` (a ``--kv-impl`` value) in
    one child interpreter under callgrind (one start-up for all of them).

    A case's count can depend slightly on the cases run before it in the same child (warm
    caches of the interpreter); compare runs of the same selection of cases.

    Raises:
        CountingUnavailable: valgrind is not installed.
        KVCheckFailure: the child failed, or nothing was collected (e.g. a stripped
            libpython without the ``_PyEval_CallTracing`` symbol).
    """
    reason = unavailable_reason()
    if reason:
        raise CountingUnavailable(reason)
    if not cases:
        return []
    spec = json.dumps({"impl": impl, "cases": [asdict(c) for c in cases]}, sort_keys=True)
    with tempfile.TemporaryDirectory(prefix="kvcheck-count-") as tmp:
        env = _child_env(Path(tmp) / "pycache")
        # The child's working folder stays empty: with -c it is sys.path[0], and callgrind's
        # files appearing in it would change what the import system sees between runs.
        cwd, out_dir = Path(tmp) / "cwd", Path(tmp) / "out"
        cwd.mkdir()
        out_dir.mkdir()
        _prime(python, spec, env, str(cwd), timeout_s)
        out_file = out_dir / "callgrind.out"
        cmd = ["valgrind", "--tool=callgrind", "--collect-atstart=no",
               f"--toggle-collect={TOGGLE_SYMBOL}", f"--dump-before={DUMP_SYMBOL}",
               f"--callgrind-out-file={out_file}", "--dump-instr=no", "--dump-line=no",
               "--log-file=/dev/null", python, "-c", _CHILD_CODE, "--child", spec]
        start = time.perf_counter()
        proc = subprocess.run(cmd, env={**env, "PYTHONDONTWRITEBYTECODE": "1"}, cwd=cwd,
                              capture_output=True, text=True, timeout=timeout_s, check=False)
        wall_s = time.perf_counter() - start
        what = f"counting {', '.join(c.key for c in cases)} on {impl}"
        if proc.returncode != 0:
            raise KVCheckFailure(f"{what} failed (exit {proc.returncode}):\n"
                                 f"{proc.stderr.strip()[-2000:]}")
        results: list[_ChildResult] = json.loads(proc.stdout.strip().splitlines()[-1])
        totals = [_parse_total(Path(f"{out_file}.{i}")) if Path(f"{out_file}.{i}").exists()
                  else None for i in range(1, len(cases) + 1)]
    counts = []
    for case, total, result in zip(cases, totals, results, strict=True):
        if not total or not result["calls"]:
            raise KVCheckFailure(
                f"{what}: callgrind collected {total} instructions over {result['calls']} "
                f"measured calls of {case.key}; is {python}'s libpython stripped (no "
                f"{TOGGLE_SYMBOL} or {DUMP_SYMBOL} symbol)? `nm` on it should list both")
        rounds = max(1, case.rounds)
        counts.append(CaseCount(case, round(total / rounds), result["calls"] // rounds,
                                wall_s / len(cases), result["info"]))
    return counts


def count_cases(cases: Sequence[CountedCase], impl: str = "reference", *, jobs: int = 1,
                python: str = sys.executable) -> list[CaseCount]:
    """``count_group`` per benchmark (one child each: the same grouping in every run, so
    counts are comparable), ``jobs`` children at a time (counts do not depend on the machine's
    load, so running them side by side is safe); results in ``cases`` order."""
    groups: dict[str, list[CountedCase]] = {}
    for case in cases:
        groups.setdefault(case.bench, []).append(case)

    def one(group: list[CountedCase]) -> list[CaseCount]:
        return count_group(group, impl, python=python)

    if jobs <= 1 or len(groups) == 1:
        done = [one(g) for g in groups.values()]
    else:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            done = list(pool.map(one, groups.values()))
    by_case = {c.case: c for group in done for c in group}
    return [by_case[c] for c in cases]


def wall_time_metrics(case: CountedCase, impl: str = "reference", rounds: int = 5,
                      warmup: int = 1) -> list[Metric]:
    """The case's own wall-time metrics (``kvcheck.bench.measure.metrics.Metric``), measured
    natively in this process at the case's scale: what the counts stand beside."""
    from kvcheck.bench.measure.allocator import measure_rounds
    from kvcheck.conformance.loader import load_impl

    handle = load_impl(impl, call_timeout=None)
    return measure_rounds(make_bench(handle, case), rounds, warmup)


def counted_record(impl: str, counts: Sequence[CaseCount], *, profile: str = "vllm-0.33",
                   wall_rounds: int = 5, implementation: Mapping[str, object] | None = None,
                   reference: Sequence[CaseCount] = ()) -> dict[str, object]:
    """A validated benchmark record: per case an ``instructions`` metric (``deterministic:
    true``) and, unless ``wall_rounds`` is 0, the case's wall-time metrics measured natively
    beside it. The hardware key is ``counted_hardware_key()``; the machine's own key is kept
    as ``environment.machine_key``.

    ``implementation``: the record's implementation block (default: the loaded ``impl``'s).
    ``reference``: the reference's counts of the same cases; each count's ``extra`` then holds
    ``reference_value`` and ``ratio_to_reference`` (reference / implementation: above 1 means
    fewer instructions than the reference, as the benchmark records' ratios are "higher is
    better").
    """
    from kvcheck.conformance import SUITE_VERSION
    from kvcheck.conformance.loader import load_impl
    from kvcheck.results.environment import collect_environment
    from kvcheck.results.schema import make_benchmark_record, make_metric

    environment = collect_environment()
    environment["machine_key"] = environment["hardware_key"]
    environment["hardware_key"] = counted_hardware_key()
    metrics: list[dict[str, object]] = []
    benchmarks = []
    reference_counts = {c.case.key: c.instructions for c in reference}
    for count in counts:
        case = count.case
        ref = reference_counts.get(case.key)
        versus = {} if ref is None else {"reference_value": float(ref),
                                         "ratio_to_reference": ref / count.instructions}
        metrics.append(make_metric(
            "instructions", "instructions", "lower_is_better", [float(count.instructions)],
            float(count.instructions), case=case.key, stat=f"{METHOD} Ir per round",
            deterministic=True,
            extra={"method": METHOD, "toggle": TOGGLE_SYMBOL, "calls": count.calls,
                   "rounds": case.rounds, "warmup_rounds": case.warmup,
                   "hash_seed": HASH_SEED, **versus}))
        if wall_rounds:
            metrics.extend(make_metric(m.name, m.unit, m.direction, m.samples, m.value,
                                       case=case.key, stat=m.stat)
                           for m in wall_time_metrics(case, impl, rounds=wall_rounds))
        benchmarks.append({"case": case.key, "scale": case.scale, "seed": case.seed,
                           "info": count.info})
    block: Mapping[str, object] | ImplHandle = (
        implementation if implementation is not None else load_impl(impl, call_timeout=None))
    return make_benchmark_record(
        block, metrics, profile=profile, suite_version=SUITE_VERSION,
        environment=environment, seed=counts[0].case.seed if counts else None,
        extra={"counted": {"method": METHOD, "toggle": TOGGLE_SYMBOL,
                           "benchmarks": benchmarks}})


# ----------------------------------------------------------------------------- command line
def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kvcheck.bench.cli_args import name_in
    from kvcheck.bench.options import (
        add_benches_option,
        add_impl_option,
        add_jobs_option,
        add_report_option,
        add_scale_option,
        add_seed_option,
        add_wall_rounds_option,
    )
    from kvcheck.conformance.protocol import PROFILES

    add = parser.add_argument
    add_impl_option(add)
    add_benches_option(add, BENCHES)
    add("--case", action="append", default=[],
        help="only this case (scenario, hash algorithm); repeatable (default: every case of "
             "the chosen benchmarks)")
    add_scale_option(add, default=DEFAULT_SCALE, note="counting runs ~50x slower than natively")
    add_seed_option(add)
    add_jobs_option(add, default=1, what="cases counted side by side (counts do not depend "
                                         "on load)")
    add_wall_rounds_option(add)
    add("--profile", default="vllm-0.33", type=name_in(PROFILES, "profile"),
        help="profile written into the record (default vllm-0.33)")
    add("--no-reference", action="store_true",
        help="do not also count the reference (by default an implementation's counts are "
             "recorded with the reference's and their ratio)")
    add_report_option(add, what="the benchmark record, for kvcheck gate,", as_path=True)
    add("--child", default=None, help=argparse.SUPPRESS)
    add("--prime", default=None, help=argparse.SUPPRESS)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Returns the exit status (2: bad input or no valgrind, named on one line)."""
    if args.prime is not None:
        _child(json.loads(args.prime), prime_only=True)
        return 0
    if args.child is not None:
        print(json.dumps(_child(json.loads(args.child))))
        return 0
    # Every argument is checked before valgrind is looked for and anything is counted.
    cases = default_cases(args.bench, args.scale, args.seed)
    if args.case:
        unknown = sorted(set(args.case) - {c.case for c in cases})
        if unknown:
            raise KVCheckInputError(
                f"--case {unknown[0]!r}: no case of --bench {','.join(args.bench)} has that "
                f"name; Fix: use one of {', '.join(sorted({c.case for c in cases}))}")
        cases = [c for c in cases if c.case in args.case]
    if args.report is not None:
        from kvcheck.results.io import check_output_path

        check_output_path(args.report, "--report", example="counted.jsonl")
    reason = unavailable_reason()
    if reason:
        raise CountingUnavailable(reason)
    from kvcheck.conformance.loader import load_impl

    # Here, not in the counting children: a bad --impl is one line, not their traceback.
    load_impl(args.impl, call_timeout=None)
    start = time.perf_counter()
    counts = count_cases(cases, args.impl, jobs=args.jobs)
    reference = [] if args.impl == "reference" or args.no_reference else count_cases(
        cases, "reference", jobs=args.jobs)
    ratios = {c.case.key: c.instructions for c in reference}
    for c in counts:
        ref = ratios.get(c.case.key)
        versus = "" if ref is None else f"  x{ref / c.instructions:.3f} vs the reference"
        print(f"{c.case.key:<40} {c.instructions:>14,} instructions  {c.calls:>6} calls"
              f"{versus}")
    if args.report is not None:
        from kvcheck.results.io import write_records

        record = counted_record(args.impl, counts, profile=args.profile,
                                wall_rounds=args.wall_rounds, reference=reference)
        write_records(args.report, [record])
        print(f"{parser.prog}: record written to {args.report}")
    print(f"{parser.prog}: {len(counts)} case(s) in {time.perf_counter() - start:.1f} s")
    return 0


TOOL = BenchTool("counted", "kvcheck.bench.counted",
                 "Count the instructions each allocator benchmark case executes inside its "
                 "measured region (callgrind), and write them, beside natively measured wall "
                 "time, as a benchmark record for `kvcheck gate`.", add_arguments, run)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kvcheck.bench.counted``: the same as ``kvcheck bench counted``."""
    return run_tool(TOOL, argv)


if __name__ == "__main__":
    raise SystemExit(main())
