"""The terminal tables of a benchmark session (plain text through ``rich``, one per group).

Ratios read "implementation / reference" for the allocator (the same unit, same direction as
the figure: above 1 is better for a throughput, worse for a latency) and "speedup" (reference
time / time, above 1 is faster) for kernels: ``speedup/ref`` against the torch reference,
``vs triton`` against kvcheck's Triton kernel. ``% peak`` is of the theoretical DRAM
bandwidth, ``% copy`` of the copy bandwidth measured before the first kernel benchmark. A
trailing ``~`` marks a figure whose per-round coefficient of variation exceeds 5 % (noisy).
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from typing import TYPE_CHECKING

from kvcheck.bench.measure.metrics import Metric, summarize
from kvcheck.bench.session import BenchResult

if TYPE_CHECKING:
    from kvcheck.bench.measure.machine import DeviceInfo

__all__ = ["fmt_number", "render_tables"]


def fmt_number(value: float | None, digits: int = 3) -> str:
    """Compact human number: ``1234567 -> '1.23M'``, ``45600 -> '45.6k'``, ``0.8123 ->
    '0.812'``, ``None -> '-'``."""
    if value is None:
        return "-"
    magnitude = abs(value)
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if magnitude >= limit:
            return f"{value / limit:.{digits}g}{suffix}"
    if magnitude >= 100:
        return f"{value:.0f}"
    return f"{value:.{digits}g}"


def _cell(metric: Metric | None) -> str:
    if metric is None:
        return "-"
    noisy = len(metric.samples) > 1 and summarize(metric.samples).is_noisy
    return fmt_number(metric.value) + ("~" if noisy else "")


def _ratio(metric: Metric | None) -> str:
    r = None if metric is None else metric.ratio_to_reference
    return "-" if r is None else f"{r:.2f}x"


def _ratio_ci(metric: Metric | None) -> str:
    """The ratio with its interval when it was measured in interleaved pairs."""
    if metric is None or metric.paired is None:
        return _ratio(metric)
    p = metric.paired
    return f"{p.ratio:.2f}x [{p.ci_low:.2f}-{p.ci_high:.2f}]"


def _produced(result: BenchResult) -> str:
    """One line: what a scheduler scenario's trace and replay actually produced."""
    p = result.info.get("produced") or {}
    if not p:
        return ""
    line = (f"  {result.case}: prompt tokens p10/p50/p90/max "
            f"{p['prompt_tokens_p10']:.0f}/{p['prompt_tokens_p50']:.0f}/"
            f"{p['prompt_tokens_p90']:.0f}/{p['prompt_tokens_max']:.0f}, shared prefix "
            f"{p['shared_prefix_fraction']:.1%}"
            + (f", hit rate {p['prefix_hit_rate']:.1%}, preemptions {p['preemptions']:.0f}"
               if "prefix_hit_rate" in p else ""))
    if "window_freed_blocks" in p:  # a hybrid scenario (kvcheck.bench.workload.hybrid): per group
        names = "/".join(result.info.get("kv_cache_groups") or [])
        line += (f"; per group ({names}): window-freed "
                 + "/".join(f"{n:.0f}" for n in p["window_freed_blocks"])
                 + ", null share " + "/".join(f"{f:.0%}" for f in p["null_fraction"]))
    return line


def _speedup(result: BenchResult) -> str:
    m = result.metric("time_us")
    r = None if m is None else m.ratio_to_reference
    return "-" if not r else f"{1 / r:.2f}x"


def _table(title: str, columns: list[tuple[str, str]], rows: Iterable[list[str]]) -> list[str]:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title)
    for name, justify in columns:
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))  # Text: "[sha256]" is not markup
    buf = io.StringIO()
    # Wide enough for every column of the scheduler table (13) without cutting names.
    Console(file=buf, width=200, force_terminal=False, color_system=None).print(table)
    return buf.getvalue().rstrip("\n").splitlines()


def render_tables(results: list[BenchResult], device: DeviceInfo | None = None) -> list[str]:
    """Every group's table as text lines (groups without results are left out)."""
    lines: list[str] = []
    sched = [r for r in results if r.group == "scheduler"]
    if sched:
        cols = [("implementation", "left"), ("scenario", "left"), ("tokens/s", "right"),
                ("x ref", "right"), ("mgr x ref", "right"), ("alloc calls/s", "right"),
                ("x ref", "right"), ("us/call p50", "right"), ("p99", "right"),
                ("x ref p99", "right"),
                ("prefix hit", "right"), ("peak usage", "right"), ("preempt", "right")]
        rows = []
        for r in sched:
            m = r.metric
            rows.append([r.subject, r.case, _cell(m("scheduled_tokens_per_s")),
                         _ratio_ci(m("scheduled_tokens_per_s")),
                         _ratio(m("manager_scheduled_tokens_per_s")),
                         _cell(m("allocate_slots_calls_per_s")),
                         _ratio(m("allocate_slots_calls_per_s")),
                         _cell(m("allocate_slots_us_p50")), _cell(m("allocate_slots_us_p99")),
                         _ratio(m("allocate_slots_us_p99")), _cell(m("prefix_hit_rate")),
                         _cell(m("peak_usage")), _cell(m("preemptions"))])
        lines += _table("kvcheck bench: scheduler loop through the adapter protocol "
                        "(time inside the implementation's calls)", cols, rows)
        lines.append("x ref: median of the ratios of interleaved rounds (A B B A) "
                     "[their interval]; mgr x ref: the same ratio at manager level (each "
                     "adapter's make_native_manager hook, no protocol marshalling; blank "
                     "without the hook on both sides), see docs/benchmarks.md")
        first = {r.case: r for r in reversed(sched)}  # one line per scenario
        produced = [_produced(first[case]) for case in dict.fromkeys(r.case for r in sched)]
        if any(produced):
            lines.append("what each scenario produced (trace, then the replay):")
            lines += [line for line in produced if line]
    small = [r for r in results
             if r.group in ("hashing", "slot_mapping", "event_wire", "event_decode", "indexer",
                            "offload", "wire")]
    if small:
        cols = [("implementation", "left"), ("benchmark", "left"), ("figure", "left"),
                ("value", "right"), ("unit", "left"), ("x ref", "right")]
        rows = [[r.subject, f"{r.group}[{r.case}]", m.name, _cell(m), m.unit, _ratio_ci(m)]
                for r in small for m in r.metrics]
        lines += _table("kvcheck bench: hashing, slot_mapping, event_wire, event_decode, "
                        "indexer, offload and wire figures", cols, rows)
    kernels = [r for r in results if r.group == "kernels"]
    if kernels:
        cols = [("op", "left"), ("case", "left"), ("provider", "left"), ("device", "left"),
                ("time us", "right"), ("GB/s", "right"), ("% peak", "right"),
                ("% copy", "right"), ("speedup/ref", "right"), ("vs triton", "right")]
        rows = []
        for r in kernels:
            vs = r.info.get("speedup_vs_kvcheck_triton")
            op, _, case = r.case.partition("/")
            rows.append([op, case, r.subject, r.device,
                         _cell(r.metric("time_us")), _cell(r.metric("gbps")),
                         _cell(r.metric("pct_theoretical_peak")),
                         _cell(r.metric("pct_copy_peak")), _speedup(r),
                         "-" if vs is None else f"{vs:.2f}x"])
        lines += _table("kvcheck bench: kernels (CUDA events, compulsory-bytes model)"
                        if kernels[0].device == "cuda" else
                        "kvcheck bench: kernels on the CPU (torch references, host-timed)",
                        cols, rows)
        if device:
            peak = device.get("theoretical_gbps")
            labels = sorted({f"{r.subject} = {r.info['provider_label']}" for r in kernels
                             if "provider_label" in r.info})
            if labels:
                lines.append("providers: " + "; ".join(labels))
            lines.append(
                f"kernel device: {device.get('device')} {device.get('name')}; L2 "
                f"{device.get('l2_mode')} (flush {fmt_number(device.get('flush_bytes'))}B); "
                f"theoretical peak {fmt_number(peak)} GB/s ({device.get('theoretical_source')})"
                f"; measured copy peak {fmt_number(device.get('copy_gbps'))} GB/s")
    return lines
