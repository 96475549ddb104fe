"""How allocator cost grows: pool size, concurrency and prompt length, one axis at a time.

::

    kvcheck bench sweep                          # the reference (A/A: ratios ~1)
    kvcheck bench sweep --impl vllm --report sweep.jsonl
    kvcheck bench sweep --quick --axis pool_blocks

Around a base point (``BASE``: a pool of 16384 blocks, 16 running requests, 256-token
prompts), each axis is varied alone over powers of two (``--quick``: its two ends and the
base):

* ``pool_blocks``: 1024 .. 65536 blocks (the null block included);
* ``concurrency``: 8 .. 512 running requests (``max_num_seqs``);
* ``prompt_tokens``: 128 .. 8192 tokens per prompt.

Every point is a synthetic trace (``sweep_workload``): ``max(2 * concurrency, 64)`` requests
(``--quick``: ``max(concurrency, 16)``) of unique random prompts (no shared prefix), 16
output tokens each, all arriving at step 0, replayed by the scheduler loop
(``kvcheck.bench.replay.scheduler``) with a 2048-token step budget. The base point is chosen so that
every point's running requests fit in its pool: cost is measured without preemptions (the
``preemptions`` column says when that did not hold).

Per point, the implementation and the reference run in interleaved rounds (A B B A,
``kvcheck.bench.measure.paired``; one side only when the implementation is the reference), at the
protocol level or, with ``--level manager``, on the engines' own objects
(``kvcheck.bench.replay.native``). Reported per side: **ns per scheduled token** (time inside the
allocator, scaled by the round's on-CPU fraction, over the tokens the step scheduled) and
**ns per allocate_slots call**, medians over the rounds, and the median of the paired cost
ratios implementation / reference (above 1: the implementation costs more).

``--report PATH`` writes kvcheck result records (``kind="benchmark"``, written atomically):
one per point and subject, the metrics' case ``sweep/<axis>=<value>`` and their ``extra``
carrying ``sweep_axis``, ``sweep_value`` and the base point. ``kvcheck leaderboard PATH
--format html`` draws them as cost-versus-axis charts.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from kvcheck.bench.cli_args import BenchTool, run_tool
from kvcheck.bench.measure.allocator import SchedulerBench
from kvcheck.bench.measure.metrics import PairedRatio, percentile
from kvcheck.bench.measure.paired import PairedBench, paired_ratio, run_one_round
from kvcheck.bench.replay.scheduler import SchedulerRun
from kvcheck.bench.workload.scenarios import (
    DEFAULT_BLOCK_SIZE,
    Draws,
    RequestSpec,
    Workload,
    working_set_blocks,
)
from kvcheck.conformance.loader import ImplHandle
from kvcheck.errors import KVCheckInputError

if TYPE_CHECKING:
    from kvcheck.bench.replay.native import NativeSchedulerBench

__all__ = [
    "AXES",
    "BASE",
    "QUICK_AXES",
    "SweepPoint",
    "main",
    "measure_point",
    "point_records",
    "run_sweep",
    "sweep_workload",
]

#: The base point every axis is varied around.
BASE: dict[str, int] = {"pool_blocks": 16384, "concurrency": 16, "prompt_tokens": 256}
#: Axis -> its values (increasing), full sweep.
AXES: dict[str, tuple[int, ...]] = {
    "pool_blocks": tuple(1024 << i for i in range(7)),     # 1K .. 64K
    "concurrency": tuple(8 << i for i in range(7)),        # 8 .. 512
    "prompt_tokens": tuple(128 << i for i in range(7)),    # 128 .. 8192
}
#: ``--quick``: both ends and the base of each axis.
QUICK_AXES: dict[str, tuple[int, ...]] = {
    axis: tuple(sorted({values[0], BASE[axis], values[-1]})) for axis, values in AXES.items()
}
OUTPUT_TOKENS = 16
MAX_NUM_BATCHED_TOKENS = 2048
METRICS = (("ns_per_scheduled_token", "ns/token"), ("ns_per_allocate_slots", "ns/call"))


def sweep_workload(point: dict[str, int], seed: int = 0, quick: bool = False,
                   block_size: int = DEFAULT_BLOCK_SIZE) -> Workload:
    """The trace of one point (see the module docstring); same point and seed, same trace.

    Raises:
        KVCheckInputError: a missing or non-positive parameter, or a request that cannot fit
            in the pool alone.
    """
    for name in BASE:
        if point.get(name, 0) < 1:
            raise KVCheckInputError(f"sweep point needs {name} >= 1, got {point.get(name)}")
    pool, running, prompt = point["pool_blocks"], point["concurrency"], point["prompt_tokens"]
    if math.ceil((prompt + OUTPUT_TOKENS) / block_size) >= pool:
        raise KVCheckInputError(f"a {prompt}-token request does not fit in {pool} blocks")
    num_requests = max(running, 16) if quick else max(2 * running, 64)
    draws = Draws(seed, f"sweep/{pool}/{running}/{prompt}")
    requests = tuple(RequestSpec(f"sweep-{i:05d}", 0, draws.tokens(prompt),
                                 draws.tokens(OUTPUT_TOKENS)) for i in range(num_requests))
    working_set = working_set_blocks(requests, block_size)
    return Workload(
        scenario="sweep", seed=seed, scale=1.0, block_size=block_size, requests=requests,
        num_blocks=pool, max_num_seqs=running, max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        working_set_blocks=working_set, pool_fraction=pool / working_set,
        distributions={"prompt": str(prompt), "output": str(OUTPUT_TOKENS),
                       "arrival": "all at step 0", "requests": str(num_requests),
                       "max_num_seqs": str(running), "pool_blocks": str(pool)})


def _costs(run: SchedulerRun) -> tuple[float, float]:
    """(ns per scheduled token, ns per allocate_slots call) of one round, on-CPU scaled."""
    per_token = run.on_cpu_ns / run.scheduled_tokens if run.scheduled_tokens else 0.0
    calls = len(run.allocate_ns)
    per_call = sum(run.allocate_ns) * run.on_cpu_fraction / calls if calls else 0.0
    return per_token, per_call


@dataclass
class SweepPoint:
    """One point's figures. ``samples[side][metric]``: per-round values, side ``impl`` or
    ``ref`` (absent when the implementation is the reference)."""

    axis: str
    value: int
    params: dict[str, int]
    samples: dict[str, dict[str, list[float]]]
    ratios: dict[str, PairedRatio | None] = field(default_factory=dict)
    produced: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def case(self) -> str:
        return f"sweep/{self.axis}={self.value}"

    def median(self, side: str, metric: str) -> float | None:
        values = self.samples.get(side, {}).get(metric)
        return percentile(values, 50) if values else None


def _bench(impl: ImplHandle, workload: Workload, level: str
           ) -> SchedulerBench | NativeSchedulerBench:
    if level == "manager":
        from kvcheck.bench.replay.native import NativeSchedulerBench, native_factory

        factory = native_factory(impl)
        if factory is None:
            raise KVCheckInputError(f"{impl.name} has no manager-level hook")
        return NativeSchedulerBench(factory, workload, impl.name)
    return SchedulerBench(impl, workload)


def measure_point(impl: ImplHandle, reference: ImplHandle, axis: str, value: int,
                  base: dict[str, int], rounds: int, warmup: int, seed: int = 0,
                  quick: bool = False, level: str = "protocol") -> SweepPoint:
    """Measure one point: ``base`` with ``axis`` set to ``value``, paired rounds."""
    params = {**base, axis: value}
    workload = sweep_workload(params, seed, quick)
    start = time.perf_counter()
    mine = _bench(impl, workload, level)
    if impl.module is reference.module:
        theirs = None
        for _ in range(warmup + rounds):
            run_one_round(mine)
    else:
        theirs = _bench(reference, workload, level)
        PairedBench(mine, theirs).measure(rounds, warmup)
    samples: dict[str, dict[str, list[float]]] = {}
    for side, bench in (("impl", mine), ("ref", theirs)):
        if bench is None:
            continue
        costs = [_costs(run) for run in bench.timed_results(warmup)]
        samples[side] = {name: [c[i] for c in costs] for i, (name, _) in enumerate(METRICS)}
    point = SweepPoint(axis, value, params, samples, seconds=time.perf_counter() - start)
    if "ref" in samples:
        point.ratios = {name: paired_ratio(samples["impl"][name], samples["ref"][name])
                        for name, _ in METRICS}
    first = mine.results[0]
    point.produced = {"preemptions": float(first.preemptions), "steps": float(first.steps),
                      "peak_usage": first.peak_usage,
                      "scheduled_tokens": float(first.scheduled_tokens),
                      "allocate_slots_calls": float(len(first.allocate_ns)),
                      "num_requests": float(len(workload.requests))}
    return point


def run_sweep(impl: ImplHandle, reference: ImplHandle, axes: Mapping[str, Sequence[int]],
              base: dict[str, int] | None = None, rounds: int = 3, warmup: int = 1,
              seed: int = 0, quick: bool = False, level: str = "protocol",
              progress: Callable[[SweepPoint], None] | None = None) -> list[SweepPoint]:
    """Every point of ``axes`` (axis -> increasing values) around ``base`` (default
    ``BASE``), in order. A point met again (the base lies on every axis) is measured once;
    its figures are repeated under the other axis.

    Raises:
        KVCheckInputError: an unknown axis, or values that do not increase.
    """
    base = dict(BASE if base is None else base)
    for axis, values in axes.items():
        if axis not in BASE:
            raise KVCheckInputError(f"unknown sweep axis {axis!r}; known: {', '.join(BASE)}")
        if list(values) != sorted(set(values)):
            raise KVCheckInputError(f"sweep axis {axis}: values must increase, got {values}")
    points: list[SweepPoint] = []
    measured: dict[tuple[tuple[str, int], ...], SweepPoint] = {}
    for axis, values in axes.items():
        for value in values:
            key = tuple(sorted({**base, axis: value}.items()))
            same = measured.get(key)
            if same is not None:
                point = replace(same, axis=axis, value=value)
            else:
                point = measure_point(impl, reference, axis, value, base, rounds, warmup,
                                      seed, quick, level)
                measured[key] = point
            points.append(point)
            if progress is not None:
                progress(point)
    return points


def _fmt_ns(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _fmt_ratio(r: PairedRatio | None) -> str:
    return "-" if r is None else f"{r.ratio:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}]"


def format_table(points: Sequence[SweepPoint], impl_name: str, paired: bool) -> str:
    """The sweep as a plain-text table, one row per point."""
    head = ["axis", "value", f"{impl_name} ns/token", "ref ns/token", "cost ratio [95%]",
            f"{impl_name} ns/call", "ref ns/call", "cost ratio [95%]", "preempt"]
    rows = [[p.axis, str(p.value),
             _fmt_ns(p.median("impl", "ns_per_scheduled_token")),
             _fmt_ns(p.median("ref", "ns_per_scheduled_token")),
             _fmt_ratio(p.ratios.get("ns_per_scheduled_token")),
             _fmt_ns(p.median("impl", "ns_per_allocate_slots")),
             _fmt_ns(p.median("ref", "ns_per_allocate_slots")),
             _fmt_ratio(p.ratios.get("ns_per_allocate_slots")),
             f"{p.produced.get('preemptions', 0):.0f}"] for p in points]
    if not paired:  # the implementation is the reference: no second side
        head = head[:3] + head[5:6] + head[8:]
        rows = [r[:3] + r[5:6] + r[8:] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(head)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if i > 1 else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

    lines = [line(head), *(line(r) for r in rows)]
    return "\n".join(lines)


def point_records(points: Sequence[SweepPoint], impl: ImplHandle, reference: ImplHandle, *,
                  seed: int, level: str, base: dict[str, int],
                  environment: Mapping[str, object] | None = None) -> list[dict[str, object]]:
    """Result records: one per point and subject (the implementation, and the reference when
    it was measured beside it), validated (``kvcheck.results.schema``)."""
    from kvcheck.conformance import SUITE_VERSION
    from kvcheck.results.environment import collect_environment
    from kvcheck.results.schema import make_benchmark_record, make_metric

    environment = collect_environment() if environment is None else environment
    records = []
    for point in points:
        common = {"sweep_axis": point.axis, "sweep_value": point.value,
                  "sweep_base": dict(base), "sweep_params": dict(point.params),
                  "level": level, "produced": dict(point.produced)}
        for side, subject in (("impl", impl), ("ref", reference)):
            if side not in point.samples:
                continue
            metrics = []
            for name, unit in METRICS:
                extra: dict[str, object] = dict(common)
                if side == "impl" and point.ratios:
                    ratio = point.ratios.get(name)
                    extra["reference_value"] = point.median("ref", name)
                    extra["reference_samples"] = list(point.samples["ref"][name])
                    if ratio is not None:
                        extra["ratio_to_reference"] = ratio.ratio
                        extra.update(ratio.as_extra())
                metrics.append(make_metric(name, unit, "lower_is_better",
                                           point.samples[side][name], case=point.case,
                                           extra=extra))
            records.append(make_benchmark_record(
                subject, metrics, profile=subject.info.profile, suite_version=SUITE_VERSION,
                environment=environment, seed=seed,
                extra={"sweep": {"axis": point.axis, "value": point.value, "level": level,
                                 "seconds": point.seconds}}))
    return records


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kvcheck.bench.options import (
        add_impl_option,
        add_report_option,
        add_rounds_option,
        add_seed_option,
        add_warmup_option,
    )

    add = parser.add_argument
    add_impl_option(add, note="an A/A sweep")
    add("--quick", action="store_true",
        help="three points per axis and fewer requests per point")
    add("--axis", action="append", choices=list(BASE), default=None,
        help="sweep only this axis (repeatable; default: all three)")
    add("--level", choices=("protocol", "manager"), default="protocol",
        help="time through the adapter protocol, or on the engines' own objects "
             "(make_native_manager hook, kvcheck.bench.replay.native)")
    add_rounds_option(add, default=None, per="point", default_text="3; --quick: 2")
    add_warmup_option(add, default=1, per="point")
    add_seed_option(add)
    add_report_option(add, what="one record per point")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Returns the exit status (2: a bad ``--impl`` / ``--report``, or ``--level manager``
    and a side without the hook)."""
    rounds = args.rounds if args.rounds is not None else (2 if args.quick else 3)

    from kvcheck.conformance.loader import load_impl
    from kvcheck.results.io import check_output_path, write_records

    if args.report is not None:
        check_output_path(args.report, "--report", example="sweep.jsonl")
    impl = load_impl(args.impl, call_timeout=None)
    reference = load_impl("reference", call_timeout=None)
    if args.level == "manager":
        from kvcheck.bench.replay.native import missing_hook_note, native_factory

        for side in (impl, reference):
            if native_factory(side) is None:
                print(missing_hook_note(side.name), file=sys.stderr)
                return 2
    table = QUICK_AXES if args.quick else AXES
    axes = {a: table[a] for a in (args.axis or list(BASE))}

    def progress(p: SweepPoint) -> None:
        print(f"{p.case}: {p.seconds:.1f} s", file=sys.stderr)

    points = run_sweep(impl, reference, axes, BASE, rounds, args.warmup, args.seed,
                       args.quick, args.level, progress)
    paired = impl.module is not reference.module
    print(f"{impl.name} against the reference, {args.level} level, median of {rounds} "
          f"rounds; base {', '.join(f'{k}={v}' for k, v in BASE.items())}; cost ratio = "
          f"{impl.name} / reference (above 1: {impl.name} costs more)")
    print(format_table(points, impl.name, paired))
    if args.report is not None:
        records = point_records(points, impl, reference if paired else impl, seed=args.seed,
                                level=args.level, base=BASE)
        write_records(args.report, records)
        print(f"wrote {len(records)} records to {args.report}")
    return 0


TOOL = BenchTool("sweep", "kvcheck.bench.sweep", __doc__.split("\n\n")[0], add_arguments, run)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kvcheck.bench.sweep``: the same as ``kvcheck bench sweep``."""
    return run_tool(TOOL, argv)


if __name__ == "__main__":
    raise SystemExit(main())
