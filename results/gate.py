"""The regression gate: decide whether a current run regressed against a baseline.

A run fails the gate (exit 1) when

* a current conformance record does not conform: a test failed or errored (whether or not it
  failed in the baseline too), or the record says ``conforms: false`` although complete; with
  or without a baseline, unless a ``--waivers`` line matches every failing test, or
* a conformance test that passed in the baseline fails or errors now, or
* a conformance test that passed in the baseline is absent from the current record
  ("missing"; accepted by ``--allow-missing`` or a waiver naming it), or
* a current conformance record is incomplete (``complete: false``: not every applicable suite
  test ran; accepted by ``--allow-incomplete``), whether or not it has a baseline, or
* a metric got worse by more than its threshold (``--threshold SEL:5%``, or an absolute
  ``SEL:0.3`` in the metric's unit) AND the change is significant on the raw samples
  (one-sided Mann-Whitney U, ``p < alpha``) AND it exceeds the metric's absolute floor
  (``--floor SEL:0.5``, in the metric's unit; default 0), or
* nothing was compared: no current record had a comparable baseline (a current conformance
  record judged on its own verdict compares nothing); ``--allow-empty`` accepts this, with a
  warning.

Pairing: records pair by implementation, kind and profile. Conformance records pair whatever
their hardware keys (test outcomes do not depend on the machine), preferring a baseline on
the current record's own key; the key decides only which metrics are comparable, so a
conformance pair across keys compares outcomes, never metrics. Benchmark records pair only on
one hardware key. A baseline of another record kind than the current one is a usage error
(exit 2, ``kvcheck.results.gate_kinds``).

Deterministic metrics (``deterministic: true``: instruction counts, see
``kvcheck.bench.counted``) do not depend on the machine's load, so they get no significance
test: a count that grew by more than its threshold fails, the default being 1%
(``DEFAULT_DETERMINISTIC_THRESHOLD``), and the failure line names the case (scenario) whose
count moved, by how much in percent and in instructions. A threshold without a selector
(``--threshold 5%``) is for timings and leaves counts at 1%; one whose selector names them
(``--threshold instructions:0.5%``, by unit, name or key) applies to them. In a record whose
hardware key names a counting method (``"callgrind:x86_64"``), the wall-time metrics beside
the counts may come from another machine of that architecture, so they are shown
(``--verbose``) but never gated.

Exact metrics (recorded without samples, or without spread in either run: counts, hit rates)
need no test, so threshold and floor decide. A noisy metric with too few samples for any
p-value below alpha (3 against 3 cannot go below 0.05) cannot be significant: it is reported
as "untestable" with a warning, never failed, so short benchmark runs do not make CI flaky.
A waiver file (``metric-or-test-id  # reason`` per line) turns matching regressions into
"waived". Benchmark records measured on a different hardware key are "no baseline": a
warning, and the gate fails only if nothing at all was compared. A schema-1 (legacy) current
record says nothing about completeness: it is treated as complete, with a warning.

Selectors (``SEL``) are matched against a metric's key (``case/name``), its name, its stat
and its unit; ``*`` is a wildcard. The most specific match wins: key, then name, then a
wildcard pattern, then stat or unit, then the default (no selector); among equals the last
given wins.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from kvcheck.results.compare import (
    Group,
    MetricChange,
    OutcomeChange,
    Pair,
    console,
    diff_metrics,
    diff_outcomes,
    format_p,
    format_value,
    glob_match,
    group_records,
    pair_groups,
    software_differences,
)
from kvcheck.results.errors import GateInputError
from kvcheck.results.gate_kinds import KindMismatchError, check_kinds
from kvcheck.results.schema import Record, RecordMetric, counting_method, is_deterministic
from kvcheck.results.text import visible

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_DETERMINISTIC_THRESHOLD",
    "DEFAULT_THRESHOLD",
    "Decision",
    "GateConfig",
    "GateInputError",
    "GateResult",
    "KindMismatchError",
    "Rule",
    "Waiver",
    "load_thresholds_file",
    "load_waivers",
    "parse_rule",
    "render_gate",
    "render_gate_markdown",
    "run_gate",
]

DEFAULT_THRESHOLD = 5.0  # percent
DEFAULT_ALPHA = 0.01
DEFAULT_DETERMINISTIC_THRESHOLD = 1.0  # percent, for deterministic counts


@dataclass(frozen=True)
class Rule:
    """A threshold or floor: ``selector`` (None: every metric), ``value``, ``percent``."""

    selector: str | None
    value: float
    percent: bool = False

    @property
    def check_name(self) -> str:
        return "PercentageRegressionCheck" if self.percent else "DifferenceRegressionCheck"

    def __str__(self) -> str:
        return f"{self.value:g}{'%' if self.percent else ''}"


_NUMBER_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(%?)\s*$")


def parse_rule(text: str, what: str = "--threshold", allow_percent: bool = True) -> Rule:
    """``"mean:5%"`` / ``"decode*/latency:0.3"`` / ``"5%"`` -> ``Rule``.

    Raises:
        GateInputError: naming ``what`` and the text.
    """
    selector, sep, number = text.rpartition(":")
    match = _NUMBER_RE.match(number)
    if not match or (sep and not selector.strip()):
        form = "[SELECTOR:]N[%]" if allow_percent else "[SELECTOR:]N"
        raise GateInputError(f"{what} {text!r}: expected {form}, e.g. "
                             f"{'mean:5%' if allow_percent else 'us_per_call:0.5'}")
    value, percent = float(match.group(1)), bool(match.group(2))
    if percent and not allow_percent:
        raise GateInputError(f"{what} {text!r}: a floor is absolute, in the metric's unit "
                             "(no %)")
    if not math.isfinite(value):
        raise GateInputError(f"{what} {text!r}: the value must be finite")
    return Rule(selector.strip() or None, value, percent)


def _rank(selector: str | None, key: str, metric: RecordMetric) -> int | None:
    """Specificity of a selector for a metric (higher wins), None if it does not match."""
    if selector is None:
        return 0
    if selector == key:
        return 4
    if selector == metric["name"]:
        return 3
    if "*" in selector and (glob_match(selector, key) or glob_match(selector, metric["name"])):
        return 2
    if selector in (metric.get("stat"), metric["unit"]):
        return 1
    return None


def _resolve(rules: Sequence[Rule], key: str, metric: RecordMetric) -> Rule | None:
    best: tuple[int, int] | None = None
    chosen = None
    for i, rule in enumerate(rules):
        rank = _rank(rule.selector, key, metric)
        if rank is not None and (best is None or (rank, i) > best):
            best, chosen = (rank, i), rule
    return chosen


@dataclass
class Waiver:
    """One waiver-file line: a test id or metric key (``*`` wildcard) and the reason."""

    pattern: str
    reason: str
    source: str
    used: bool = False

    def matches(self, item: str) -> bool:
        return self.pattern == item or ("*" in self.pattern and glob_match(self.pattern, item))


def _lines(path: str | Path, what: str) -> list[tuple[str, str, str]]:
    """(source ``file:line``, content, comment) of each non-blank line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise GateInputError(f"{what} {path}: cannot read ({reason})") from None
    out = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        content, _, comment = raw.partition("#")
        if content.strip():
            out.append((f"{path}:{lineno}", content.strip(), comment.strip()))
    return out


def load_waivers(path: str | Path) -> list[Waiver]:
    """Waiver file: ``test-id-or-metric-key  # reason`` per line (the reason is required)."""
    waivers = []
    for source, content, comment in _lines(path, "--waivers"):
        if not comment:
            raise GateInputError(f"{source}: waiver {content!r} has no reason; write it as "
                                 f"'{content}  # why this regression is accepted'")
        waivers.append(Waiver(content, comment, source))
    return waivers


def load_thresholds_file(path: str | Path) -> tuple[list[Rule], list[Rule]]:
    """Lines ``threshold SEL:N[%]`` or ``floor SEL:N`` (``#`` comments): (thresholds, floors)."""
    thresholds, floors = [], []
    for source, content, _ in _lines(path, "--thresholds-file"):
        word, _, rest = content.partition(" ")
        if word == "threshold":
            thresholds.append(parse_rule(rest.strip(), f"{source}: threshold"))
        elif word == "floor":
            floors.append(parse_rule(rest.strip(), f"{source}: floor", allow_percent=False))
        else:
            raise GateInputError(f"{source}: expected 'threshold SEL:N[%]' or 'floor SEL:N', "
                                 f"got {content!r}")
    return thresholds, floors


@dataclass
class GateConfig:
    """Thresholds (a default of ``DEFAULT_THRESHOLD`` % comes first), floors, alpha, waivers."""

    thresholds: list[Rule] = field(default_factory=list)
    floors: list[Rule] = field(default_factory=list)
    alpha: float = DEFAULT_ALPHA
    waivers: list[Waiver] = field(default_factory=list)
    allow_missing: bool = False     # tests that passed in the baseline may be absent now
    allow_incomplete: bool = False  # a current record of an incomplete run may pass
    allow_empty: bool = False       # a gate that compared nothing may pass

    def threshold_for(self, key: str, metric: RecordMetric) -> Rule:
        """The most specific matching threshold. A deterministic metric starts from
        ``DEFAULT_DETERMINISTIC_THRESHOLD`` and ignores thresholds without a selector (those
        are for timings)."""
        if is_deterministic(metric):
            rules = [Rule(None, DEFAULT_DETERMINISTIC_THRESHOLD, True),
                     *(r for r in self.thresholds if r.selector is not None)]
        else:
            rules = [Rule(None, DEFAULT_THRESHOLD, True), *self.thresholds]
        return _resolve(rules, key, metric)  # type: ignore[return-value]

    def floor_for(self, key: str, metric: RecordMetric) -> float:
        rule = _resolve(self.floors, key, metric)
        return rule.value if rule else 0.0

    def waiver_for(self, item: str) -> Waiver | None:
        for waiver in self.waivers:
            if waiver.matches(item):
                return waiver
        return None


# Statuses; only REGRESSION fails the gate.
REGRESSION = "REGRESSION"
UNTESTABLE = "untestable"  # worse beyond the threshold, but too few samples to tell
NOT_GATED = "not gated"    # wall time in a record of counts (hardware key of a method)
MISSING_ALLOWED = "missing (allowed)"
INCOMPLETE_ALLOWED = "incomplete (allowed)"
RECORD_ITEM = "(whole record)"  # the item of a decision about a record, not a test or metric
SHOWN_MISSING = 5               # missing (or failing) test ids named in a report line
INCOMPLETE, NONCONFORMING = "incomplete", "non-conforming"  # Decision.record
FAILING = ("failed", "error")   # outcomes that prove a record does not conform


@dataclass
class Decision:
    """What the gate concluded about one test or metric of one implementation."""

    implementation: str
    item: str
    status: str
    detail: str = ""
    message: str | None = None       # the failure line, for REGRESSION (and waived ones)
    outcome: OutcomeChange | None = None
    metric: MetricChange | None = None
    threshold: Rule | None = None
    record: str | None = None        # a decision about a whole record: INCOMPLETE/NONCONFORMING

    @property
    def is_missing(self) -> bool:
        """A test that passed in the baseline and is absent from the current record."""
        return self.outcome is not None and self.outcome.is_missing

    @property
    def is_incomplete(self) -> bool:
        """A decision about an incomplete current record."""
        return self.record == INCOMPLETE

    @property
    def is_nonconforming(self) -> bool:
        """A decision about a current record that does not conform (its failing tests)."""
        return self.record == NONCONFORMING


@dataclass
class GateResult:
    """``compared``: pairs that had a baseline. ``failures``: lines about missing tests,
    incomplete and non-conforming records (one per record) and an empty comparison.
    ``empty``: nothing was compared; it fails unless ``allow_empty``. ``judged_alone``:
    labels of current conformance records judged only on their own verdict (no baseline)."""

    decisions: list[Decision]
    warnings: list[str]
    compared: int
    failures: list[str] = field(default_factory=list)
    empty: bool = False
    allow_empty: bool = False
    judged_alone: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> list[Decision]:
        return [d for d in self.decisions if d.status == REGRESSION]

    @property
    def empty_fails(self) -> bool:
        """Nothing was compared and ``--allow-empty`` was not given."""
        return self.empty and not self.allow_empty

    @property
    def exit_code(self) -> int:
        return 1 if self.regressions or self.empty_fails else 0


def _outcome_decision(impl: str, change: OutcomeChange, config: GateConfig) -> Decision:
    before, after = change.before or "absent", change.after or "absent"
    d = Decision(impl, change.test_id, "changed", f"{before} -> {after}", outcome=change)
    if change.is_new_failure:
        d.message = (f"Test {change.test_id!r} of {impl} has failed ConformanceCheck: "
                     f"{before} -> {after}")
        waiver = config.waiver_for(change.test_id)
        if waiver:
            waiver.used = True
            d.status, d.detail = "waived", f"waived: {waiver.reason}"
        else:
            d.status = REGRESSION
    elif change.is_missing:
        waiver = config.waiver_for(change.test_id)
        d.detail = "missing from the current record"
        if waiver:  # a line of its own, like other waived regressions
            waiver.used = True
            d.status, d.detail = "waived", f"missing; waived: {waiver.reason}"
            d.message = (f"Test {change.test_id!r} of {impl} passed in the baseline and is "
                         "missing from the current record")
        elif config.allow_missing:
            d.status = MISSING_ALLOWED
        else:
            d.status = REGRESSION
    elif change.before is None and after in ("failed", "error"):
        d.status = "new test failing"
    elif before in ("failed", "error") and after in ("passed", "xpassed"):
        d.status = "fixed"
    elif before in ("passed", "xpassed"):
        d.status = "no longer passes"  # skipped / xfailed / absent: visible, not failing
    return d


def _metric_decision(impl: str, change: MetricChange, config: GateConfig,
                     method: str | None = None) -> Decision:
    """``method``: the counting method the pair's hardware key names (None: a machine's)."""
    key = change.key
    if change.baseline is None:
        return Decision(impl, key, "new", "no baseline value", metric=change)
    if change.current is None:
        return Decision(impl, key, "missing", "not in the current run", metric=change)
    counted = is_deterministic(change.baseline), is_deterministic(change.current)
    if any(counted):
        if not all(counted):
            return Decision(impl, key, "not comparable",
                            "a count in one run, a sampled figure in the other", metric=change)
        return _count_decision(impl, change, config)
    if method is not None:
        return Decision(impl, key, NOT_GATED, f"wall time in a {method} record: the "
                        "machines may differ; its counts are gated", metric=change)
    threshold = config.threshold_for(key, change.current)
    floor = config.floor_for(key, change.current)
    worse, pct = change.worse_by or 0.0, change.worse_pct

    def beyond(amount: float, relative: float | None) -> bool:
        if threshold.percent:
            return relative > threshold.value if relative is not None else amount > 0
        return amount > threshold.value

    d = Decision(impl, key, "ok", metric=change, threshold=threshold)
    exact, evidence = _evidence(change, config.alpha)
    significant = exact or (change.p is not None and change.p < config.alpha)
    if beyond(worse, pct):
        if not significant and change.p_floor is not None and change.p_floor >= config.alpha:
            d.status, d.detail = UNTESTABLE, evidence
        elif not significant:
            d.status = "noise"
            d.detail = f"p={change.p:.2g} >= alpha {config.alpha:g}"
        elif worse <= floor:
            d.status = "below floor"
            d.detail = f"{worse:.4g} {change.unit} <= floor {floor:g} {change.unit}"
        else:
            amount = pct if threshold.percent else worse
            shown = "inf" if amount is None else f"{amount:.1f}" if threshold.percent else (
                f"{amount:.4g}")
            limit = f"{threshold.value:.1f}" if threshold.percent else f"{threshold.value:g}"
            d.message = (f"Metric {key!r} of {impl} has failed {threshold.check_name}: "
                         f"{shown} > {limit}")
            bits = [(f"{format_value(change.baseline['value'], change.unit)} -> "
                     f"{format_value(change.current['value'], change.unit)}"), evidence]
            if floor:
                bits.append(f"{worse:.4g} {change.unit} > floor {floor:g} {change.unit}")
            d.message += f" ({'; '.join(bits)})"
            waiver = config.waiver_for(key)
            if waiver:
                waiver.used = True
                d.status, d.detail = "waived", f"waived: {waiver.reason}"
            else:
                d.status, d.detail = REGRESSION, "" if change.p is not None and not exact else (
                    evidence)
    elif beyond(-worse, None if pct is None else -pct) and significant:
        d.status = "improved"
    return d


def _count_decision(impl: str, change: MetricChange, config: GateConfig) -> Decision:
    """A deterministic count: threshold and floor decide, no significance test."""
    assert change.baseline is not None and change.current is not None
    key = change.key
    threshold = config.threshold_for(key, change.current)
    floor = config.floor_for(key, change.current)
    worse, pct = change.worse_by or 0.0, change.worse_pct
    before, after = change.baseline["value"], change.current["value"]
    moved = (f"{'-' if pct is None else f'{pct:+.2f}%'} ({before:,.0f} -> {after:,.0f} "
             f"{change.unit}, {after - before:+,.0f})")
    d = Decision(impl, key, "ok", moved, metric=change, threshold=threshold)

    def beyond(amount: float, relative: float | None) -> bool:
        if threshold.percent:
            return relative > threshold.value if relative is not None else amount > 0
        return amount > threshold.value

    if beyond(worse, pct) and worse > floor:
        limit = f"{threshold.value:g}{'%' if threshold.percent else ' ' + change.unit}"
        d.message = (f"Count {key!r} of {impl} has failed DeterministicRegressionCheck: it "
                     f"moved {moved}, beyond the {limit} threshold (a deterministic count: "
                     "no significance test)")
        waiver = config.waiver_for(key)
        if waiver:
            waiver.used = True
            d.status, d.detail = "waived", f"waived: {waiver.reason}"
        else:
            d.status = REGRESSION
    elif beyond(worse, pct):
        d.status, d.detail = "below floor", f"{moved}; {worse:.4g} {change.unit} <= floor {floor:g}"
    elif beyond(-worse, None if pct is None else -pct):
        d.status = "improved"
    return d


def _no_spread(metric: RecordMetric) -> bool:
    samples = metric.get("samples") or []
    return bool(samples) and min(samples) == max(samples)


def _evidence(change: MetricChange, alpha: float) -> tuple[bool, str]:
    """(exact, a note for messages). Exact measurements (no samples, or no spread on either
    side: counts, hit rates) need no test; otherwise the p-value decides."""
    assert change.baseline is not None and change.current is not None
    if change.p is None:
        return True, "no samples: treated as exact"
    if _no_spread(change.baseline) and _no_spread(change.current):
        return True, "no spread in either run: treated as exact"
    n_base, n_cur = change.n_samples
    if change.p_floor is not None and change.p_floor >= alpha:
        return False, (f"n={n_base}/{n_cur} samples cannot reach p < {alpha:g} (smallest "
                       f"possible p {change.p_floor:.2g})")
    return False, f"p={change.p:.2g} < {alpha:g}"


def run_gate(baseline: Sequence[tuple[str, Mapping[str, object]]],
             current: Sequence[tuple[str, Mapping[str, object]]],
             config: GateConfig) -> GateResult:
    """Compare loaded records (``compare.load_files`` output; the baseline may be empty)
    and decide.

    Raises:
        KindMismatchError: the baseline holds no record of the current records' kind
            (``gate_kinds.check_kinds``): a usage error, exit 2.
    """
    # Validated records by contract (load_files, or the schema builders, which validate):
    # their fields are Record's. Typed as mappings for callers that build them in a dict.
    base_records = cast("Sequence[tuple[str, Record]]", baseline)
    cur_records = cast("Sequence[tuple[str, Record]]", current)
    check_kinds(base_records, cur_records)
    pairs: list[Pair] = pair_groups(group_records(base_records), group_records(cur_records),
                                    outcomes_across_hardware=True)
    decisions: list[Decision] = []
    warnings: list[str] = []
    failures: list[str] = []
    judged_alone: list[str] = []
    compared = 0
    for pair in pairs:
        cur, base = pair.current, pair.baseline
        _judge_completeness(cur, config, decisions, warnings, failures)
        if base is None:
            if baseline:  # without any baseline file, "no baseline" is said once, below
                warnings.append(str(pair.note))
            if cur.kind == "conformance":
                judged_alone.append(cur.label)
            _judge_verdict(cur, config, decisions, failures)
            continue
        compared += 1
        if pair.note:  # a conformance pair across hardware keys: outcomes only
            warnings.append(pair.note)
        warnings.extend(f"{cur.label}: software differs from the baseline: {diff}"
                        for diff in software_differences(base, cur))
        if base.suite_version != cur.suite_version:
            warnings.append(f"{cur.label}: suite version {base.suite_version} -> "
                            f"{cur.suite_version}; re-baseline if timing methods changed")
        outcome_decisions = [_outcome_decision(cur.name, change, config)
                             for change in diff_outcomes(base, cur)]
        decisions += outcome_decisions
        _report_missing(cur, [d for d in outcome_decisions if d.is_missing], config,
                        warnings, failures)
        _judge_verdict(cur, config, decisions, failures)
        if not pair.metrics_comparable:
            continue
        method = counting_method(cur.hardware_key)
        metric_decisions = [_metric_decision(cur.name, metric_change, config, method)
                            for metric_change in diff_metrics(base, cur)]
        decisions += metric_decisions
        not_gated = sum(d.status == NOT_GATED for d in metric_decisions)
        if not_gated:
            warnings.append(f"{cur.label} [{cur.hardware_key}]: {not_gated} wall-time "
                            f"metric(s) beside the {method} counts were not gated (shown with "
                            "--verbose)")
    untestable = [d for d in decisions if d.status == UNTESTABLE]
    if untestable:
        warnings.append(
            f"{len(untestable)} metric(s) got worse beyond their threshold but have too few "
            f"samples to be significant at alpha {config.alpha:g} ({untestable[0].detail}), so "
            "they are not gated: record more rounds (e.g. pytest --kv-bench-rounds=10) or "
            "raise --alpha")
    empty = bool(pairs) and not compared
    if empty:
        line = _nothing_compared(bool(baseline), judged_alone)
        if config.allow_empty:
            warnings.append(f"{line}; accepted by --allow-empty")
        else:
            failures.append(f"N{line[1:]}. Pass the base run's records with --baseline, or "
                            "accept a gate without a baseline with --allow-empty")
    warnings.extend(f"waiver {waiver.pattern!r} ({waiver.source}) matched no regression; "
                    "remove it once it is no longer needed"
                    for waiver in config.waivers if not waiver.used)
    return GateResult(decisions, warnings, compared, failures, empty=empty,
                      allow_empty=config.allow_empty, judged_alone=judged_alone)


def _nothing_compared(had_baseline: bool, judged_alone: list[str]) -> str:
    """The line about an empty comparison: why, and what was checked instead."""
    why = ("no current record has a comparable baseline (same implementation, kind and "
           "profile; for benchmark records also the same hardware key)" if had_baseline else
           "no --baseline was given")
    line = f"nothing was compared: {why}"
    if judged_alone:
        their = "its own verdict was" if len(judged_alone) == 1 else "their own verdicts were"
        line += (f"; {their} checked for {', '.join(judged_alone)}, but without a baseline "
                 "no regression can be seen")
    return line


def _judge_verdict(cur: Group, config: GateConfig, decisions: list[Decision],
                   failures: list[str]) -> None:
    """A current conformance record that does not conform fails, baseline or not: every
    failed or errored test must be matched by a waiver (tests that already failed in the
    baseline included). A complete record that says ``conforms: false`` without a failing
    test (every test skipped, or too few tests per law family: ``insufficient coverage``)
    fails with its verdict: there is no test to waive. An incomplete record without failing
    tests is ``_judge_completeness``'s alone."""
    if cur.kind != "conformance":
        return
    failing = sorted(t for t, outcome in cur.outcomes.items() if outcome in FAILING)
    what = f"The current record of {cur.label} does not conform"
    if not failing:
        if cur.conforms is False and not cur.incomplete and cur.short_families:
            short = ", ".join(cur.short_families)
            decisions.append(Decision(cur.name, RECORD_ITEM, REGRESSION,
                                      f"insufficient coverage: {short}",
                                      record=NONCONFORMING))
            failures.append(f"{what}: its verdict is {cur.verdict!r}. No test failed, so "
                            "there is no test to waive: declare what the verdict names "
                            "(capabilities, block sizes) so that enough of the suite "
                            f"checks {short}, and run it again")
        elif cur.conforms is False and not cur.incomplete:
            decisions.append(Decision(cur.name, RECORD_ITEM, REGRESSION, "does not conform",
                                      record=NONCONFORMING))
            failures.append(f"{what}: its verdict is {cur.verdict!r} although no test failed "
                            "or errored, so there is no test to waive. Fix the run so that "
                            "its tests check something (see the verdict)")
        return
    unwaived = []
    for test_id in failing:
        waiver = config.waiver_for(test_id)
        if waiver:
            waiver.used = True
        else:
            unwaived.append(test_id)
    n, left = len(failing), len(unwaived)
    tests = f"{n} test{'s' * (n != 1)} failed or errored"
    if not unwaived:
        decisions.append(Decision(cur.name, RECORD_ITEM, "waived",
                                  f"waived: each of its {n} failing test{'s' * (n != 1)} "
                                  "matched a --waivers line", message=f"{what}: {tests}",
                                  record=NONCONFORMING))
        return
    shown = ", ".join(map(repr, unwaived[:SHOWN_MISSING]))
    if left > SHOWN_MISSING:
        shown += f" and {left - SHOWN_MISSING} more"
    count = f"{tests}, {left} not waived" if left != n else tests
    decisions.append(Decision(cur.name, RECORD_ITEM, REGRESSION,
                              f"does not conform: {count}", record=NONCONFORMING))
    failures.append(f"{what}: {count}: {shown}. Fix {'them' if left != 1 else 'it'}, or "
                    "accept each with a --waivers line naming its test id (a test that "
                    "failed in the baseline too needs one)")


def _judge_completeness(cur: Group, config: GateConfig, decisions: list[Decision],
                        warnings: list[str], failures: list[str]) -> None:
    """An incomplete current conformance record fails (unless allowed), baseline or not; a
    legacy one is treated as complete, with a warning."""
    if cur.kind != "conformance":
        return
    if cur.legacy:
        warnings.append(f"{cur.label}: legacy record (schema {cur.schema_version}), "
                        "completeness unknown: treated as complete; re-run with this kvcheck "
                        "for a record that says whether every applicable test ran")
        return
    if not cur.incomplete:
        return
    what = f"incomplete: {cur.completeness_text()}"
    if config.allow_incomplete:
        decisions.append(Decision(cur.name, RECORD_ITEM, INCOMPLETE_ALLOWED, what,
                                  record=INCOMPLETE))
        warnings.append(f"the current record of {cur.label} is {what}; accepted by "
                        "--allow-incomplete")
        return
    decisions.append(Decision(cur.name, RECORD_ITEM, REGRESSION, what, record=INCOMPLETE))
    failures.append(f"The current record of {cur.label} is {what}. Run the whole suite "
                    "(no -k/-m/deselection, path subset, --lf, -x or --maxfail), or accept "
                    "a partial run with --allow-incomplete")


def _ids(decisions: list[Decision]) -> str:
    shown = ", ".join(repr(d.item) for d in decisions[:SHOWN_MISSING])
    more = len(decisions) - SHOWN_MISSING
    return shown + (f" and {more} more" if more > 0 else "")


def _report_missing(cur: Group, missing: list[Decision], config: GateConfig,
                    warnings: list[str], failures: list[str]) -> None:
    """One line per record about its missing tests: how many and the first few ids."""
    failing = [d for d in missing if d.status == REGRESSION]
    allowed = [d for d in missing if d.status == MISSING_ALLOWED]
    if failing:
        n = len(failing)
        failures.append(
            f"{n} test{'s' * (n != 1)} of {cur.name} that passed in the baseline "
            f"{'are' if n != 1 else 'is'} missing from the current record: {_ids(failing)}. "
            + ("Run them, or accept their absence with --allow-missing or a waiver naming them"
               if n != 1 else
               "Run it, or accept its absence with --allow-missing or a waiver naming it"))
    if allowed:
        n = len(allowed)
        warnings.append(f"{n} test{'s' * (n != 1)} of {cur.name} that passed in the baseline "
                        f"{'are' if n != 1 else 'is'} missing from the current record "
                        f"(accepted by --allow-missing): {_ids(allowed)}")


def _row(d: Decision) -> list[str]:
    if d.metric is not None:
        m = d.metric
        counted = is_deterministic(m.metric)
        digits = 2 if counted else 1  # counts move by fractions of a percent
        pct = "-" if m.worse_pct is None else f"{m.worse_pct:+.{digits}f}%"
        return [d.implementation, d.item,
                format_value(m.baseline.get("value") if m.baseline else None, m.unit),
                format_value(m.current.get("value") if m.current else None, m.unit),
                pct, str(d.threshold or "-"), "count" if counted else format_p(m), d.status,
                d.detail]
    if d.outcome is None:  # a decision about a whole record (incomplete)
        return [d.implementation, d.item, "", "", "", "", "", d.status, d.detail]
    return [d.implementation, d.item, d.outcome.before or "absent",
            d.outcome.after or "absent", "", "", "", d.status, d.detail]


_HEADERS = ["implementation", "test / metric", "baseline", "current", "worse by", "threshold",
            "p", "verdict", "note"]


def _summary(result: GateResult) -> str:
    n = len(result.regressions)
    if n:
        missing = sum(d.is_missing for d in result.regressions)
        incomplete = sum(d.is_incomplete for d in result.regressions)
        nonconforming = sum(d.is_nonconforming for d in result.regressions)
        tests = sum(d.outcome is not None for d in result.regressions) - missing
        metrics = n - tests - missing - incomplete - nonconforming
        parts = [f"{tests} conformance", f"{metrics} metric"]
        if missing:
            parts.append(f"{missing} missing test{'s' * (missing != 1)}")
        if incomplete:
            parts.append(f"{incomplete} incomplete record{'s' * (incomplete != 1)}")
        if nonconforming:
            parts.append(f"{nonconforming} non-conforming record"
                         f"{'s' * (nonconforming != 1)}")
        empty = "; nothing compared" if result.empty else ""
        return (f"kvcheck gate: FAILED, {n} regression{'s' * (n != 1)} "
                f"({', '.join(parts)}){empty}")
    alone = len(result.judged_alone)
    their = "its" if alone == 1 else "their"
    own = (f": {alone} conformance record{'s' * (alone != 1)} judged on {their} own verdict"
           if alone else "")
    if result.empty_fails:
        return f"kvcheck gate: FAILED, nothing compared (--allow-empty accepts this){own}"
    if result.empty:
        return f"kvcheck gate: passed with nothing compared (--allow-empty){own}"
    waived = sum(d.status == "waived" and d.record is None for d in result.decisions)
    extra = f", {waived} waived" if waived else ""
    records = sum(d.status == "waived" and d.is_nonconforming for d in result.decisions)
    if records:
        extra += (f", {records} non-conforming record{'s' * (records != 1)} accepted by "
                  "waivers")
    return f"kvcheck gate: passed ({result.compared} record group(s) compared{extra})"


def _shown(result: GateResult, verbose: bool) -> list[Decision]:
    return [d for d in result.decisions if verbose or d.status not in ("ok", NOT_GATED)]


def render_gate(result: GateResult, verbose: bool = False) -> str:
    """The changes table (metrics within their thresholds only with ``verbose``), warnings,
    failure lines and the verdict, as printed text."""
    from rich.markup import escape as _rich_escape
    from rich.table import Table

    def escape(text: str) -> str:
        return str(_rich_escape(visible(text)))

    buf = io.StringIO()
    out = console(buf)
    shown = _shown(result, verbose)
    if shown:
        table = Table(title="kvcheck gate: what changed")
        for header in _HEADERS:  # ids and notes wrap rather than lose their ends
            wraps = header in ("test / metric", "note")
            table.add_column(header, overflow="fold" if wraps else "ellipsis",
                             max_width=30 if header == "note" else None)
        for d in shown:
            style = "bold red" if d.status == REGRESSION else None
            table.add_row(*(escape(c) for c in _row(d)), style=style)
        out.print(table)
    hidden = sum(d.status == "ok" for d in result.decisions) if not verbose else 0
    if hidden:  # (wall time that is not gated has a warning of its own)
        out.print(f"{hidden} metric(s) within their thresholds not shown (--verbose shows them)")
    elif result.compared and not result.decisions:
        out.print("kvcheck gate: no test outcome changed and no metrics to compare")
    # Messages are never wrapped: CI logs get grepped.
    for warning in result.warnings:
        out.print(f"warning: {escape(warning)}", soft_wrap=True)
    for d in result.decisions:
        if d.message and d.status == "waived":
            out.print(escape(f"{d.message} [{d.detail}]"), soft_wrap=True)
    for d in result.decisions:
        if d.message and d.status == REGRESSION:
            out.print(escape(d.message), soft_wrap=True)
    for line in result.failures:
        out.print(escape(line), soft_wrap=True)
    out.print(_summary(result), soft_wrap=True)
    return buf.getvalue()


def _md(text: str) -> str:
    import html

    return html.escape(visible(text)).replace("|", "\\|")


def render_gate_markdown(result: GateResult, verbose: bool = False) -> str:
    """The same report as Markdown (for ``$GITHUB_STEP_SUMMARY`` or a PR comment)."""
    lines = [f"### {_md(_summary(result))}", ""]
    shown = _shown(result, verbose)
    if shown:
        lines += ["| " + " | ".join(_HEADERS) + " |", "|" + "---|" * len(_HEADERS)]
        for d in shown:
            cells = [_md(c) for c in _row(d)]
            if d.status == REGRESSION:
                cells[7] = f"**{cells[7]}**"
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines += [f"- {_md(d.message)} [{_md(d.detail)}]" for d in result.decisions
              if d.message and d.status == "waived"]
    lines += [f"- {_md(d.message)}" for d in result.regressions if d.message]
    lines += [f"- {_md(line)}" for line in result.failures]
    lines += [f"- warning: {_md(w)}" for w in result.warnings]
    return "\n".join(lines).rstrip() + "\n"
