"""Do the allocator ratios hold from run to run? Two back-to-back runs, and how far each moved.

::

    kvcheck bench stability                       # reference against itself (A/A)
    kvcheck bench stability --impl vllm --layers  # vLLM 0.33 against the reference
    kvcheck bench stability --impl mypkg.adapter --rounds 9 --scale 0.5

Each run measures every scheduler scenario and every hashing algorithm the implementation
lists, interleaved with the reference on the same inputs (``kvcheck.bench.measure.paired``: rounds
A B B A ..., GC collected before and off during every round of both sides). Per case it prints
the median of the paired ratios of the headline figure (``scheduled_tokens_per_s`` or
``hash_blocks_per_s``, implementation over reference: above 1 is faster) with its 95 %
interval, for run 1 and run 2, and ``moved``: ``run2 / run1 - 1``. The exit status is 1 when a
case moved by more than ``--tolerance`` (default 10 %).

Every case gets at least ``--rounds`` timed pairs, and more when they would take less than
``--min-time`` seconds (estimated from the warm-up pairs; at most ``--max-rounds``): the
median of 7 pairs of a 20 ms hashing round moves by 10-20 % on a loaded machine, the median
of 60 much less. ``--scenarios`` also takes ``trace:PATH`` (a request trace or a recorded
corpus, as ``--kv-bench-workload``). ``--report PATH`` writes the figures as result records
(``stability_records``), with the environment, for ``results/``.

``--layers`` adds, per scenario, the harness's share (the null adapter's floor over the
implementation's time, ``kvcheck.bench.replay.harness``) and the protocol layer's share of the
engine's own time, for adapters that expose their engine manager.

``--level protocol|manager|both`` (default ``protocol``) chooses where scheduler scenarios
are timed: through the adapter protocol, or on the engine's own objects through the
adapters' ``make_native_manager`` hook (``kvcheck.bench.replay.native``), the implementation's
hook paired with the reference's, same A B B A interleaving. Without a hook on either side
the manager level is not reported (a line says so). ``both`` also prints, per scenario and
run, how far the protocol-level ratio is from the manager-level one
(``protocol / manager - 1``). Hashing cases are protocol-level only (skipped with
``--level manager``).
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TypedDict

from kvcheck.bench.cli_args import BenchTool, run_tool
from kvcheck.bench.measure.allocator import HashingBench, SchedulerBench, workload_spec
from kvcheck.bench.measure.metrics import Metric, PairedRatio, percentile
from kvcheck.bench.measure.paired import PairedBench
from kvcheck.bench.measure.rounds import Bench
from kvcheck.bench.replay.native import NativeSchedulerBench, missing_hook_note, native_factory
from kvcheck.bench.workload.scenarios import SCENARIOS, Workload
from kvcheck.bench.workload.source import resolve_workload as _resolve_uncached
from kvcheck.bench.workload.source import scheduler_bench_maker
from kvcheck.conformance.loader import ImplHandle

__all__ = ["LEVELS", "CaseRatio", "adaptive_rounds", "main", "measure_cases", "moved",
           "protocol_layer_share", "stability_records"]

#: Each ``--scenarios`` value is built or read once per process (every run, the layers and
#: the up-front check share it): a recorded corpus takes about 2 s to load.
resolve_workload = functools.lru_cache(maxsize=None)(_resolve_uncached)

HEADLINE = {"scheduler": "scheduled_tokens_per_s", "hashing": "hash_blocks_per_s"}
#: ``--level`` choices and the levels each one measures.
LEVELS = {"protocol": ("protocol",), "manager": ("manager",), "both": ("protocol", "manager")}


@dataclass(frozen=True)
class CaseRatio:
    """One case's paired ratio in one run, and the headline metric of each side."""

    group: str
    case: str
    ratio: PairedRatio | None
    seconds: float  # wall time of the case (both sides, warm-up included)
    level: str = "protocol"  # or "manager": engine objects (kvcheck.bench.replay.native)
    mine: Metric | None = None  # the implementation's headline, per-pair samples
    theirs: Metric | None = None  # the reference's, same pairs

    @property
    def label(self) -> str:
        return f"{self.group}/{self.case}" + ("" if self.level == "protocol" else
                                               f" @{self.level}")


def moved(first: float, second: float) -> float:
    """Relative move of a ratio between two runs: ``second / first - 1`` (0.05 = +5 %)."""
    return second / first - 1.0


def adaptive_rounds(rounds: int, pair_seconds: float, min_time: float,
                    max_rounds: int) -> int:
    """Timed pairs for a case whose warm-up pair took ``pair_seconds``: at least ``rounds``,
    more when that is needed for ``min_time`` seconds of pairs, at most ``max_rounds`` (and
    never fewer than ``rounds``). Short cases (hashing, burst_short) get many more pairs: a
    median over more pairs moves less when the machine is loaded."""
    if pair_seconds <= 0:
        return rounds
    return max(rounds, min(max_rounds, math.ceil(min_time / pair_seconds)))


def _measure(make: Callable[[ImplHandle], Bench], group: str, rounds: int, warmup: int,
             sides: tuple[ImplHandle, ImplHandle], min_time: float = 0.0, max_rounds: int = 0
             ) -> tuple[PairedRatio | None, Metric | None, Metric | None]:
    """One case, paired: ``warmup`` pairs, then ``adaptive_rounds`` timed pairs (``rounds``
    when ``min_time`` is 0 or there is no warm-up to estimate from). Returns the headline's
    paired ratio and the two sides' headline metrics."""
    impl, reference = sides
    return _measure_pair(make(impl), make(reference), group, rounds, warmup, min_time,
                         max_rounds)


def _measure_pair(impl_bench: Bench, ref_bench: Bench, group: str, rounds: int,
                  warmup: int, min_time: float = 0.0, max_rounds: int = 0
                  ) -> tuple[PairedRatio | None, Metric | None, Metric | None]:
    """``_measure`` on two benches already built (either may be any ``RoundBench``)."""
    pair = PairedBench(impl_bench, ref_bench)
    start = time.perf_counter()
    pair.measure(0, warmup)
    if warmup and min_time > 0:
        per_pair = (time.perf_counter() - start) / warmup
        rounds = adaptive_rounds(rounds, per_pair, min_time, max(max_rounds, rounds))
    pair.measure(rounds, 0)
    mine, theirs = pair.metrics(warmup)
    name = HEADLINE[group]
    headline = next(m for m in mine if m.name == name)
    return headline.paired, headline, next((m for m in theirs if m.name == name), None)


def _scheduler_bench(impl: ImplHandle, workload: Workload) -> Bench:
    return SchedulerBench(impl, workload)


def _native_bench(impl: ImplHandle, workload: Workload) -> Bench:
    factory = native_factory(impl)
    assert factory is not None  # measure_cases checked both sides
    return NativeSchedulerBench(factory, workload, impl.name)


def _hashing_bench(impl: ImplHandle, algo: str, seed: int, scale: float) -> Bench:
    return HashingBench(impl, algo, seed, scale)


def manager_level_missing(impl: ImplHandle, reference: ImplHandle) -> str | None:
    """Why the manager level cannot be measured (a side without the hook), or None."""
    for side in (impl, reference):
        if native_factory(side) is None:
            return missing_hook_note(side.name)
    return None


def measure_cases(impl: ImplHandle, reference: ImplHandle, scenarios: Sequence[str],
                  hash_algos: Sequence[str], rounds: int, warmup: int, scale: float,
                  seed: int, levels: Sequence[str] = ("protocol",), min_time: float = 0.0,
                  max_rounds: int = 0) -> list[CaseRatio]:
    """One run: every scenario (a name or ``trace:PATH``; at each of ``levels``, the manager
    level only when both sides have the hook and the workload is not a recorded corpus), then
    every hashing algorithm, paired with the reference (``_measure``: ``rounds`` timed pairs,
    more for short cases when ``min_time`` > 0)."""
    out = []
    makers = {"protocol": _scheduler_bench, "manager": _native_bench}
    if "manager" in levels and manager_level_missing(impl, reference) is not None:
        levels = [lv for lv in levels if lv != "manager"]
    for scenario in scenarios:
        workload = resolve_workload(scenario, seed, scale)
        for level in levels:
            if level == "manager" and not isinstance(workload, Workload):
                continue  # a recorded corpus replays protocol calls: no manager level
            make = (partial(makers[level], workload=workload) if isinstance(workload, Workload)
                    else scheduler_bench_maker(workload, impl, reference))
            start = time.perf_counter()
            ratio, mine, theirs = _measure(make, "scheduler", rounds, warmup,
                                           (impl, reference), min_time, max_rounds)
            out.append(CaseRatio("scheduler", workload.scenario, ratio,
                                 time.perf_counter() - start, level, mine, theirs))
    for algo in hash_algos:
        start = time.perf_counter()
        ratio, mine, theirs = _measure(
            partial(_hashing_bench, algo=algo, seed=seed, scale=scale), "hashing", rounds,
            warmup, (impl, reference), min_time, max_rounds)
        out.append(CaseRatio("hashing", algo, ratio, time.perf_counter() - start,
                             "protocol", mine, theirs))
    return out


def _fmt(r: PairedRatio | None) -> str:
    if r is None:
        return f"{'-':>22}"
    return f"{r.ratio:6.3f} [{r.ci_low:5.3f}, {r.ci_high:5.3f}]"


def protocol_layer_share(impl: ImplHandle, workload: Workload, rounds: int = 7, warmup: int = 1,
                         min_time: float = 2.0, max_rounds: int = 60
                         ) -> tuple[float, float, float] | None:
    """The adapter's protocol layer as a share of its engine's time, measured directly:
    the same workload at the protocol level (``SchedulerBench``) and at the manager level
    (the adapter's ``make_native_manager`` hook, ``kvcheck.bench.replay.native``) in interleaved
    pairs, ``share = protocol time / manager time - 1`` per pair. Returns ``(median share,
    interval low, interval high)``, or None without the hook. Both levels time the same
    engine work (manager calls plus the engine's own request building and token appends), so
    what the protocol level adds is the adapter's marshalling and nothing else."""
    factory = native_factory(impl)
    if factory is None:
        return None
    ratio, _, _ = _measure_pair(SchedulerBench(impl, workload),
                                NativeSchedulerBench(factory, workload, impl.name),
                                "scheduler", rounds, warmup, min_time, max_rounds)
    if ratio is None:
        return None
    # The ratio is of throughputs, protocol / manager = manager time / protocol time.
    return 1 / ratio.ratio - 1, 1 / ratio.ci_high - 1, 1 / ratio.ci_low - 1


def _print_layers(impl: ImplHandle, scenarios: Sequence[str], scale: float, seed: int,
                  rounds: int = 7, min_time: float = 2.0, max_rounds: int = 60) -> None:
    from kvcheck.bench.replay.harness import measure_layers

    print(f"\nlayers of {impl.name}: harness floor (null adapter) over the adapter's time, and "
          "the protocol layer over the engine's own time, from a timing proxy (median of 5 "
          "replays) and paired against the manager level (median and interval of paired "
          "rounds; needs make_native_manager)")
    print(f"{'scenario':22s} {'adapter ms':>10s} {'engine ms':>10s} {'floor ms':>9s} "
          f"{'harness':>8s} {'protocol':>9s} {'protocol, paired':>26s}")
    for scenario in scenarios:
        workload = resolve_workload(scenario, seed, scale)
        if not isinstance(workload, Workload):
            print(f"{workload.scenario:22s} (a recorded corpus: no scheduler loop to split)")
            continue
        spec = workload_spec(workload)
        lt = measure_layers(lambda s: impl.make_manager(s, guard=False), spec, workload)
        engine = "-" if lt.engine_ns is None else f"{lt.engine_ns / 1e6:10.1f}"
        share = lt.protocol_share
        paired = protocol_layer_share(impl, workload, rounds, 1, min_time, max_rounds)
        paired_text = "-" if paired is None else (
            f"{paired[0]:6.1%} [{paired[1]:6.1%}, {paired[2]:6.1%}]")
        print(f"{workload.scenario:22s} {lt.adapter_ns / 1e6:10.1f} {engine:>10s} "
              f"{lt.floor_ns / 1e6:9.2f} {lt.harness_share:8.1%} "
              f"{'-' if share is None else f'{share:.1%}':>9s} {paired_text:>26s}")


def level_agreement(cases: Sequence[CaseRatio]) -> dict[str, float]:
    """Per scheduler scenario measured at both levels: ``protocol ratio / manager ratio - 1``
    (0.05: the protocol level's ratio is 5 % higher)."""
    by_level = {(c.case, c.level): c.ratio for c in cases if c.group == "scheduler"}
    out = {}
    for (case, level), ratio in by_level.items():
        manager = by_level.get((case, "manager"))
        if level == "protocol" and ratio is not None and manager is not None:
            out[case] = moved(manager.ratio, ratio.ratio)
    return out


def _print_agreement(runs: Sequence[Sequence[CaseRatio]]) -> None:
    agreements = [level_agreement(run) for run in runs]
    print("\nprotocol-level ratio / manager-level ratio - 1 (how much the adapters' "
          "marshalling moves the comparison)")
    print(f"{'scenario':34s}" + "".join(f"{f'run {i + 1}':>10s}" for i in range(len(runs))))
    for case in agreements[0]:
        print(f"{case:34s}" + "".join(f"{a[case]:10.1%}" if case in a else f"{'-':>10s}"
                                      for a in agreements))


class StabilitySettings(TypedDict, total=False):
    """The command's settings, as the records keep them (``extra.stability``)."""

    scale: float
    seed: int
    rounds: int
    warmup: int
    min_time_s: float
    max_rounds: int
    level: str
    largest_move: float
    tolerance: float


def stability_records(impl: ImplHandle, reference: ImplHandle, runs: Sequence[Sequence[CaseRatio]],
                      settings: StabilitySettings,
                      environment: Mapping[str, object] | None = None
                      ) -> list[dict[str, object]]:
    """Result records of the runs (``kind="benchmark"``): one for the implementation and one
    for the reference (none for the reference when it is the implementation). Per case and
    level, the headline metric with every run's samples pooled; the implementation's carries
    the paired ratio over all pairs (``ratio_to_reference`` and its interval), each run's
    ratio and interval, and ``moved``. Manager-level metrics are named ``manager_<name>``,
    as in ``--kv-bench`` records."""
    from kvcheck.bench.measure.paired import paired_ratio
    from kvcheck.bench.replay.native import MANAGER_PREFIX
    from kvcheck.conformance import SUITE_VERSION
    from kvcheck.results.environment import collect_environment
    from kvcheck.results.schema import make_benchmark_record, make_metric

    environment = collect_environment() if environment is None else environment
    sides = [("impl", impl)] + ([] if impl.module is reference.module else [("ref", reference)])
    records = []
    for side, subject in sides:
        metrics = []
        for i, first in enumerate(runs[0]):
            cells = [run[i] for run in runs]
            got = [c.mine if side == "impl" else c.theirs for c in cells]
            if any(m is None for m in got) or any(c.ratio is None for c in cells):
                continue
            samples = [x for m in got if m is not None for x in m.samples]
            extra: dict[str, object] = {"level": first.level, "group": first.group}
            if side == "impl":
                theirs = [x for c in cells if c.theirs is not None for x in c.theirs.samples]
                pooled = paired_ratio(samples, theirs)
                ratios = [c.ratio.ratio for c in cells if c.ratio is not None]
                extra.update({
                    "reference_value": percentile(theirs, 50), "reference_samples": theirs,
                    "ratio_to_reference": None if pooled is None else pooled.ratio,
                    **({} if pooled is None else pooled.as_extra()),
                    "runs": [{"ratio": c.ratio.ratio, "ratio_ci": [c.ratio.ci_low,
                                                                   c.ratio.ci_high],
                              "pairs": c.ratio.pairs} for c in cells if c.ratio is not None],
                    "moved": max((abs(moved(ratios[0], r)) for r in ratios[1:]),
                                 default=None)})
            metric = got[0]
            assert metric is not None
            prefix = MANAGER_PREFIX if first.level == "manager" else ""
            metrics.append(make_metric(prefix + metric.name, metric.unit, metric.direction,
                                       samples, case=f"{first.group}/{first.case}",
                                       extra=extra))
        records.append(make_benchmark_record(
            subject, metrics, profile=subject.info.profile, suite_version=SUITE_VERSION,
            environment=environment, seed=settings.get("seed"),
            extra={"stability": {**settings, "runs": len(runs)}}))
    return records


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kvcheck.bench.cli_args import MAX_MIN_TIME_S, MAX_RUNS, float_in, int_in, name_in
    from kvcheck.bench.options import (
        add_impl_option,
        add_report_option,
        add_rounds_option,
        add_scale_option,
        add_seed_option,
        add_warmup_option,
    )
    from kvcheck.conformance.protocol import HASH_ALGOS

    add = parser.add_argument
    add_impl_option(add, note="an A/A run, whose ratios should all be 1")
    add_rounds_option(add, default=7, per="case")
    add_warmup_option(add, default=1, per="case")
    add_scale_option(add)
    add_seed_option(add)
    add("--runs", type=int_in(0, MAX_RUNS, "back-to-back runs; 0: only --layers", "--runs 2"),
        default=2)
    add("--scenarios", nargs="*", default=None,
        help=f"subset of {', '.join(SCENARIOS)}, or trace:PATH (a request trace or a recorded "
             "corpus, as --kv-bench-workload)")
    add("--hash-algos", nargs="*", default=None, type=name_in(HASH_ALGOS, "hash algorithm"),
        help="hashing cases to time (default: every algorithm both list; none given: no "
             "hashing case)")
    add("--tolerance", type=float_in(0.0, 1000.0, "the largest acceptable move, a fraction",
                                     "--tolerance 0.1"), default=0.10)
    add("--min-time", type=float_in(0.0, MAX_MIN_TIME_S, "seconds of pairs per case",
                                    "--min-time 2"), default=2.0, metavar="S",
        help="time at least S seconds of pairs per case (estimated from the warm-up pairs; "
             "default 2): short cases get more than --rounds pairs")
    add_rounds_option(add, default=60, per="case with --min-time", name="max-rounds",
                      unit="most timed pairs")
    add_report_option(add, what="every case's headline samples, paired ratios per run and "
                                "moves, and the environment,")
    add("--layers", action="store_true",
        help="also print the harness floor and protocol-layer shares")
    add("--level", choices=list(LEVELS), default="protocol",
        help="time scheduler scenarios through the adapter protocol, on the engine's own "
             "objects (make_native_manager hook), or both")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Returns the exit status (1: a ratio moved too far; 2: bad input, named on one line,
    or ``--level manager`` and a side without the hook)."""
    if args.runs == 0 and not args.layers:
        parser.error("argument --runs: 0 runs measure nothing without --layers; Fix: e.g. "
                     "--runs 2, or add --layers")

    from kvcheck.conformance.loader import load_impl
    from kvcheck.results.io import check_output_path, write_records

    if args.report is not None:
        check_output_path(args.report, "--report", example="stability.jsonl")
    impl = load_impl(args.impl, call_timeout=None)
    reference = load_impl("reference", call_timeout=None)
    scenarios = list(args.scenarios or SCENARIOS)
    for scenario in scenarios:  # a bad name or file stops here, before any measurement
        resolve_workload(scenario, args.seed, args.scale)
    chosen = impl.info.hash_algos if args.hash_algos is None else args.hash_algos
    algos = [a for a in chosen
             if a in reference.info.hash_algos]
    if not impl.has("block_hashes"):
        algos = []
    levels = LEVELS[args.level]
    missing = manager_level_missing(impl, reference) if "manager" in levels else None
    if missing is not None:
        print(missing)
        if args.level == "manager":
            return 2  # nothing to measure
    if args.level == "manager":
        algos = []  # hashing is measured at the protocol level only
    runs = []
    for run in range(args.runs):
        start = time.perf_counter()
        runs.append(measure_cases(impl, reference, scenarios, algos, args.rounds, args.warmup,
                                  args.scale, args.seed, levels, args.min_time,
                                  args.max_rounds))
        print(f"run {run + 1}: {time.perf_counter() - start:.1f} s", file=sys.stderr)
    if not runs:  # --runs 0: only the layers
        if args.layers:
            _print_layers(impl, scenarios, args.scale, args.seed, args.rounds, args.min_time,
                          args.max_rounds)
        return 0
    print(f"{impl.name} / reference, median of >= {args.rounds} paired ratios [95% interval] "
          f"(at least {args.min_time:g} s of pairs per case, at most {args.max_rounds} pairs), "
          f"scale {args.scale}, seed {args.seed}; above 1: {impl.name} is faster")
    header = "".join(f"{f'run {i + 1}':>24s}" for i in range(len(runs)))
    print(f"{'case':42s}{header}  {'moved':>7s}")
    worst = 0.0
    for i, first in enumerate(runs[0]):
        cells = [run[i].ratio for run in runs]
        line = f"{first.label:42s}" + "".join(f"{_fmt(c):>24s}" for c in cells)
        ratios = [c.ratio for c in cells if c is not None]
        if len(ratios) == len(cells) > 1:
            change = max(abs(moved(ratios[0], r)) for r in ratios[1:])
            worst = max(worst, change)
            line += f"  {change:7.1%}"
        print(line)
    print(f"largest move: {worst:.1%} (tolerance {args.tolerance:.0%})")
    if args.level == "both" and missing is None:
        _print_agreement(runs)
    if args.layers:
        _print_layers(impl, scenarios, args.scale, args.seed, args.rounds, args.min_time,
                      args.max_rounds)
    if args.report is not None:
        settings: StabilitySettings = {
            "scale": args.scale, "seed": args.seed, "rounds": args.rounds,
            "warmup": args.warmup, "min_time_s": args.min_time, "max_rounds": args.max_rounds,
            "level": args.level, "largest_move": worst, "tolerance": args.tolerance}
        records = stability_records(impl, reference, runs, settings)
        write_records(args.report, records)
        print(f"wrote {len(records)} records to {args.report}")
    return 1 if worst > args.tolerance else 0


TOOL = BenchTool("stability", "kvcheck.bench.stability", __doc__.split("\n\n")[0],
                 add_arguments, run)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kvcheck.bench.stability``: the same as ``kvcheck bench stability``."""
    return run_tool(TOOL, argv)


if __name__ == "__main__":
    raise SystemExit(main())
