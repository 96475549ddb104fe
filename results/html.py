"""The leaderboard as one self-contained HTML page: no network, no external files.

Tables sort by clicking a header (again to reverse); a URL fragment ``#sort=KEY`` (or
``#sort=-KEY`` for descending) clicks header ``KEY`` once or twice on load, so a sorted view
can be linked. Column keys of the main table: ``impl``, ``profile``, ``conformance``,
``area-N`` and ``metric-N`` (key metrics); of the metrics table: ``m-metric``, ``m-unit``,
``m-better`` and ``m-impl-N`` (sorted by ratio to the reference). N counts from 0. Every
metric also gets a bar chart (inline SVG), grouped by benchmark case.

Every record string is untrusted and goes through ``html.escape``, after control and bidi
characters were made visible (``kvcheck.results.text.visible``: an RTL override in a name
shows as ``\u202e`` instead of reversing the verdict beside it); nothing from a record is
ever placed inside the script. The Content-Security-Policy allows only the page's own script
(by hash) and no network at all, so even an escaping bug could not run injected code.
``<html data-ready="1">`` is set once the script has run (tests look for it).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping, Sequence
from html import escape as _html_escape

from kvcheck.results.compare import format_value
from kvcheck.results.leaderboard import (
    Board,
    Row,
    better,
    metric_cell,
    metric_header,
    metrics_note,
)
from kvcheck.results.text import visible

__all__ = ["render_html"]

_SCRIPT = """
(function () {
  "use strict";
  function sortKey(row, index, numeric) {
    var cell = row.cells[index];
    var raw = cell.hasAttribute("data-sort") ? cell.getAttribute("data-sort") : cell.textContent;
    if (!numeric) { return raw.toLowerCase(); }
    var value = parseFloat(raw);
    return isNaN(value) ? null : value;
  }
  function sortBy(th) {
    var table = th.closest("table");
    var index = Array.prototype.indexOf.call(th.parentNode.children, th);
    var numeric = th.getAttribute("data-type") === "number";
    var ascending = th.getAttribute("aria-sort") !== "ascending";
    Array.prototype.forEach.call(th.parentNode.children, function (h) {
      h.removeAttribute("aria-sort");
    });
    th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = sortKey(a, index, numeric), y = sortKey(b, index, numeric);
      if (x === null || y === null) { return (x === null) - (y === null); }  // missing last
      var c = numeric ? x - y : x.localeCompare(y);
      return ascending ? c : -c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  }
  var headers = document.querySelectorAll("th[data-sortable]");
  Array.prototype.forEach.call(headers, function (th) {
    th.addEventListener("click", function () { sortBy(th); });
    th.addEventListener("keydown", function (e) {
      if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sortBy(th); }
    });
  });
  var m = /(?:^#|&)sort=(-?)([A-Za-z0-9-]+)/.exec(window.location.hash);
  if (m) {
    Array.prototype.forEach.call(headers, function (th) {
      if (th.getAttribute("data-key") === m[2]) { th.click(); if (m[1]) { th.click(); } }
    });
  }
  document.documentElement.setAttribute("data-ready", "1");
})();
"""

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em; color: #1d1d1f; }
/* The page itself never scrolls sideways (1280 px and up): long unbroken record text (names,
   file paths, hardware keys) wraps anywhere, and wide tables and charts scroll inside their
   own box. */
html, body { overflow-wrap: anywhere; }
h1 { font-size: 1.6em; } h2 { margin-top: 2em; font-size: 1.25em; }
.legend, .env, footer { color: #555; }
.scroll, figure { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #d0d0d7; padding: 4px 8px; white-space: nowrap;
         overflow-wrap: normal; }
/* A long implementation name wraps in its cell instead of widening the whole table. */
table.leaderboard td:first-child { white-space: normal; overflow-wrap: anywhere;
                                   min-width: 10em; max-width: 22em; }
th { background: #f2f2f7; cursor: pointer; user-select: none; }
th[aria-sort="ascending"]::after { content: " \\25B2"; }
th[aria-sort="descending"]::after { content: " \\25BC"; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.pass { background: #e7f6ea; } td.fail { background: #fde8e8; } td.skip { color: #888; }
td.incomplete { background: #fdf5e0; }
tr.reference td:first-child { font-weight: 600; }
.charts { display: flex; flex-wrap: wrap; gap: 1.5em; }
figure { margin: 0; } figcaption { font-weight: 600; margin-bottom: .3em; }
details { margin: .8em 0; } summary { cursor: pointer; font-weight: 600; }
svg text { font: 12px system-ui, sans-serif; fill: #1d1d1f; }
svg rect.bar { fill: #4f7ecf; } svg rect.bar.ref { fill: #9a9aa5; }
"""


def _csp(script: str) -> str:
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    return (f"default-src 'none'; script-src 'sha256-{digest}'; style-src 'unsafe-inline'; "
            "img-src data:; base-uri 'none'; form-action 'none'")


def escape(value: object) -> str:
    """Text content: invisible characters made visible, then HTML-escaped."""
    return _html_escape(visible(value))


def _attr(value: object) -> str:
    return _html_escape(visible(value), quote=True)


def _th(key: str, label: str, numeric: bool, title: str = "") -> str:
    kind = "number" if numeric else "text"
    tip = f' title="{_attr(title)}"' if title else ""
    return (f'<th data-key="{key}" data-type="{kind}" data-sortable tabindex="0"{tip}>'
            f"{escape(label)}</th>")


def _table(board: Board, index: int) -> str:
    head = [_th("impl", "implementation", False), _th("profile", "profile", False),
            _th("conformance", "conformance", True)]
    head += [_th(f"area-{i}", area, True) for i, area in enumerate(board.areas)]
    for i, key in enumerate(board.key_metrics):
        info = board.metric_info[key]
        head.append(_th(f"metric-{i}", metric_header(key, info), True,
                        f"{better(info)} is better; × ref = value / the reference's value"))
    body = []
    for row in board.rows:
        cls = ' class="reference"' if row.is_reference else ""
        conf = row.conformance_cell
        verdict = row.verdict
        cells = [f'<td data-sort="{_attr(row.name.lower())}">{escape(row.label)}</td>',
                 f"<td>{escape(row.profile)}</td>",
                 (f'<td class="{conf.status}" data-sort="{conf.sort:.6f}" '
                  f'title="{_attr(verdict)}">{escape(conf.text)}</td>')]
        for area in board.areas:
            cell = row.area(area)
            cells.append(f'<td class="{cell.status}" data-sort="{cell.sort:.6f}">'
                         f"{escape(cell.text)}</td>")
        for key in board.key_metrics:
            metric = row.metrics.get(key)
            sort = "" if metric is None else repr(float(metric["value"]))
            cells.append(f'<td class="num" data-sort="{sort}">{escape(metric_cell(row, key))}'
                         "</td>")
        body.append(f'<tr{cls} data-impl="{_attr(row.name)}">' + "".join(cells) + "</tr>")
    return (f'<div class="scroll"><table class="leaderboard" id="table-{index}">\n<thead><tr>'
            f'{"".join(head)}</tr></thead>\n<tbody>\n' + "\n".join(body)
            + "\n</tbody>\n</table></div>")


def _metrics_table(board: Board, index: int) -> str:
    """Every metric (rows) by implementation (columns); cells sort by ratio to the reference."""
    columns = board.metric_rows
    head = [_th("m-metric", "metric", False), _th("m-unit", "unit", False),
            _th("m-better", "better", False)]
    head += [_th(f"m-impl-{i}", f"{r.label} ({r.profile})", True, "sorts by × ref")
             for i, r in enumerate(columns)]
    body = []
    for key in board.metric_keys:
        info = board.metric_info[key]
        cells = [f"<td>{escape(key)}</td>", f"<td>{escape(info['unit'])}</td>",
                 f"<td>{better(info)}</td>"]
        for row in columns:
            ratio = row.ratios.get(key)
            sort = "" if ratio is None else repr(ratio)
            cells.append(f'<td class="num" data-sort="{sort}">{escape(metric_cell(row, key))}'
                         "</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<div class="scroll"><table class="metrics" id="metrics-{index}">\n<thead><tr>'
            f'{"".join(head)}</tr></thead>\n<tbody>\n' + "\n".join(body)
            + "\n</tbody>\n</table></div>")


def _charts(board: Board) -> str:
    """One collapsible group of bar charts per benchmark case (``case/name`` keys); sweep
    metrics are drawn by ``_sweep_charts`` instead."""
    groups: dict[str, list[str]] = {}
    sweep = _sweep_keys(board)
    for key in board.metric_keys:
        if key in sweep:
            continue
        case = key.rsplit("/", 1)[0] if "/" in key else ""
        groups.setdefault(case, []).append(key)
    parts = []
    for case, keys in groups.items():
        title = escape(case) if case else "metrics"
        parts.append(f"<details open><summary>{title}</summary>"
                     f'<div class="charts">{"".join(_chart(board, k) for k in keys)}</div>'
                     "</details>")
    return "".join(parts)


def _chart(board: Board, key: str) -> str:
    """Horizontal bars, one per row that has the metric, scaled to the largest value."""
    info = board.metric_info[key]
    rows: list[tuple[Row, float]] = [(r, float(r.metrics[key]["value"])) for r in board.rows
                                     if key in r.metrics]
    label_w, bar_w, value_w, bar_h, gap = 230, 300, 150, 18, 6
    top = max((abs(v) for _, v in rows), default=0.0) or 1.0
    height = len(rows) * (bar_h + gap) + gap
    parts = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + bar_w + value_w}" '
              f'height="{height}" role="img" aria-label="{_attr(metric_header(key, info))}">')]
    for i, (row, value) in enumerate(rows):
        y = gap + i * (bar_h + gap)
        width = max(1.0, bar_w * abs(value) / top)
        name = f"{row.label} ({row.profile})"
        shown = metric_cell(row, key)
        ref = " ref" if row.is_reference else ""
        parts.append(
            f'<text x="{label_w - 6}" y="{y + 13}" text-anchor="end">{escape(name[:34])}</text>'
            f'<rect class="bar{ref}" x="{label_w}" y="{y}" width="{width:.1f}" height="{bar_h}">'
            f"<title>{escape(name)}: {escape(shown)}</title></rect>"
            f'<text x="{label_w + width + 6:.1f}" y="{y + 13}">'
            f"{escape(format_value(value, info['unit']))}</text>")
    parts.append("</svg>")
    return (f"<figure><figcaption>{escape(key)} [{escape(info['unit'])}], {better(info)} is "
            f"better</figcaption>{''.join(parts)}</figure>")


# ------------------------------------------------------------------------------ sweep charts
_SWEEP_COLORS = ("#4f7ecf", "#d9822b", "#3a9a5b", "#b8459a", "#8a6d3b", "#2a9fb0")


def _sweep_axis(metric: Mapping[str, object]) -> tuple[str, float] | None:
    """``(axis, value)`` of a sweep metric (``kvcheck.bench.sweep`` records), else None."""
    extra = metric.get("extra")
    if not isinstance(extra, dict):
        return None
    axis, value = extra.get("sweep_axis"), extra.get("sweep_value")
    if not isinstance(axis, str) or isinstance(value, bool) or not isinstance(
            value, (int, float)) or value <= 0:
        return None
    return axis, float(value)


def _sweep_keys(board: Board) -> set[str]:
    return {key for row in board.rows for key, metric in row.metrics.items()
            if _sweep_axis(metric) is not None}


def _sweep_series(board: Board) -> dict[tuple[str, str, str], dict[str, list[tuple[float,
                                                                                  float]]]]:
    """(axis, metric name, unit) -> row label -> [(axis value, metric value)], sorted."""
    out: dict[tuple[str, str, str], dict[str, list[tuple[float, float]]]] = {}
    for row in board.rows:
        for metric in row.metrics.values():
            where = _sweep_axis(metric)
            if where is None:
                continue
            axis, x = where
            series = out.setdefault((axis, str(metric["name"]), str(metric["unit"])), {})
            series.setdefault(f"{row.label} ({row.profile})", []).append(
                (x, float(metric["value"])))
    for series in out.values():
        for points in series.values():
            points.sort()
    return out


def _sweep_chart(axis: str, name: str, unit: str,
                 series: dict[str, list[tuple[float, float]]]) -> str:
    """A line chart, one line per subject: the axis (log scale) across, the cost up."""
    import math

    left, top, width, height, legend_h = 120, 10, 420, 220, 20 * len(series) + 10
    xs = sorted({x for points in series.values() for x, _ in points})
    y_max = max((y for points in series.values() for _, y in points), default=0.0) or 1.0
    lo, hi = math.log(xs[0]), math.log(xs[-1])
    span = (hi - lo) or 1.0

    def px(x: float) -> float:
        return left + (width * (math.log(x) - lo) / span if len(xs) > 1 else width / 2)

    def py(y: float) -> float:
        return top + height - height * max(y, 0.0) / y_max

    total_h = top + height + 40 + legend_h
    svg_open = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 30}" '
                f'height="{total_h}" role="img" class="sweep" data-axis="{_attr(axis)}" '
                f'aria-label="{_attr(f"{name} against {axis}")}">')
    x_axis = (f'<line x1="{left}" y1="{top + height}" x2="{left + width}" '
              f'y2="{top + height}" stroke="#888"/>')
    y_axis = f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + height}" stroke="#888"/>'
    y_top = (f'<text x="{left - 6}" y="{top + 10}" text-anchor="end">'
             f"{escape(format_value(y_max, unit))}</text>")
    y_zero = f'<text x="{left - 6}" y="{top + height}" text-anchor="end">0</text>'
    parts = [svg_open, x_axis, y_axis, y_top, y_zero]
    parts += [f'<text x="{px(x):.1f}" y="{top + height + 16}" text-anchor="middle">'
              f"{escape(f'{x:g}')}</text>" for x in xs]
    parts.append(f'<text x="{left + width / 2:.1f}" y="{top + height + 34}" '
                 f'text-anchor="middle">{escape(axis)} (log scale)</text>')
    for i, (label, points) in enumerate(series.items()):
        color = _SWEEP_COLORS[i % len(_SWEEP_COLORS)]
        coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in points)
        parts.append(f'<polyline class="series" fill="none" stroke="{color}" '
                     f'stroke-width="2" points="{coords}"/>')
        for x, y in points:
            parts.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}">'
                         f"<title>{escape(label)}: {escape(axis)}={escape(f'{x:g}')}, "
                         f"{escape(format_value(y, unit))}</title></circle>")
        ly = top + height + 50 + 20 * i
        parts.append(f'<rect x="{left}" y="{ly - 10}" width="12" height="12" '
                     f'fill="{color}"/><text x="{left + 18}" y="{ly}">'
                     f"{escape(label[:60])}</text>")
    parts.append("</svg>")
    return (f'<figure class="sweep-chart"><figcaption>{escape(name)} [{escape(unit)}] '
            f"against {escape(axis)}, lower is better</figcaption>{''.join(parts)}</figure>")


def _sweep_charts(board: Board) -> str:
    """The scaling sweep (``kvcheck bench sweep``): per axis and metric, the cost
    of every subject against the axis value. Empty when the board has no sweep records."""
    series = _sweep_series(board)
    if not series:
        return ""
    by_axis: dict[str, list[str]] = {}
    for (axis, name, unit), lines in series.items():
        by_axis.setdefault(axis, []).append(_sweep_chart(axis, name, unit, lines))
    body = "".join(f"<details open><summary>{escape(axis)}</summary>"
                   f'<div class="charts">{"".join(charts)}</div></details>'
                   for axis, charts in by_axis.items())
    return f'<h3>Scaling sweep</h3><div class="sweep">{body}</div>'


def render_html(boards: Sequence[Board], title: str = "kvcheck leaderboard") -> str:
    """The whole page as a string (write it with ``kvcheck.results.io.write_atomic``)."""
    from kvcheck import __version__

    sections = []
    for i, board in enumerate(boards):
        parts = [f'<section class="board" id="board-{i}">',
                 f"<h2>{escape(board.hardware_key)}</h2>",
                 '<p class="env">' + escape(" · ".join(f"{k} {v}" for k, v in
                                                     board.software.items())) + "</p>",
                 _table(board, i)]
        note = metrics_note(board)
        if note:
            parts.append(f'<p class="note">{escape(note)}</p>')
        if board.metric_keys:
            parts += ["<h3>Metrics</h3>", _metrics_table(board, i), _charts(board),
                      _sweep_charts(board)]
        verdicts = [f"<li>{escape(r.label)} ({escape(r.profile)}): {escape(r.verdict)}</li>"
                    for r in board.rows if r.verdict]
        if verdicts:
            parts.append('<ul class="verdicts">' + "".join(verdicts) + "</ul>")
        parts.append('<p class="env">Records: ' + escape(", ".join(board.sources)) + "</p>")
        parts.append("</section>")
        sections.append("\n".join(parts))
    if not boards:
        sections.append("<p>No records.</p>")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{_attr(_csp(_SCRIPT))}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title>
<style>{_CSS}</style>
</head>
<body>
<h1>{escape(title)}</h1>
<p class="legend">One table per hardware key; rows are compared only on the same hardware.
Click a column header to sort (again to reverse). Area cells: ✓ passed tests, ✗ failing tests;
incomplete (ran N of M): not every applicable test ran, so no ✓.
Metrics: ↓ lower is better, ↑ higher is better; × ref = value / the reference's value.</p>
{chr(10).join(sections)}
<footer>Generated by kvcheck {escape(__version__)}.</footer>
<script>{_SCRIPT}</script>
</body>
</html>
"""
