"""The benchmark session: options, shared caches, collected results and the result records.

One ``BenchSession`` lives in ``config.stash`` and is the ``kv_bench`` fixture. It caches
workloads, measures each allocator benchmark interleaved with the reference (``paired``), owns the
kernel timing device and the one live kernel input pool, collects a ``BenchResult`` per
benchmark, fills the cross-provider kernel ratios (``finalize``) and builds kvcheck result
records (``records``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from kvcheck.bench.measure.metrics import Metric, summarize
from kvcheck.bench.measure.rounds import Bench, BenchmarkFixture
from kvcheck.bench.measure.timing import ALLOCATOR_CLOCK
from kvcheck.conformance.loader import ImplHandle

if TYPE_CHECKING:
    from kvcheck.bench.kernels.inputs import KernelBenchCase, KernelInputPool
    from kvcheck.bench.measure.machine import DeviceInfo, KernelDevice
    from kvcheck.bench.workload.source import WorkloadSource

__all__ = ["BenchOptions", "BenchResult", "BenchSession"]

#: Default (timed rounds, warm-up rounds) per group and device.
DEFAULT_ROUNDS = {"allocator": (5, 1), "kernels-cuda": (30, 5), "kernels-cpu": (3, 1)}


@dataclass(frozen=True)
class BenchOptions:
    """The ``--kv-bench-*`` options, validated."""

    enabled: bool = False
    scale: float = 1.0
    seed: int = 0
    rounds: int | None = None  # None: DEFAULT_ROUNDS
    warmup: int | None = None
    device: str = "auto"  # auto | cuda | cpu
    l2: str = "cold"
    peak_gbps: float | None = None
    report: str | None = None
    #: ``--kv-bench-workload`` values: scheduler workloads to time instead of the built-in
    #: scenarios (a scenario name or ``trace:PATH``); empty: every built-in scenario.
    workloads: tuple[str, ...] = ()

    def rounds_for(self, group: str) -> tuple[int, int]:
        """``(rounds, warmup)`` for ``allocator``, ``kernels-cuda`` or ``kernels-cpu``."""
        rounds, warmup = DEFAULT_ROUNDS[group]
        return (self.rounds if self.rounds is not None else rounds,
                self.warmup if self.warmup is not None else warmup)


@dataclass
class BenchResult:
    """One benchmark's figures.

    Attributes:
        group: ``scheduler``, ``hashing``, ``slot_mapping`` or ``kernels``.
        case: scenario, hash algorithm or ``<op>/<kernel case>``.
        subject: who was measured: the implementation's name, or a kernel provider.
        baseline: what ``Metric.reference_value`` refers to.
    """

    group: str
    case: str
    subject: str
    subject_version: str
    nodeid: str
    device: str
    metrics: list[Metric]
    # Any: each benchmark's own info (RoundBench.info and what the session adds); table.py
    # reads the scheduler's "produced" figures from it
    info: dict[str, Any] = field(default_factory=dict)
    baseline: str = ""
    implementation: ImplHandle | None = None  # when the subject is the implementation
    extra_info: dict[str, object] | None = field(default=None, repr=False)  # pytest-benchmark's

    def metric(self, name: str) -> Metric | None:
        return next((m for m in self.metrics if m.name == name), None)


class BenchSession:
    """State shared by the benchmarks of one pytest session (the ``kv_bench`` fixture)."""

    def __init__(self, options: BenchOptions) -> None:
        self.options = options
        self.results: list[BenchResult] = []
        self._workloads: dict[str, WorkloadSource] = {}
        self._device: KernelDevice | None = None
        self._device_error: str | None = None
        self._pool: KernelInputPool | None = None
        self._measured_once: dict[tuple[str, str], str] = {}

    # ------------------------------------------------------------------------------ allocator
    def workload(self, scenario: str) -> WorkloadSource:
        """The session's workload of ``scenario``: a built-in scenario's trace
        (``--kv-bench-seed``, ``--kv-bench-scale``) or a ``trace:PATH`` file's, read once.

        Raises:
            KVCheckInputError: an unknown name or a bad trace file (the message says which).
        """
        if scenario not in self._workloads:
            from kvcheck.bench.workload.source import resolve_workload

            self._workloads[scenario] = resolve_workload(scenario, self.options.seed,
                                                         self.options.scale)
        return self._workloads[scenario]

    def check_workloads(self) -> None:
        """Read every ``--kv-bench-workload`` up front, so that a bad value stops the session
        before any benchmark runs (same errors as ``workload``)."""
        for value in self.options.workloads:
            self.workload(value)

    def run_allocator(self, benchmark: BenchmarkFixture, request: pytest.FixtureRequest,
                      impl: ImplHandle, reference: ImplHandle,
                      make: Callable[[ImplHandle], Bench], group: str, case: str
                      ) -> BenchResult:
        """Measure ``make(impl)`` through pytest-benchmark, interleaved round by round with
        ``make(reference)`` on the same inputs (``bench.measure.paired``: A B B A ..., GC handled
        the same way for both), unless the implementation *is* the reference. The ratios are the
        medians of the per-pair ratios, with their confidence intervals."""
        from kvcheck.bench.measure.paired import PairedBench

        rounds, warmup = self.options.rounds_for("allocator")
        is_reference = impl.module is reference.module
        bench = make(impl)
        bench.clock = ALLOCATOR_CLOCK  # pytest-benchmark's timer: the implementation's rounds
        if is_reference:
            benchmark.pedantic(bench.run, setup=bench.setup, rounds=rounds,
                               warmup_rounds=warmup)
            metrics = bench.metrics(bench.timed_results(warmup))
            for metric in metrics:
                metric.reference_value = metric.value
            baseline = "itself (the implementation is the reference)"
        else:
            ref_bench = make(reference)  # no clock: its rounds are not the implementation's
            pair = PairedBench(bench, ref_bench)
            benchmark.pedantic(pair.run, setup=pair.setup, rounds=rounds,
                               warmup_rounds=warmup)
            metrics, _ = pair.metrics(warmup)
            baseline = (f"reference {reference.info.version}, same run, same inputs, rounds "
                        "interleaved A B B A")
        info = {**bench.info(), "rounds": len(bench.timed_results(warmup)),
                "warmup_rounds": warmup, "timer": "time inside the implementation's calls"}
        manager_metrics, manager_info = _manager_level(bench, impl, reference, rounds, warmup)
        metrics = [*metrics, *manager_metrics]
        info.update(manager_info)
        result = BenchResult(group, case, impl.name, impl.info.version, request.node.nodeid,
                             "cpu", metrics, info, baseline, impl)
        self.add(result, benchmark)
        return result

    # -------------------------------------------------------------------------------- kernels
    def resolve_device(self) -> str | None:
        """``"cuda"``, ``"cpu"``, or None when kernel benchmarks cannot run (see
        ``device_skip_reason``)."""
        wanted = self.options.device
        try:
            import torch
        except ImportError:
            self._device_error = ("kernel benchmarks need torch and triton: "
                                  "pip install 'kvcheck[kernels]'")
            return None
        has_cuda = torch.cuda.is_available()
        if wanted == "cpu":
            return "cpu"
        if has_cuda:
            return "cuda"
        self._device_error = (
            "no CUDA device: kernel benchmarks time CUDA kernels with CUDA events"
            + (" (--kv-bench-device=cuda was requested)" if wanted == "cuda" else
               "; pass --kv-bench-device=cpu to time the torch references on the CPU instead"))
        return None

    def device_skip_reason(self) -> str | None:
        """Why kernel benchmarks are skipped in this session, or None."""
        return self._device_error if self.resolve_device() is None else None

    def kernel_device(self) -> KernelDevice:
        """The session's ``KernelDevice`` (created, and the copy peak measured, on first use)."""
        if self._device is None:
            from kvcheck.bench.measure.machine import KernelDevice

            device = self.resolve_device()
            if device is None:
                pytest.skip(self._device_error or "no kernel device")
            self._device = KernelDevice.create(device, self.options.l2, self.options.peak_gbps)
        return self._device

    def close(self) -> None:
        """Release the kernel inputs and restore what the kernel device changed."""
        if self._pool is not None:
            self._pool.release()
            self._pool = None
        if self._device is not None:
            self._device.restore()

    def device_info(self) -> DeviceInfo | None:
        """The kernel device's description, or None when no kernel benchmark ran."""
        return None if self._device is None else self._device.describe()

    def kernel_pool(self, case: KernelBenchCase) -> KernelInputPool:
        """The input pool of ``case``; the previous case's pool is released first."""
        from kvcheck.bench.kernels.inputs import KernelInputPool

        if self._pool is not None and self._pool.case == case:
            return self._pool
        if self._pool is not None:
            self._pool.release()
            self._pool = None
            if self.kernel_device().device == "cuda":
                import torch

                torch.cuda.empty_cache()
        self._pool = KernelInputPool(case, self.kernel_device().device)
        return self._pool

    def claim_comparator(self, provider: str, case_id: str, impl_name: str) -> str | None:
        """Comparators (all providers but ``impl``) are measured once per session, for the
        first implementation; returns a skip reason for the later ones."""
        key = (provider, case_id)
        owner = self._measured_once.setdefault(key, impl_name)
        if owner != impl_name:
            return f"{provider} is measured once per session (see the rows under {owner})"
        return None

    # -------------------------------------------------------------------------------- results
    def add(self, result: BenchResult, benchmark: BenchmarkFixture | None = None) -> None:
        """Keep ``result`` and mirror it into pytest-benchmark's ``extra_info``."""
        self.results.append(result)
        if benchmark is not None:
            result.extra_info = benchmark.extra_info  # the dict pytest-benchmark serializes
            result.extra_info.update(extra_info(result))

    def finalize(self) -> None:
        """Kernel ratios: every provider's figures against ``torch_ref`` on the same case
        (the reference), plus the time ratio to ``kvcheck_triton``. Idempotent."""
        kernels = [r for r in self.results if r.group == "kernels"]
        by_case: dict[str, dict[str, BenchResult]] = {}
        for r in kernels:
            by_case.setdefault(r.case, {})[r.subject] = r
        for providers in by_case.values():
            ref = providers.get("torch_ref")
            triton = providers.get("kvcheck_triton")
            for r in providers.values():
                if ref is not None:
                    r.baseline = "torch_ref (kvcheck's torch reference), same run, same case"
                    for m in r.metrics:
                        ref_metric = ref.metric(m.name)
                        m.reference_value = ref_metric.value if ref_metric else None
                if triton is not None and r is not triton:
                    t, mine = triton.metric("time_us"), r.metric("time_us")
                    if t is not None and mine is not None and mine.value > 0:
                        r.info["speedup_vs_kvcheck_triton"] = t.value / mine.value
        for r in kernels:
            if r.extra_info is not None:
                r.extra_info.update(extra_info(r))

    def records(self, profile: str, environment: Mapping[str, object],
                extra: Mapping[str, object]) -> list[dict[str, object]]:
        """One ``kind="benchmark"`` record per subject (implementation or kernel provider)."""
        from kvcheck.conformance import SUITE_VERSION
        from kvcheck.results.schema import make_benchmark_record, make_metric

        self.finalize()
        by_subject: dict[str, list[BenchResult]] = {}
        for r in self.results:
            by_subject.setdefault(r.subject, []).append(r)
        records = []
        for subject, results in by_subject.items():
            impl = next((r.implementation for r in results if r.implementation is not None),
                        None)
            block: ImplHandle | dict[str, object] = impl if impl is not None else {
                "name": subject, "version": results[0].subject_version}
            metrics: list[dict[str, object]] = []
            for r in results:
                case = f"{r.group}/{r.case}"
                metrics.extend(make_metric(
                    m.name, m.unit, m.direction, m.samples, m.value, case=case,
                    stat=m.stat, extra={
                        "reference_value": m.reference_value,
                        "ratio_to_reference": m.ratio_to_reference,
                        "baseline": r.baseline, "noisy": summarize(m.samples).is_noisy,
                        "device": r.device, **_paired_extra(m)}) for m in r.metrics)
            benchmarks = [{"nodeid": r.nodeid, "group": r.group, "case": r.case,
                           "device": r.device, "info": r.info} for r in results]
            records.append(make_benchmark_record(
                block, metrics, profile=profile, suite_version=SUITE_VERSION,
                environment=environment,
                seed=self.options.seed, extra={**extra, "benchmarks": benchmarks}))
        return records


def _manager_level(bench: Bench, impl: ImplHandle, reference: ImplHandle, rounds: int,
                   warmup: int) -> tuple[list[Metric], dict[str, object]]:
    """Scheduler benchmarks also get the manager-level figures (``manager_<name>``, paired with
    the reference's own hook: ``kvcheck.bench.replay.native``) when both sides have the hook, and a
    note saying why not otherwise. Other groups, and hybrid (multi-group) scenarios, which the
    hook does not cover: nothing."""
    from kvcheck.bench.measure.allocator import SchedulerBench

    if not isinstance(bench, SchedulerBench) or not bench.native_level:
        return [], {}
    from kvcheck.bench.replay.native import manager_level_metrics

    return manager_level_metrics(impl, reference, bench.workload, rounds, warmup)


def _paired_extra(metric: Metric) -> dict[str, object]:
    """The interleaved reference's samples and the paired ratio's interval, when measured."""
    out: dict[str, object] = {}
    if metric.reference_samples is not None:
        out["reference_samples"] = list(metric.reference_samples)
    if metric.paired is not None:
        out.update(metric.paired.as_extra())
    return out


def extra_info(result: BenchResult) -> dict[str, object]:
    """``benchmark.extra_info`` of a result: the figures with units and ratios, and the info."""
    out: dict[str, object] = {"kvcheck_group": result.group, "kvcheck_case": result.case,
                           "kvcheck_subject": result.subject, "device": result.device,
                           "baseline": result.baseline}
    for m in result.metrics:
        out[m.name] = m.value
        out[f"{m.name}_unit"] = m.unit
        out[f"{m.name}_ratio_to_reference"] = m.ratio_to_reference
        if m.paired is not None:
            out[f"{m.name}_ratio_ci"] = [m.paired.ci_low, m.paired.ci_high]
    out.update({k: v for k, v in result.info.items() if k not in out})
    return out
