"""The HTML leaderboard fits a 1280 px wide window: no page-level horizontal scroll, even with
a 100-character implementation name, many conformance areas, many metrics and long record
file names; wide tables scroll inside their own box instead.

Measured in headless Chromium. The page's Content-Security-Policy admits only its own script,
so a wrapper page in the same folder loads it in a 1280x900 iframe and reads the iframe's
``document.documentElement`` (``--allow-file-access-from-files`` makes the two file:// pages
same-origin), writing the numbers into its own DOM for ``--dump-dom``."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

from kvcheck.plugin.cli import main

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--allow-file-access-from-files"]
LONG_NAME = "my-engine-with-a-really-long-implementation-name-" + "x" * 51   # 100 characters
AREAS = ["allocation", "block_pool", "differential", "events", "eviction", "hashing",
         "invariants", "kernels", "prefix_caching", "slot_mapping", "extra_keys_lora",
         "extra_keys_multimodal", "caching_off_semantics", "lookahead_and_spec_decode"]

WRAPPER = """<!DOCTYPE html><html><body style="margin:0">
<iframe id="f" src="board.html" style="width:1280px;height:900px;border:0"></iframe>
<script>
document.getElementById("f").addEventListener("load", function () {
  var doc = this.contentDocument, root = doc.documentElement, b = document.body;
  var box = doc.querySelector(".scroll");
  b.setAttribute("data-ready", doc.documentElement.getAttribute("data-ready") || "0");
  b.setAttribute("data-scroll-width", root.scrollWidth);
  b.setAttribute("data-client-width", root.clientWidth);
  b.setAttribute("data-inner-width", this.contentWindow.innerWidth);
  b.setAttribute("data-table-box", box.clientWidth + "/" + box.scrollWidth);
});
</script></body></html>
"""


def measure(chromium: str, folder: Path) -> dict[str, str]:
    (folder / "wrap.html").write_text(WRAPPER)
    proc = subprocess.run([chromium, *FLAGS, f"--user-data-dir={folder / 'profile'}",
                           "--dump-dom", (folder / "wrap.html").as_uri()],
                          capture_output=True, text=True, timeout=90, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    body = re.search(r"<body[^>]*>", proc.stdout)
    assert body is not None, proc.stdout[:2000]
    attrs = dict(re.findall(r'data-([\w-]+)="([^"]*)"', body.group(0)))
    assert attrs.get("ready") == "1", f"the leaderboard page did not load or run: {attrs}"
    return attrs


def test_page_fits_1280px_without_horizontal_scroll(chromium: str, rec: SimpleNamespace,
                                                    tmp_path: Path) -> None:
    def outcomes(name: str) -> dict[str, str]:
        return {f"conformance/test_{a}.py::test_t[{name}]": "passed" for a in AREAS}

    def bench(name: str, scale: float) -> dict:
        return rec.benchmark(name, [
            rec.metric(f"allocate_slots_us_p{p}", [10.0 * scale], case=f"scheduler/workload_{k}")
            for p in (50, 99) for k in range(4)])

    records = [rec.conformance("reference", outcomes("reference")),
               rec.conformance(LONG_NAME, outcomes(LONG_NAME)),
               rec.conformance("fast", outcomes("fast")),
               bench("reference", 1.0), bench(LONG_NAME, 1.3), bench("fast", 0.8)]
    path = rec.write("records-of-a-long-ci-run-" + "y" * 150 + ".jsonl", *records)
    assert main(["leaderboard", str(path), "--format", "html", "-o",
                 str(tmp_path / "board.html")]) == 0
    got = measure(chromium, tmp_path)
    assert got["inner-width"] == "1280"
    # No page-level horizontal scroll: the content is no wider than the viewport (less its
    # vertical scrollbar, if any).
    assert int(got["scroll-width"]) <= int(got["client-width"]) <= 1280, got
    # The data really is too wide for the window: the conformance table scrolls in its box.
    box_width, table_width = map(int, got["table-box"].split("/"))
    assert table_width > box_width, got
