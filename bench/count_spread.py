"""How repeatable are the counts, and do they catch a small slowdown? ``python -m
kvcheck.bench.count_spread``.

1. Runs the counted benchmarks (``kvcheck.bench.counted``) twice on the reference and prints,
   per case, the two instruction counts and the two wall times (the case's headline figure,
   measured natively at the same scale) with their spread, ``|run 2 - run 1| / run 1``.
2. The demonstration: the same cases on a deliberately slowed reference, one extra list copy
   (the prompt's token ids) per ``allocate_slots`` call, recorded under the reference's name,
   then ``kvcheck gate`` twice: run 2 against run 1 (must pass) and the slowed reference
   against run 1 (must fail, on the scheduler counts).

Exit status: 0 when the counts' spread is within ``--max-spread`` (default 0.5%), the
unchanged run passes the gate and the slowed one is caught; 1 otherwise.

This module is also the slowed reference itself, loadable as
``--kv-impl=kvcheck.bench.count_spread`` (``IMPL_INFO``, ``make_kv_cache_manager``).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from kvcheck.bench.cli_args import BenchTool, run_tool
from kvcheck.bench.errors import CountingUnavailable
from kvcheck.conformance.loader import ImplHandle
from kvcheck.conformance.protocol import (
    ImplInfo,
    KVCacheSpec,
    ManagerWithCapabilities,
    RequestView,
)

if TYPE_CHECKING:
    from kvcheck.results.schema import RecordMetric

# IMPL_INFO is built on first use (the module's __getattr__), so it is not in __all__.
__all__ = ["SLOWED_TARGET", "SlowedReferenceManager", "main", "make_kv_cache_manager"]

SLOWED_TARGET = "kvcheck.bench.count_spread"

#: Per benchmark, the figure whose wall time is compared (it is inversely proportional to the
#: time inside the implementation's calls, as the count is proportional to its instructions).
HEADLINE = {"scheduler": "scheduled_tokens_per_s", "hashing": "hash_blocks_per_s",
            "slot_mapping": "slot_mapping_tokens_per_s"}


def _reference() -> ImplHandle:
    # Through the loader, not an import of kvcheck.adapters (bench sits beside adapters).
    from kvcheck.conformance.loader import load_impl

    return load_impl("reference", call_timeout=None)


def __getattr__(name: str) -> ImplInfo:
    """``IMPL_INFO``: the reference's, renamed ``reference-slowed``, manager capabilities only
    (built on first use)."""
    if name == "IMPL_INFO":
        ref: ImplInfo = _reference().info
        return dataclasses.replace(ref, name="reference-slowed",
                                   capabilities=ref.capabilities - {"block_pool", "kernels",
                                                                   "sizing", "offload"})
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class SlowedReferenceManager:
    """The reference manager with one deliberate waste per ``allocate_slots``: a copy of the
    prompt's token ids (hundreds to thousands of items), thrown away. Every other method is
    the reference's own."""

    def __init__(self, inner: ManagerWithCapabilities) -> None:
        self._inner = inner

    # Any: the rest of allocate_slots' positional arguments, passed on as they came
    def allocate_slots(self, request: RequestView, num_new_tokens: int,
                       *args: Any) -> list[int] | None:
        list(request.prompt_token_ids)  # the slowdown
        result: list[int] | None = self._inner.allocate_slots(request, num_new_tokens, *args)
        return result

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


def make_kv_cache_manager(spec: KVCacheSpec) -> SlowedReferenceManager:
    """A fresh slowed reference manager for ``spec``."""
    return SlowedReferenceManager(_reference().make_manager(spec, guard=False))


def _spread(a: float, b: float) -> float:
    """``|b - a| / a`` in percent."""
    return 100.0 * abs(b - a) / a if a else 0.0


def _metrics(record: Mapping[str, object]) -> list[RecordMetric]:
    """The metrics of a record ``counted_record`` built (``make_benchmark_record`` validated
    it: ``validate_record``)."""
    return cast("list[RecordMetric]", record["metrics"])


def _headline(record: Mapping[str, object], case: str, bench: str) -> float | None:
    for metric in _metrics(record):
        if metric.get("case") == case and metric["name"] == HEADLINE[bench]:
            return float(metric["value"])
    return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kvcheck.bench.cli_args import float_in
    from kvcheck.bench.counted import BENCHES, DEFAULT_SCALE
    from kvcheck.bench.options import (
        add_benches_option,
        add_jobs_option,
        add_scale_option,
        add_wall_rounds_option,
    )

    add = parser.add_argument
    add_benches_option(add, BENCHES)
    add_scale_option(add, default=DEFAULT_SCALE)
    add_jobs_option(add, default=2, what="counting children side by side")
    add_wall_rounds_option(add)
    add("--max-spread", type=float_in(0.0, 100.0, "percent", "--max-spread 0.5"), default=0.5,
        help="largest acceptable spread of a count between the runs, in percent (default 0.5)")
    add("--no-demo", action="store_true", help="skip the slowed-reference demonstration")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Returns the exit status (1: a spread too large, or the gate demonstration failed; 2:
    no valgrind)."""
    from kvcheck.bench.counted import (
        count_cases,
        counted_record,
        default_cases,
        unavailable_reason,
    )
    from kvcheck.results.gate import GateConfig, render_gate, run_gate

    reason = unavailable_reason()
    if reason:
        raise CountingUnavailable(reason)
    cases = default_cases(args.bench, args.scale)
    reference = {"name": "reference", "version": _reference().info.version}
    records, timings = [], []
    for run in (1, 2):
        start = time.perf_counter()
        counts = count_cases(cases, "reference", jobs=args.jobs)
        records.append(counted_record("reference", counts, wall_rounds=args.wall_rounds,
                                      implementation=reference))
        timings.append(time.perf_counter() - start)
        print(f"run {run}: {len(cases)} case(s) counted and timed in {timings[-1]:.1f} s")
    first, second = ({m["case"]: int(m["value"]) for m in _metrics(r)
                      if m.get("deterministic")} for r in records)
    print(f"\n{'case':<36} {'count 1':>13} {'count 2':>13} {'spread':>8}   "
          f"{'wall 1':>10} {'wall 2':>10} {'spread':>8}  (wall: headline figure)")
    worst = 0.0
    for case in cases:
        a, b = first[case.key], second[case.key]
        worst = max(worst, _spread(a, b))
        wa, wb = (_headline(r, case.key, case.bench) for r in records)
        wall = ("-" if wa is None or wb is None else
                f"{wa:>10.4g} {wb:>10.4g} {_spread(wa, wb):>7.2f}%")
        print(f"{case.key:<36} {a:>13,} {b:>13,} {_spread(a, b):>7.3f}%   {wall}")
    ok = worst <= args.max_spread
    print(f"\nlargest spread of a count: {worst:.3f}% (target <= {args.max_spread}%): "
          f"{'ok' if ok else 'TOO LARGE'}")
    if args.no_demo:
        return 0 if ok else 1

    print("\n== gate: run 2 against run 1 (unchanged: must pass) ==")
    unchanged = run_gate([("run1", records[0])], [("run2", records[1])], GateConfig())
    print(render_gate(unchanged))
    slowed_cases = [c for c in cases if c.bench == "scheduler"] or cases
    slowed_counts = count_cases(slowed_cases, SLOWED_TARGET, jobs=args.jobs)
    slowed = counted_record(SLOWED_TARGET, slowed_counts, wall_rounds=0,
                            implementation={**reference, "module": SLOWED_TARGET})
    # The baseline's counts of the same cases only, so that the report lists what moved.
    keys = {c.case.key for c in slowed_counts}
    baseline = {**records[0], "metrics": [m for m in _metrics(records[0])
                                          if m.get("deterministic") and m["case"] in keys]}
    print("== gate: the slowed reference (one extra list copy per allocate_slots) against "
          "run 1 (must fail) ==")
    caught = run_gate([("run1", baseline)], [("slowed", slowed)], GateConfig())
    print(render_gate(caught))
    for count in slowed_counts:
        base = first[count.case.key]
        print(f"slowed {count.case.key:<36} {base:>13,} -> {count.instructions:>13,} "
              f"({100.0 * (count.instructions - base) / base:+.2f}%)")
    demo_ok = unchanged.exit_code == 0 and caught.exit_code == 1
    print(f"\ndemonstration: unchanged run {'passes' if unchanged.exit_code == 0 else 'FAILS'}"
          f", slowed reference {'caught' if caught.exit_code == 1 else 'NOT CAUGHT'}")
    return 0 if ok and demo_ok else 1


TOOL = BenchTool("spread", "kvcheck.bench.count_spread",
                 "Run the counted benchmarks twice and print the spread of instruction counts "
                 "and wall time; then show that the gate catches a slowed reference on counts "
                 "and passes an unchanged run.", add_arguments, run)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kvcheck.bench.count_spread``: the same as ``kvcheck bench spread``."""
    return run_tool(TOOL, argv)


if __name__ == "__main__":
    raise SystemExit(main())
