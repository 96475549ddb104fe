"""The HTML leaderboard in a real headless Chromium: rows render, the script runs under the
page's CSP, clicking a header (driven by the ``#sort=`` fragment) reorders rows, and an
injected ``<script>`` in an implementation name is shown as text, never executed."""

from __future__ import annotations

import subprocess
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvcheck.plugin.cli import main

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
EVIL = ("<script>document.documentElement.setAttribute('data-pwned','script')</script>"
        "<img src=x onerror=\"document.documentElement.setAttribute('data-pwned','img')\">")


class _Dom(HTMLParser):
    """Collects what the tests look at from a --dump-dom serialization."""

    def __init__(self) -> None:
        super().__init__()
        self.html_attrs: dict[str, str | None] = {}
        self.tags: list[str] = []
        self.rows: list[list[str]] = []   # first table's body rows, cell texts
        self._tables = 0
        self._in_body = False
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag == "html":
            self.html_attrs = dict(attrs)
        elif tag == "table":
            self._tables += 1
        elif tag == "tbody" and self._tables == 1:
            self._in_body = True
        elif tag == "tr" and self._in_body:
            self.rows.append([])
        elif tag == "td" and self._in_body:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "tbody":
            self._in_body = False
        elif tag == "td" and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


@pytest.fixture
def page(rec: SimpleNamespace, tmp_path: Path) -> Path:
    def bench(name: str, us: float) -> dict:
        return rec.benchmark(name, [rec.metric("us_per_call", [us], case="alloc")])

    path = rec.write("r.jsonl", rec.conformance("reference"), bench("reference", 10.0),
                     bench("fast", 7.5), bench("slow", 12.0), bench(EVIL, 9.0))
    out = tmp_path / "board.html"
    assert main(["leaderboard", str(path), "--format", "html", "-o", str(out)]) == 0
    return out


def dump_dom(chromium: str, url: str, tmp_path: Path) -> _Dom:
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    proc = subprocess.run([chromium, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", url],
                          capture_output=True, text=True, timeout=90, check=False)
    assert proc.returncode == 0 and "<html" in proc.stdout, proc.stderr[-2000:]
    dom = _Dom()
    dom.feed(proc.stdout)
    assert dom.html_attrs.get("data-ready") == "1", "the page's script did not run"
    return dom


def names(dom: _Dom) -> list[str]:
    return [row[0].split(" 1.0")[0] for row in dom.rows]


def test_rows_render_and_injection_is_text(chromium: str, page: Path, tmp_path: Path) -> None:
    dom = dump_dom(chromium, page.as_uri(), tmp_path)
    assert "data-pwned" not in dom.html_attrs          # neither the script nor onerror ran
    assert "img" not in dom.tags                        # the <img> never became an element
    assert dom.tags.count("script") == 1                # only the page's own script
    assert names(dom) == ["reference", EVIL, "fast", "slow"]  # conforming first, then by name
    assert dom.rows[2][-1] == "7.5 us (0.75× ref)"


def test_header_click_sorts_rows(chromium: str, page: Path, tmp_path: Path) -> None:
    """#sort=KEY clicks the header once (ascending), #sort=-KEY twice (descending)."""
    up = dump_dom(chromium, page.as_uri() + "#sort=metric-0", tmp_path)
    assert names(up) == ["fast", EVIL, "reference", "slow"]      # 7.5, 9, 10, 12 us
    down = dump_dom(chromium, page.as_uri() + "#sort=-metric-0", tmp_path)
    assert names(down) == ["slow", "reference", EVIL, "fast"]
    by_name = dump_dom(chromium, page.as_uri() + "#sort=impl", tmp_path)
    assert names(by_name) == [EVIL, "fast", "reference", "slow"]  # "<" sorts before letters
