"""Pair result records across two runs and describe what changed.

Records are grouped by (implementation name, kind, profile, hardware key); records of one group
are merged in timestamp order (later outcomes and metrics win). A current group is compared
only with the baseline group of the same implementation, kind and profile measured on the
same hardware key; a different key means "no baseline", never a comparison. The gate pairs
conformance groups across hardware keys (``outcomes_across_hardware``): test outcomes do not
depend on the machine, only timings do, so such a pair compares outcomes and never metrics
(``Pair.metrics_comparable``); a baseline on the same key is preferred.

Test ids are compared by file name and test name (``conformance/test_x.py::t[impl]`` and
``../site-packages/kvcheck/conformance/test_x.py::t[impl]`` are the same test), so records
written from different working directories still line up.
"""

from __future__ import annotations

import io
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, TYPE_CHECKING

from kvcheck.results.environment import software_versions
from kvcheck.results.schema import (
    Record,
    RecordCompleteness,
    RecordCoverage,
    RecordEnvironment,
    RecordImplementation,
    RecordMetric,
    load_records,
    metric_key,
    parse_timestamp,
)
from kvcheck.results.stats import mann_whitney_u, min_p_value

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "Group",
    "MetricChange",
    "OutcomeChange",
    "Pair",
    "diff_metrics",
    "diff_outcomes",
    "format_p",
    "format_value",
    "glob_match",
    "group_records",
    "load_files",
    "normalize_test_id",
    "pair_groups",
    "render_compare",
    "software_differences",
]

GroupKey = tuple[str, str, str, str]  # (implementation, kind, profile, hardware_key)


def glob_match(pattern: str, text: str) -> bool:
    """Whole-string match where only ``*`` is special (test ids contain ``[``)."""
    return re.fullmatch(".*".join(map(re.escape, pattern.split("*"))), text) is not None


def normalize_test_id(nodeid: str) -> str:
    """``a/b/test_x.py::test_y[p]`` -> ``test_x.py::test_y[p]`` (folders dropped)."""
    path, sep, rest = nodeid.partition("::")
    return path.replace("\\", "/").rsplit("/", 1)[-1] + sep + rest


def load_files(paths: Sequence[str | Path]) -> list[tuple[str, Record]]:
    """(``file:line``-free source name, record) for every record of every file.

    Raises:
        RecordError: from ``load_records``, naming the file, line and field.
    """
    out = []
    for path in paths:
        out += [(str(path), r) for r in load_records(path)]
    return out


@dataclass
class Group:
    """Merged records of one (implementation, kind, profile, hardware key)."""

    implementation: RecordImplementation
    kind: str
    profile: str
    hardware_key: str
    environment: RecordEnvironment
    timestamp: str
    suite_version: str
    sources: list[str] = field(default_factory=list)
    outcomes: dict[str, str] = field(default_factory=dict)      # normalized test id -> outcome
    areas: dict[str, dict[str, int]] = field(default_factory=dict)
    metrics: dict[str, RecordMetric] = field(default_factory=dict)  # metric_key -> metric
    conforms: bool | None = None
    verdict: str | None = None
    complete: bool | None = None                 # conformance: the latest record's
    completeness: RecordCompleteness | None = None  # None: unknown (a schema-1 record)
    schema_version: int | None = None            # of the latest record
    coverage: RecordCoverage | None = None    # the latest record's (None: not recorded)

    @property
    def legacy(self) -> bool:
        """A conformance group whose latest record predates completeness (schema 1)."""
        return self.kind == "conformance" and self.completeness is None

    @property
    def incomplete(self) -> bool:
        return self.kind == "conformance" and self.complete is False

    @property
    def short_families(self) -> list[str]:
        """The law families the latest record's coverage found short of its minimum
        (``insufficient coverage``); empty when none, or not recorded."""
        short = (self.coverage.get("short") if self.coverage else None) or []
        return [str(f) for f in short]

    def completeness_text(self) -> str:
        """``"ran 140 of 152 applicable tests (deselected with -k)"``; ``""`` if unknown."""
        info = self.completeness
        if not info:
            return ""
        applicable = "?" if info.get("applicable") is None else info["applicable"]
        text = f"ran {info['ran']} of {applicable} applicable tests"
        reasons = "; ".join(info.get("reasons") or [])
        return f"{text} ({reasons})" if reasons else text

    @property
    def name(self) -> str:
        return str(self.implementation["name"])

    @property
    def key(self) -> GroupKey:
        return (self.name, self.kind, self.profile, self.hardware_key)

    @property
    def label(self) -> str:
        return f"{self.name} ({self.kind}, {self.profile})"


def group_records(records: Iterable[tuple[str, Record]]) -> dict[GroupKey, Group]:
    """Group and merge records (see the module docstring); input order breaks timestamp ties."""
    ordered = sorted(enumerate(records),
                     key=lambda item: (parse_timestamp(item[1][1]["timestamp"]), item[0]))
    groups: dict[GroupKey, Group] = {}
    for _, (source, rec) in ordered:
        key = (rec["implementation"]["name"], rec["kind"], rec["profile"],
               rec["environment"]["hardware_key"])
        group = groups.get(key)
        if group is None:
            group = groups[key] = Group(rec["implementation"], rec["kind"], rec["profile"],
                                        key[3], rec["environment"], rec["timestamp"],
                                        rec["suite_version"])
        group.implementation = rec["implementation"]
        group.environment = rec["environment"]
        group.timestamp = rec["timestamp"]
        group.suite_version = rec["suite_version"]
        group.schema_version = rec["schema_version"]
        if source not in group.sources:
            group.sources.append(source)
        for test_id, outcome in rec.get("outcomes", {}).items():
            group.outcomes[normalize_test_id(test_id)] = outcome
        if rec["kind"] == "conformance":
            group.areas = rec["areas"]
            group.conforms = rec["conforms"]
            group.verdict = rec["verdict"]
            group.complete = rec.get("complete", True)
            group.completeness = rec.get("completeness")
            group.coverage = rec.get("coverage")
        for metric in rec.get("metrics") or []:
            group.metrics[metric_key(metric)] = metric
    return groups


@dataclass
class Pair:
    """A current group and its baseline (None: nothing comparable, ``note`` says why).

    ``metrics_comparable``: false for a conformance pair across hardware keys, whose test
    outcomes are compared but whose metrics (timings) are not; ``note`` then says so."""

    current: Group
    baseline: Group | None
    note: str | None = None
    metrics_comparable: bool = True


def _other_hardware(candidates: list[Group]) -> Group:
    """The baseline of a conformance pair across hardware keys: the latest record, then the
    first hardware key in sort order (a stable choice whatever the file order)."""
    by_key = sorted(candidates, key=lambda b: b.hardware_key)
    oldest = datetime.min.replace(tzinfo=timezone.utc)  # (loaded timestamps always parse)
    return max(by_key, key=lambda b: parse_timestamp(b.timestamp) or oldest)  # first of ties


def pair_groups(baseline: dict[GroupKey, Group], current: dict[GroupKey, Group],
                pair_singletons: bool = False,
                outcomes_across_hardware: bool = False) -> list[Pair]:
    """One ``Pair`` per current group, in a stable order.

    ``pair_singletons``: when a side holds exactly one group of a kind and nothing pairs by
    name, compare those two anyway (``kvcheck compare ref.jsonl mine.jsonl``).
    ``outcomes_across_hardware`` (the gate): a conformance group without a baseline on its
    own hardware key pairs with one of the same implementation and profile on another key
    (see ``_other_hardware``), with ``metrics_comparable`` false.
    """
    pairs = []
    for key in sorted(current):
        group = current[key]
        match = baseline.get(key)
        if match is not None:
            pairs.append(Pair(group, match))
            continue
        others = [b for b in baseline.values() if b.key[:3] == key[:3]]
        if outcomes_across_hardware and group.kind == "conformance" and others:
            chosen = _other_hardware(others)
            note = (f"{group.label} on hardware {group.hardware_key!r}: test outcomes "
                    f"compared with the baseline measured on {chosen.hardware_key!r} (outcomes "
                    "do not depend on hardware)")
            if group.metrics or chosen.metrics:
                note += "; its metrics were not compared (timings do)"
            pairs.append(Pair(group, chosen, note, metrics_comparable=False))
            continue
        elsewhere = sorted(b.hardware_key for b in others)
        if elsewhere:
            note = (f"no baseline for {group.label} on hardware {group.hardware_key!r}: the "
                    f"baseline was measured on {', '.join(map(repr, elsewhere))}")
        else:
            note = f"no baseline for {group.label}: the baseline has no such records"
        pairs.append(Pair(group, None, note))
    if pair_singletons:
        for kind in ("conformance", "benchmark"):
            cur = [p for p in pairs if p.current.kind == kind]
            base = [b for b in baseline.values() if b.kind == kind]
            if len(cur) == 1 and len(base) == 1 and cur[0].baseline is None:
                b, c = base[0], cur[0].current
                cur[0].baseline = b
                cur[0].note = None if b.hardware_key == c.hardware_key else (
                    f"{b.label} was measured on {b.hardware_key!r}, {c.label} on "
                    f"{c.hardware_key!r}: differences may be the hardware's")
    return pairs


def software_differences(baseline: Group, current: Group) -> list[str]:
    """``"torch 2.12.0 -> 2.13.0"`` for each driver/cuda/torch/triton/python that differs."""
    before = software_versions(baseline.environment)
    after = software_versions(current.environment)
    return [f"{name} {before[name] or '-'} -> {after[name] or '-'}"
            for name in before if before[name] != after[name]]


@dataclass
class OutcomeChange:
    """A conformance test whose outcome differs (``None``: not in that run)."""

    test_id: str
    before: str | None
    after: str | None

    @property
    def is_new_failure(self) -> bool:
        """Passed in the baseline, failed (or errored) now: what a gate fails on."""
        return self.before in ("passed", "xpassed") and self.after in ("failed", "error")

    @property
    def is_missing(self) -> bool:
        """Passed in the baseline, absent from the current record."""
        return self.before in ("passed", "xpassed") and self.after is None


def diff_outcomes(baseline: Group, current: Group) -> list[OutcomeChange]:
    """Every test whose outcome differs, new and vanished tests included, sorted by id."""
    ids = sorted(set(baseline.outcomes) | set(current.outcomes))
    return [OutcomeChange(t, baseline.outcomes.get(t), current.outcomes.get(t)) for t in ids
            if baseline.outcomes.get(t) != current.outcomes.get(t)]


@dataclass
class MetricChange:
    """One metric in both runs (or in one: the other is None).

    ``worse_by``: how much worse the current value is, in the metric's unit (negative:
    better), whatever the direction; ``worse_pct``: the same relative to the baseline value
    (None when the baseline value is 0). ``p``: one-sided Mann-Whitney p-value of a change in
    the observed direction (None without samples on both sides); ``p_floor``: the smallest
    p-value these sample sizes allow.
    """

    key: str
    baseline: RecordMetric | None
    current: RecordMetric | None
    worse_by: float | None = None
    worse_pct: float | None = None
    p: float | None = None
    p_method: str | None = None
    p_floor: float | None = None

    @property
    def metric(self) -> RecordMetric:
        return self.current or self.baseline  # type: ignore[return-value]

    @property
    def unit(self) -> str:
        return str(self.metric["unit"])

    @property
    def n_samples(self) -> tuple[int, int]:
        return (len((self.baseline.get("samples") if self.baseline else None) or []),
                len((self.current.get("samples") if self.current else None) or []))


def _compare_metric(key: str, base: RecordMetric, cur: RecordMetric) -> MetricChange:
    change = MetricChange(key, base, cur)
    sign = 1.0 if cur["direction"] == "lower_is_better" else -1.0
    change.worse_by = sign * (cur["value"] - base["value"])
    if base["value"] != 0:
        change.worse_pct = 100.0 * change.worse_by / abs(base["value"])
    xs, ys = cur.get("samples") or [], base.get("samples") or []
    if xs and ys:
        worse_means_greater = (change.worse_by >= 0) == (sign > 0)
        result = mann_whitney_u(xs, ys, "greater" if worse_means_greater else "less")
        change.p, change.p_method = result.p, result.method
        change.p_floor = min_p_value(len(xs), len(ys))
    return change


def diff_metrics(baseline: Group, current: Group) -> list[MetricChange]:
    """Every metric of either run, in the current run's order then vanished ones.

    A metric whose unit or direction changed is reported as vanished plus new (its values
    cannot be compared).
    """
    out = []
    for key, cur in current.metrics.items():
        base = baseline.metrics.get(key)
        if base is not None and (base["unit"], base["direction"]) == (cur["unit"],
                                                                      cur["direction"]):
            out.append(_compare_metric(key, base, cur))
        else:
            if base is not None:
                out.append(MetricChange(key, base, None))
            out.append(MetricChange(key, None, cur))
    out += [MetricChange(k, m, None) for k, m in baseline.metrics.items()
            if k not in current.metrics]
    return out


def format_value(value: float | None, unit: str = "") -> str:
    """Four significant digits plus the unit; ``-`` for None."""
    if value is None:
        return "-"
    text = f"{value:.4g}"
    return f"{text} {unit}".rstrip()


def format_p(change: MetricChange) -> str:
    if change.p is None:
        return "no samples" if change.baseline and change.current else "-"
    return f"{change.p:.2g}" if change.p >= 1e-4 else "<1e-4"


def console(file: IO[str] | None = None) -> Console:
    """A rich Console for tables: 160 columns when not writing to a terminal (CI logs)."""
    from rich.console import Console

    file = file or sys.stdout
    is_tty = hasattr(file, "isatty") and file.isatty()
    return Console(file=file, width=None if is_tty else 160, soft_wrap=False,
                   color_system="auto" if is_tty else None, highlight=False)


def render_compare(pairs: list[Pair]) -> str:
    """The ``kvcheck compare`` report as plain text (rich tables, no colour)."""
    from rich.table import Table

    buf = io.StringIO()
    out = console(buf)
    for pair in pairs:
        cur, base = pair.current, pair.baseline
        if base is None:
            out.print(_esc(f"{cur.label}: {pair.note}"), soft_wrap=True)
            continue
        out.print("[bold]" + _esc(f"{base.label} [{base.hardware_key}] -> {cur.label} "
                                  f"[{cur.hardware_key}]") + "[/bold]", soft_wrap=True)
        if pair.note:
            out.print(f"  warning: {_esc(pair.note)}")
        for diff in software_differences(base, cur):
            out.print(f"  software differs: {_esc(diff)}")
        if cur.kind == "conformance":
            for side, group in (("before", base), ("after", cur)):
                if group.incomplete:
                    out.print(f"  {side}: incomplete record, {_esc(group.completeness_text())}",
                              soft_wrap=True)
                elif group.legacy:
                    out.print(f"  {side}: legacy record (schema 1), completeness unknown",
                              soft_wrap=True)
            if base.verdict != cur.verdict:
                out.print(f"  verdict: {_esc(base.verdict or '-')}\n        -> "
                          f"{_esc(cur.verdict or '-')}")
            changes = diff_outcomes(base, cur)
            if changes:
                table = Table("test", "before", "after", title="conformance outcomes that differ")
                for c in changes:
                    table.add_row(_esc(c.test_id), _esc(c.before or "(absent)"),
                              _esc(c.after or "(absent)"))
                out.print(table)
            else:
                out.print(f"  all {len(cur.outcomes)} test outcomes identical")
        metric_changes = diff_metrics(base, cur)
        if metric_changes:
            table = Table("metric", "baseline", "current", "change", "p (one-sided)", "n",
                          title="metrics (change: + is worse, in the metric's direction)")
            for m in metric_changes:
                pct = "-" if m.worse_pct is None else f"{m.worse_pct:+.1f}%"
                n = "/".join(map(str, m.n_samples))
                table.add_row(_esc(m.key),
                              format_value(m.baseline.get("value") if m.baseline else None,
                                           m.unit),
                              format_value(m.current.get("value") if m.current else None,
                                           m.unit),
                              pct, format_p(m), n)
            out.print(table)
    return buf.getvalue()


def _esc(text: str) -> str:
    """Record text for a rich console: hidden characters made visible, markup escaped."""
    from rich.markup import escape

    from kvcheck.results.text import visible

    return str(escape(visible(text)))
