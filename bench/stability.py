"""Do the allocator ratios hold from run to run? Two back-to-back runs, and how far each moved.

::

    python -m kvcheck.bench.stability                       # reference against itself (A/A)
    python -m kvcheck.bench.stability --impl vllm --layers  # vLLM 0.33 against the reference
    python -m kvcheck.bench.stability --impl mypkg.adapter --rounds 9 --scale 0.5

Each run measures every scheduler scenario and every hashing algorithm the implementation
lists, interleaved with the reference on the same inputs (``kvcheck.bench.paired``: rounds
A B B A ..., GC collected before and off during every round of both sides). Per case it prints
the median of the paired ratios of the headline figure (``scheduled_tokens_per_s`` or
``hash_blocks_per_s``, implementation over reference: above 1 is faster) with its 95 %
interval, for run 1 and run 2, and ``moved``: ``run2 / run1 - 1``. The exit status is 1 when a
case moved by more than ``--tolerance`` (default 10 %).

``--layers`` adds, per scenario, the harness's share (the null adapter's floor over the
implementation's time, ``kvcheck.bench.harness``) and the protocol layer's share of the
engine's own time, for adapters that expose their engine manager.

``--level protocol|manager|both`` (default ``protocol``) chooses where scheduler scenarios
are timed: through the adapter protocol, or on the engine's own objects through the
adapters' ``make_native_manager`` hook (``kvcheck.bench.native``), the implementation's
hook paired with the reference's, same A B B A interleaving. Without a hook on either side
the manager level is not reported (a line says so). ``both`` also prints, per scenario and
run, how far the protocol-level ratio is from the manager-level one
(``protocol / manager - 1``). Hashing cases are protocol-level only (skipped with
``--level manager``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from kvcheck.bench.allocator import HashingBench, RoundBench, SchedulerBench, workload_spec
from kvcheck.bench.native import NativeSchedulerBench, missing_hook_note, native_factory
from kvcheck.bench.paired import PairedBench, PairedRatio
from kvcheck.bench.workloads import SCENARIOS, Workload, make_workload

__all__ = ["LEVELS", "CaseRatio", "main", "measure_cases", "moved"]

HEADLINE = {"scheduler": "scheduled_tokens_per_s", "hashing": "hash_blocks_per_s"}
#: ``--level`` choices and the levels each one measures.
LEVELS = {"protocol": ("protocol",), "manager": ("manager",), "both": ("protocol", "manager")}


@dataclass(frozen=True)
class CaseRatio:
    """One case's paired ratio in one run."""

    group: str
    case: str
    ratio: PairedRatio | None
    seconds: float  # wall time of the case (both sides, warm-up included)
    level: str = "protocol"  # or "manager": engine objects (kvcheck.bench.native)

    @property
    def label(self) -> str:
        return f"{self.group}/{self.case}" + ("" if self.level == "protocol" else
                                               f" @{self.level}")


def moved(first: float, second: float) -> float:
    """Relative move of a ratio between two runs: ``second / first - 1`` (0.05 = +5 %)."""
    return second / first - 1.0


def _measure(make: Callable[[Any], RoundBench], impl: Any, reference: Any, group: str,
             rounds: int, warmup: int) -> PairedRatio | None:
    ref_bench = make(reference)
    ref_bench.clock = None
    impl_bench = make(impl)
    impl_bench.clock = None  # no pytest-benchmark here: nothing reads the clock
    pair = PairedBench(impl_bench, ref_bench)
    pair.measure(rounds, warmup)
    mine, _ = pair.metrics(warmup)
    headline = next(m for m in mine if m.name == HEADLINE[group])
    return headline.paired


def _scheduler_bench(impl: Any, workload: Workload) -> RoundBench:
    return SchedulerBench(impl, workload)


def _native_bench(impl: Any, workload: Workload) -> RoundBench:
    factory = native_factory(impl)
    assert factory is not None  # measure_cases checked both sides
    return NativeSchedulerBench(factory, workload, impl.name)


def _hashing_bench(impl: Any, algo: str, seed: int, scale: float) -> RoundBench:
    return HashingBench(impl, algo, seed, scale)


def manager_level_missing(impl: Any, reference: Any) -> str | None:
    """Why the manager level cannot be measured (a side without the hook), or None."""
    for side in (impl, reference):
        if native_factory(side) is None:
            return missing_hook_note(side.name)
    return None


def measure_cases(impl: Any, reference: Any, scenarios: Sequence[str],
                  hash_algos: Sequence[str], rounds: int, warmup: int, scale: float,
                  seed: int, levels: Sequence[str] = ("protocol",)) -> list[CaseRatio]:
    """One run: every scenario (at each of ``levels``, the manager level only when both
    sides have the hook), then every hashing algorithm, paired with the reference."""
    out = []
    makers = {"protocol": _scheduler_bench, "manager": _native_bench}
    if "manager" in levels and manager_level_missing(impl, reference) is not None:
        levels = [lv for lv in levels if lv != "manager"]
    for scenario in scenarios:
        workload = make_workload(scenario, seed, scale)
        for level in levels:
            start = time.perf_counter()
            ratio = _measure(partial(makers[level], workload=workload), impl, reference,
                             "scheduler", rounds, warmup)
            out.append(CaseRatio("scheduler", scenario, ratio, time.perf_counter() - start,
                                 level))
    for algo in hash_algos:
        start = time.perf_counter()
        ratio = _measure(partial(_hashing_bench, algo=algo, seed=seed, scale=scale), impl,
                         reference, "hashing", rounds, warmup)
        out.append(CaseRatio("hashing", algo, ratio, time.perf_counter() - start))
    return out


def _fmt(r: PairedRatio | None) -> str:
    if r is None:
        return f"{'-':>22}"
    return f"{r.ratio:6.3f} [{r.ci_low:5.3f}, {r.ci_high:5.3f}]"


def _print_layers(impl: Any, scenarios: Sequence[str], scale: float, seed: int) -> None:
    from kvcheck.bench.harness import measure_layers

    print(f"\nlayers of {impl.name} (median of 5 replays; shares of the engine's own time for "
          "the protocol layer, of the adapter's time for the harness floor)")
    print(f"{'scenario':22s} {'adapter ms':>10s} {'engine ms':>10s} {'floor ms':>9s} "
          f"{'harness':>8s} {'protocol':>9s}")
    for scenario in scenarios:
        workload = make_workload(scenario, seed, scale)
        spec = workload_spec(workload)
        lt = measure_layers(lambda s: impl.make_manager(s, guard=False), spec, workload)
        engine = "-" if lt.engine_ns is None else f"{lt.engine_ns / 1e6:10.1f}"
        share = lt.protocol_share
        print(f"{scenario:22s} {lt.adapter_ns / 1e6:10.1f} {engine:>10s} "
              f"{lt.floor_ns / 1e6:9.2f} {lt.harness_share:8.1%} "
              f"{'-' if share is None else f'{share:.1%}':>9s}")


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


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; returns the exit status (1: a ratio moved too far; 2:
    ``--level manager`` and a side without the hook)."""
    parser = argparse.ArgumentParser(prog="python -m kvcheck.bench.stability",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", default="reference", help="--kv-impl target (default: "
                        "reference, i.e. an A/A run whose ratios should all be 1)")
    parser.add_argument("--rounds", type=int, default=7, help="timed pairs per case")
    parser.add_argument("--warmup", type=int, default=1, help="untimed pairs per case")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--scenarios", nargs="*", default=None,
                        help=f"subset of {', '.join(SCENARIOS)}")
    parser.add_argument("--hash-algos", nargs="*", default=None)
    parser.add_argument("--tolerance", type=float, default=0.10)
    parser.add_argument("--layers", action="store_true",
                        help="also print the harness floor and protocol-layer shares")
    parser.add_argument("--level", choices=list(LEVELS), default="protocol",
                        help="time scheduler scenarios through the adapter protocol, on the "
                        "engine's own objects (make_native_manager hook), or both")
    args = parser.parse_args(argv)

    from kvcheck.conformance.loader import load_impl

    impl = load_impl(args.impl, call_timeout=None)
    reference = load_impl("reference", call_timeout=None)
    scenarios = list(args.scenarios or SCENARIOS)
    algos = [a for a in (args.hash_algos or impl.info.hash_algos)
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
                                  args.scale, args.seed, levels))
        print(f"run {run + 1}: {time.perf_counter() - start:.1f} s", file=sys.stderr)
    if not runs:  # --runs 0: only the layers
        if args.layers:
            _print_layers(impl, scenarios, args.scale, args.seed)
        return 0
    print(f"{impl.name} / reference, median of {args.rounds} paired ratios [95% interval], "
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
        _print_layers(impl, scenarios, args.scale, args.seed)
    return 1 if worst > args.tolerance else 0


if __name__ == "__main__":
    raise SystemExit(main())
