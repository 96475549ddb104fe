"""Leaderboards: one section per hardware key, one row per (implementation, profile).

A row joins the latest conformance record of an implementation (verdict, per-area outcomes)
with the metrics of its benchmark records under the same profile; either may be missing. Each
metric also shows its ratio to the reference row (``value / reference value``, the reference
being the implementation named ``reference`` by default, same profile if there is one).
Records measured on different hardware keys never share a table.

The main table carries the *key* metrics: those chosen with ``metric_patterns``, or every
metric when there are at most ``MAX_KEY_METRICS``. Below it a metrics table lists every
metric (one row per metric, one column per implementation), so a benchmark suite with dozens
of cases still reads well.

A conformance record of an incomplete run (``complete: false``: deselected tests, ``-x``,
Ctrl-C...) is shown as ``incomplete (ran N of M)``, never with a ✓, in the verdict and area
cells alike; one with failures stays ``✗``. A schema-1 record (completeness unknown) is shown
as before, with "legacy record: completeness unknown" beside its verdict.

Every string in a record is untrusted: the renderers escape it for their format, after
``kvcheck.results.text.visible`` has made control and bidi characters visible (an RTL
override in a name must not reverse the verdict shown after it).
"""

from __future__ import annotations

import html
import io
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from kvcheck.results.compare import Group, console, format_value, glob_match, group_records
from kvcheck.results.environment import SOFTWARE_FIELDS, software_versions
from kvcheck.results.schema import Record, RecordImplementation, RecordMetric, parse_timestamp
from kvcheck.results.text import visible

__all__ = ["MAX_KEY_METRICS", "AreaCell", "Board", "Row", "area_cell", "build_boards",
           "render_markdown", "render_table"]

MAX_KEY_METRICS = 4

_FAILING = ("failed", "error")


@dataclass(frozen=True)
class AreaCell:
    """``text`` for display, ``status`` in pass|fail|skip|none, ``sort`` numeric key
    (share of checked tests that passed; -1 when nothing was checked)."""

    text: str
    status: str
    sort: float


def area_cell(counts: dict[str, int] | None, complete: bool = True) -> AreaCell:
    """Summarize one area's outcome counts; ``complete=False`` (an incomplete run) words a
    passing area as ``"3 passed"``, without the ✓ that would claim the area was checked."""
    if not counts:
        return AreaCell("", "none", -1.0)
    failing = sum(counts.get(o, 0) for o in _FAILING)
    passed = counts.get("passed", 0) + counts.get("xpassed", 0)
    xfailed = counts.get("xfailed", 0)
    checked = passed + failing
    share = passed / checked if checked else -1.0
    if failing:
        return AreaCell(f"✗ {failing} failed", "fail", share)
    if passed + xfailed == 0:
        return AreaCell("skipped", "skip", -1.0)
    text = (f"✓ {passed}" if complete else f"{passed} passed") + (
        f" ({xfailed} xfail)" if xfailed else "")
    return AreaCell(text, "pass" if complete else "incomplete", share)


@dataclass
class Row:
    """One implementation under one profile on one hardware key."""

    implementation: RecordImplementation
    profile: str
    conformance: Group | None = None
    metrics: dict[str, RecordMetric] = field(default_factory=dict)
    ratios: dict[str, float | None] = field(default_factory=dict)
    is_reference: bool = False
    timestamp: str = ""
    environment: Mapping[str, object] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.implementation["name"])

    @property
    def label(self) -> str:
        text = f"{self.name} {self.implementation.get('version', '')}".rstrip()
        commit = self.implementation.get("commit")
        return f"{text} @{str(commit)[:10]}" if commit else text

    @property
    def conformance_cell(self) -> AreaCell:
        group = self.conformance
        if group is None:
            return AreaCell("not run", "none", -1.0)
        totals: dict[str, int] = {}
        for counts in group.areas.values():
            for outcome, n in counts.items():
                totals[outcome] = totals.get(outcome, 0) + n
        cell = area_cell(totals)
        passed = totals.get("passed", 0) + totals.get("xpassed", 0)
        failing = sum(totals.get(o, 0) for o in _FAILING)
        checked = passed + failing
        share = max(cell.sort, 0.0)
        if group.incomplete:
            info: Mapping[str, object] = group.completeness or {}
            applicable = info.get("applicable")
            ran = f"ran {info.get('ran', '?')} of {'?' if applicable is None else applicable}"
            if failing:  # failures are failures, however much ran
                return AreaCell(f"✗ does NOT conform ({passed}/{checked}), incomplete ({ran})",
                                "fail", share / 2)
            # Below every conforming row, above every failing one.
            return AreaCell(f"incomplete ({ran})", "incomplete", 0.5 + share / 4)
        if not group.conforms and not failing and group.short_families:
            # Nothing failed, too little was checked: between incomplete and failing rows.
            return AreaCell(f"insufficient coverage ({', '.join(group.short_families)})",
                            "incomplete", 0.25 + share / 4)
        # Conforming rows sort above every non-conforming one.
        word = "conforms" if group.conforms else "does NOT conform"
        return AreaCell(f"{'✓' if group.conforms else '✗'} {word} ({passed}/{checked})",
                        "pass" if group.conforms else "fail",
                        (1.0 if group.conforms else 0.0) + share / 2)

    @property
    def verdict(self) -> str:
        """The record's verdict line, with a note when its completeness is unknown."""
        group = self.conformance
        if group is None or not group.verdict:
            return ""
        return group.verdict + (" (legacy record: completeness unknown)" if group.legacy
                                else "")

    def area(self, name: str) -> AreaCell:
        if self.conformance is None:
            return area_cell(None)
        return area_cell(self.conformance.areas.get(name), not self.conformance.incomplete)


@dataclass
class Board:
    """The rows measured on one hardware key."""

    hardware_key: str
    rows: list[Row]
    areas: list[str]
    metric_keys: list[str]                  # every metric, first-seen order
    metric_info: dict[str, dict[str, str]]  # key -> {unit, direction, name}
    software: dict[str, str]
    sources: list[str]
    reference: str
    key_metrics: list[str] = field(default_factory=list)  # the main table's metric columns

    def has_reference(self) -> bool:
        return any(r.is_reference for r in self.rows)

    @property
    def metric_rows(self) -> list[Row]:
        """Rows with at least one metric (the metrics table's columns)."""
        return [r for r in self.rows if r.metrics]


def _software(rows: Sequence[Row]) -> dict[str, str]:
    out = {}
    for name in SOFTWARE_FIELDS:
        values = sorted({software_versions(r.environment)[name] or "-" for r in rows})
        out[name] = ", ".join(values)
    return out


def _when(timestamp: str) -> datetime:
    """Sort key of a record's timestamp (validated records always carry a parsable one)."""
    stamp = parse_timestamp(timestamp)
    assert stamp is not None, f"unvalidated record timestamp {timestamp!r}"
    return stamp


def _collect_rows(groups: Iterable[Group]) -> tuple[dict[str, list[Row]], dict[str, list[str]]]:
    """Rows per hardware key, and the record files behind each key."""
    by_key: dict[str, dict[tuple[str, str], Row]] = {}
    sources: dict[str, list[str]] = {}
    # Oldest first: the newest record names the row and provides its environment.
    for group in sorted(groups, key=lambda g: _when(g.timestamp)):
        rows = by_key.setdefault(group.hardware_key, {})
        row = rows.setdefault((group.name, group.profile),
                              Row(group.implementation, group.profile))
        if group.kind == "conformance":
            row.conformance = group
        row.metrics.update(group.metrics)
        row.timestamp, row.environment = group.timestamp, group.environment
        row.implementation = group.implementation
        files = sources.setdefault(group.hardware_key, [])
        files += [f for f in group.sources if f not in files]
    return {k: list(v.values()) for k, v in by_key.items()}, sources


def _metric_info(rows: list[Row]) -> dict[str, dict[str, str]]:
    """metric key -> {unit, direction, name}, in first-seen order."""
    info: dict[str, dict[str, str]] = {}
    for row in rows:
        for key, metric in row.metrics.items():
            info.setdefault(key, {"unit": metric["unit"], "direction": metric["direction"],
                                  "name": metric["name"]})
    return info


def _key_metrics(info: dict[str, dict[str, str]], patterns: Sequence[str]) -> list[str]:
    if not patterns:
        return list(info) if len(info) <= MAX_KEY_METRICS else []
    return [k for k, i in info.items()
            if any(glob_match(p, k) or glob_match(p, i["name"]) for p in patterns)]


def _set_ratios(rows: list[Row], reference: str) -> None:
    """value / the reference row's value (same profile if possible); None when not
    comparable (no reference, other unit, zero)."""
    for row in rows:
        row.is_reference = row.name == reference
    refs = [r for r in rows if r.is_reference]
    for row in rows:
        ref = next((r for r in refs if r.profile == row.profile), refs[0] if refs else None)
        for key, metric in row.metrics.items():
            base = ref.metrics.get(key) if ref else None
            usable = base is not None and base["unit"] == metric["unit"] and base["value"]
            row.ratios[key] = metric["value"] / base["value"] if usable and base else None


def build_boards(records: Iterable[tuple[str, Record]], reference: str = "reference",
                 metric_patterns: Sequence[str] = ()) -> list[Board]:
    """Boards sorted by hardware key, rows by conformance then name.

    ``metric_patterns``: the key metrics, by key or name (``*`` wildcard); default: every
    metric if there are at most ``MAX_KEY_METRICS``, else none (the metrics table has them).
    """
    by_key, sources = _collect_rows(group_records(records).values())
    boards = []
    for hardware_key in sorted(by_key):
        rows = by_key[hardware_key]
        areas = sorted({a for r in rows if r.conformance for a in r.conformance.areas})
        info = _metric_info(rows)
        _set_ratios(rows, reference)
        rows.sort(key=lambda r: (-r.conformance_cell.sort, r.name, r.profile))
        boards.append(Board(hardware_key, rows, areas, list(info), info, _software(rows),
                            sorted(sources[hardware_key]), reference,
                            _key_metrics(info, metric_patterns)))
    return boards


def metric_header(key: str, info: Mapping[str, str]) -> str:
    arrow = "↓" if info["direction"] == "lower_is_better" else "↑"
    return f"{key} [{info['unit']}] {arrow}"


def metric_cell(row: Row, key: str) -> str:
    metric = row.metrics.get(key)
    if metric is None:
        return ""
    text: str = format_value(metric["value"], metric["unit"])
    ratio = row.ratios.get(key)
    if ratio is not None and not row.is_reference:
        text += f" ({ratio:.2f}× ref)"
    return text


def _cells(board: Board, row: Row) -> list[str]:
    return ([row.label, row.profile, row.conformance_cell.text]
            + [row.area(a).text for a in board.areas]
            + [metric_cell(row, k) for k in board.key_metrics])


def _headers(board: Board) -> list[str]:
    return (["implementation", "profile", "conformance"] + board.areas
            + [metric_header(k, board.metric_info[k]) for k in board.key_metrics])


def better(info: Mapping[str, str]) -> str:
    return "lower" if info["direction"] == "lower_is_better" else "higher"


def metrics_table(board: Board) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of the metrics table: metric, unit, better, then one column per
    implementation row that has metrics."""
    columns = board.metric_rows
    headers = ["metric", "unit", "better"] + [f"{r.label} ({r.profile})" for r in columns]
    body = [[key, board.metric_info[key]["unit"], better(board.metric_info[key])]
            + [metric_cell(r, key) for r in columns] for key in board.metric_keys]
    return headers, body


def metrics_note(board: Board) -> str | None:
    if not board.metric_keys:
        return "No benchmark metrics recorded on this hardware yet."
    notes = []
    if not board.key_metrics:
        notes.append(f"{len(board.metric_keys)} metrics, listed below; choose key metrics "
                     "for this table with --metric PATTERN.")
    if not board.has_reference():
        notes.append(f"No {board.reference} row on this hardware: no ratios.")
    return " ".join(notes) or None


def areas_summary(board: Board, row: Row) -> str:
    """All areas in one cell (the terminal table): ``"10/10 pass"`` or the failing ones."""
    if row.conformance is None:
        return ""
    cells = {a: row.area(a) for a in board.areas}
    failing = [f"{a} ({c.text.split()[1]})" for a, c in cells.items() if c.status == "fail"]
    if failing:
        return "✗ " + ", ".join(failing)
    if row.conformance.incomplete:
        passing = sum(c.status == "incomplete" for c in cells.values())
        return f"{passing}/{len(cells)} areas without failures (incomplete run)"
    passing = sum(c.status == "pass" for c in cells.values())
    return f"✓ {passing}/{len(cells)} areas pass"


def render_table(boards: Sequence[Board]) -> str:
    """Rich tables for the terminal, one per hardware key (areas folded into one column;
    the Markdown and HTML pages have a column per area)."""
    from rich.markup import escape as _rich_escape
    from rich.table import Table

    def escape(text: str) -> str:
        return str(_rich_escape(visible(text)))

    buf = io.StringIO()
    out = console(buf)
    for board in boards:
        headers = (["implementation", "profile", "conformance", "areas"]
                   + [metric_header(k, board.metric_info[k]) for k in board.key_metrics])
        table = Table(*(escape(h) for h in headers),
                      title=f"kvcheck leaderboard: {escape(board.hardware_key)}")
        for row in board.rows:
            cells = [row.label, row.profile, row.conformance_cell.text, areas_summary(board, row)]
            cells += [metric_cell(row, k) for k in board.key_metrics]
            table.add_row(*(escape(c) for c in cells))
        out.print(table)
        out.print("  " + escape(_software_line(board)), soft_wrap=True)
        note = metrics_note(board)
        if note:
            out.print("  " + escape(note), soft_wrap=True)
        if board.metric_keys:
            headers, body = metrics_table(board)
            metrics = Table(*(escape(h) for h in headers),
                            title=f"metrics: {escape(board.hardware_key)}")
            for cells in body:
                metrics.add_row(*(escape(c) for c in cells))
            out.print(metrics)
    return buf.getvalue()


def _software_line(board: Board) -> str:
    return " · ".join(f"{name} {value}" for name, value in board.software.items())


def _md(text: str) -> str:
    """Escape untrusted text for a Markdown table cell (no HTML, no markup, no pipes)."""
    text = html.escape(visible(text))
    for ch in "\\`*_[]|#~":
        text = text.replace(ch, "\\" + ch)
    return text


def render_markdown(boards: Sequence[Board], title: str = "kvcheck leaderboard") -> str:
    """A Markdown page: one section and table per hardware key, then each row's verdict."""
    from kvcheck import __version__

    intro = (f"Generated by `kvcheck leaderboard` (kvcheck {__version__}). Rows are compared "
             "only within one hardware key. Area cells: ✓ passed tests, ✗ failing tests; "
             "incomplete (ran N of M): not every applicable test ran, so no ✓; "
             "metrics: ↓ lower is better, ↑ higher is better; `× ref` = value / the "
             "reference's value.")
    lines = [f"# {_md(title)}", "", intro, ""]
    for board in boards:
        lines += [f"## {_md(board.hardware_key)}", "", _md(_software_line(board)), ""]
        headers = _headers(board)
        lines.append("| " + " | ".join(_md(h) for h in headers) + " |")
        lines.append("|" + "|".join(["---"] * 3 + [":---:"] * len(board.areas)
                                    + ["---:"] * len(board.key_metrics)) + "|")
        for row in board.rows:
            lines.append("| " + " | ".join(_md(c) for c in _cells(board, row)) + " |")
        lines.append("")
        note = metrics_note(board)
        if note:
            lines += [_md(note), ""]
        if board.metric_keys:
            headers, body = metrics_table(board)
            lines += ["### Metrics", "", "| " + " | ".join(_md(h) for h in headers) + " |",
                      "|" + "|".join(["---"] * 3 + ["---:"] * (len(headers) - 3)) + "|"]
            lines += ["| " + " | ".join(_md(c) for c in cells) + " |" for cells in body]
            lines.append("")
        verdicts = [(r, r.verdict) for r in board.rows if r.verdict]
        if verdicts:
            lines += ["Verdicts:", ""]
            lines += [f"- {_md(r.label)} ({_md(r.profile)}): {_md(v)}" for r, v in verdicts]
            lines.append("")
        latest = max(board.rows, key=lambda r: _when(r.timestamp)).timestamp
        lines += ["Records: " + ", ".join(_md(s) for s in board.sources)
                  + f"; latest {_md(latest)}.", ""]
    return "\n".join(lines).rstrip() + "\n"
