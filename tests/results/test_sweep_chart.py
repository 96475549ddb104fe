"""The HTML leaderboard draws the scaling sweep (``python -m kvcheck.bench.sweep`` records) as
cost-versus-axis line charts, one line per subject, and only when such records are present."""

from __future__ import annotations

import re
from types import SimpleNamespace

from kvcheck.plugin.cli import main


def _sweep_metric(rec: SimpleNamespace, axis: str, value: int, ns: float,
                  name: str = "ns_per_scheduled_token") -> dict:
    m = rec.metric(name, [ns], unit="ns/token", case=f"sweep/{axis}={value}")
    m["extra"] = {"sweep_axis": axis, "sweep_value": value, "level": "protocol"}
    return m


def _render(tmp_path, rec, *records) -> str:
    path = rec.write("board.jsonl", *records)
    out = tmp_path / "board.html"
    assert main(["leaderboard", str(path), "--format", "html", "-o", str(out)]) == 0
    return out.read_text(encoding="utf-8")


def test_sweep_records_get_line_charts(tmp_path, rec) -> None:
    mine = rec.benchmark("mine", [_sweep_metric(rec, "pool_blocks", v, ns) for v, ns in
                                  ((1024, 300.0), (4096, 320.0), (16384, 500.0))]
                         + [_sweep_metric(rec, "concurrency", v, ns) for v, ns in
                            ((8, 100.0), (64, 110.0))])
    ref = rec.benchmark("reference", [_sweep_metric(rec, "pool_blocks", v, ns) for v, ns in
                                      ((1024, 250.0), (4096, 250.0), (16384, 260.0))])
    page = _render(tmp_path, rec, mine, ref)
    assert "<h3>Scaling sweep</h3>" in page
    charts = re.findall(r'<svg [^>]*class="sweep" data-axis="([^"]+)"', page)
    assert charts == ["pool_blocks", "concurrency"]
    pool_chart = page[page.index('data-axis="pool_blocks"'):]
    pool_chart = pool_chart[:pool_chart.index("</svg>")]
    lines = re.findall(r'<polyline class="series"[^>]* points="([^"]+)"', pool_chart)
    assert len(lines) == 2  # one per subject
    for points in lines:
        xs = [float(p.split(",")[0]) for p in points.split()]
        assert len(xs) == 3 and xs == sorted(xs)  # axis values left to right
    # Higher cost is drawn higher (smaller y): the top point of the chart is the largest cost
    # (mine at 16384 blocks, 500 ns), the last point of its line, above that line's start.
    ys = [[float(p.split(",")[1]) for p in points.split()] for points in lines]
    top_line = min(ys, key=min)
    assert min(top_line) == top_line[-1] < top_line[0]
    assert "mine 1.0" in pool_chart and "reference 1.0" in pool_chart
    # Sweep metrics are drawn as lines, not as one bar chart per point.
    assert "sweep/pool_blocks=1024/ns_per_scheduled_token [ns/token]" not in page.split(
        "<h3>Scaling sweep</h3>")[0].split("</table>")[-1]


def test_no_sweep_chart_without_sweep_records(tmp_path, rec) -> None:
    plain = rec.benchmark("mine", [rec.metric("us_per_call", [1.0, 2.0, 3.0],
                                              case="scheduler/burst_short")])
    page = _render(tmp_path, rec, plain)
    assert "Scaling sweep" not in page
    assert 'class="sweep"' not in page
    assert "<figure>" in page  # the ordinary bar chart is still there


def test_sweep_strings_are_escaped(tmp_path, rec) -> None:
    evil = '<script>alert(1)</script>'
    m = _sweep_metric(rec, evil, 8, 10.0)
    page = _render(tmp_path, rec, rec.benchmark("mine", [m]))
    assert evil not in page
    assert "&lt;script&gt;" in page
