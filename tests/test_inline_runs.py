"""pytester's in-process runs keep the library modules they import, and only those
(``inner_runs.keep_library_modules_across_inline_runs``, installed by ``conftest.py``)."""

from __future__ import annotations

import importlib
import sys

import pytest
from inner_runs import _library_module, keeps_library_modules


def test_inline_runs_keep_library_modules_and_drop_the_tests_own(
        pytester: pytest.Pytester) -> None:
    # Installed by conftest.py (a pytest release that renamed pytester's snapshot method
    # fails here, rather than making every in-process run slower unnoticed).
    assert keeps_library_modules()
    pytester.makepyfile(written_by_the_test="X = 1")
    pytester.makepyfile(test_user="import colorsys\nimport written_by_the_test\n\n"
                                  "def test_it():\n    assert written_by_the_test.X == 1\n")
    pytester.syspathinsert()
    sys.modules.pop("colorsys", None)  # a standard-library module the run imports first
    pytester.inline_run("-p", "no:cacheprovider").assertoutcome(passed=1)
    assert "colorsys" in sys.modules, "a library module the run imported was dropped"
    assert "written_by_the_test" not in sys.modules
    assert "test_user" not in sys.modules


@pytest.mark.parametrize(("name", "kept"), [
    ("hypothesis.internal.conjecture.engine", True),  # a library (site-packages)
    ("json.decoder", True),                           # the standard library
    ("kvcheck.conformance.recorded", True),
    ("kvcheck.conformance.test_recorded", False),     # a suite module: collected afresh
    ("conformance.test_recorded", False),
    ("kvcheck.conformance.conftest", False),
])
def test_which_modules_are_kept(name: str, kept: bool) -> None:
    if not name.startswith(("kvcheck.conformance.", "conformance.")):
        importlib.import_module(name)  # so that its file is known
    assert _library_module(name) is kept
