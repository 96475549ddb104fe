"""Where kvcheck's verdict meets other pytest plugins: pytest-html's report, JUnit XML
properties, progress-bar plugins (pytest-sugar) on the terminal, and pytest-cov.

Nothing here imports those plugins: each function works from what pytest hands over and does
nothing when the plugin is absent.
"""

from __future__ import annotations

import html
import importlib
import sys

import pytest

from kvcheck.results.schema import OUTCOMES

__all__ = ["add_junit_properties", "html_verdict", "junit_properties", "measure_root_package",
           "start_own_line"]


def start_own_line(terminalreporter: pytest.TerminalReporter) -> None:
    """End whatever the terminal's current line holds, so the next line starts at column 0.

    pytest's ``write_line`` only ends its own progress line (it tracks the test file it is
    printing); a progress plugin that draws with ``\\r`` (pytest-sugar) leaves the cursor
    after its bar, and kvcheck's first line would be glued onto it.
    """
    writer = getattr(terminalreporter, "_tw", None)
    if getattr(writer, "width_of_current_line", 0):
        terminalreporter.write("\n")
    terminalreporter.ensure_newline()


def html_verdict(title: str, verdict: str, conforms: bool,
                 counts: dict[str, dict[str, int]]) -> str:
    """The verdict and the per-area table as an HTML fragment for pytest-html's summary
    (``pytest_html_results_summary``; pytest-html inserts the strings as markup)."""
    head = "".join(f"<th>{html.escape(o)}</th>" for o in OUTCOMES)
    rows = "".join(
        f"<tr><td>{html.escape(area)}</td>"
        + "".join(f"<td>{row.get(o, 0)}</td>" for o in OUTCOMES) + "</tr>"
        for area, row in counts.items())
    state = "conforms" if conforms else "no-conformance"
    return (f'<div class="kvcheck-verdict {state}">'
            f"<h3>{html.escape(title)}</h3>"
            f"<p><strong>verdict:</strong> {html.escape(verdict)}</p>"
            f'<table class="kvcheck-areas"><thead><tr><th>area</th>{head}</tr></thead>'
            f"<tbody>{rows}</tbody></table></div>")


def junit_properties(impl: str, verdict: str, conforms: bool,
                     complete: bool) -> list[tuple[str, str]]:
    """The JUnit XML test-suite properties for one implementation: ``kvcheck.<impl>.verdict``,
    ``.conforms`` and ``.complete`` (``true`` / ``false``)."""
    return [(f"kvcheck.{impl}.verdict", verdict),
            (f"kvcheck.{impl}.conforms", str(conforms).lower()),
            (f"kvcheck.{impl}.complete", str(complete).lower())]


def junit_xml_active(config: pytest.Config) -> bool:
    """Whether ``--junitxml`` writes a report this session (the properties below are only
    worth computing then: a verdict of a partial run costs a collection subprocess)."""
    try:
        from _pytest.junitxml import xml_key
    except ImportError:  # a pytest that moved it: add_junit_properties adds nothing either
        return False
    return config.stash.get(xml_key, None) is not None


def add_junit_properties(config: pytest.Config, properties: list[tuple[str, str]]) -> bool:
    """Add test-suite properties to ``--junitxml``'s report, as the
    ``record_testsuite_property`` fixture does (which only a test can request). Must run
    before the JUnit plugin's ``pytest_sessionfinish`` writes the file. False without
    ``--junitxml``."""
    try:
        from _pytest.junitxml import xml_key  # the fixture's own route to the report
    except ImportError:  # a pytest that moved it: the properties are a convenience
        return False
    xml = config.stash.get(xml_key, None)
    if xml is None:
        return False
    for name, value in properties:
        xml.add_global_property(name, value)
    return True


def measure_root_package() -> bool:
    """Re-run the ``kvcheck`` package's ``__init__`` while coverage measures (pytest-cov's
    ``--cov=kvcheck``); True if it did.

    pytest imports its plugins (``kvcheck.plugin.plugin``, so the ``kvcheck`` package too)
    before pytest-cov starts measuring. Coverage counts a source package as measured only
    when a frame of that very module runs under it, so without this ``--cov=kvcheck``
    warns "Module kvcheck was previously imported, but not measured". The package's
    ``__init__`` holds constants only (a test checks it), so running it again changes nothing.
    Call it once coverage has started in this process: on an xdist worker, pytest-cov starts
    at session start.
    """
    coverage = sys.modules.get("coverage")
    current = getattr(getattr(coverage, "Coverage", None), "current", None)
    if current is None or current() is None:
        return False
    root = sys.modules.get("kvcheck")
    if root is None:
        return False
    importlib.reload(root)
    return True
