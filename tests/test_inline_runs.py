"""pytester's in-process runs keep the library modules they import, and only those
(``inner_runs.keep_library_modules_across_inline_runs``), and each starts in a data-stack chunk
of its own (``inner_runs.run_inline_runs_in_their_own_stack_chunk``); both installed by
``conftest.py``."""

from __future__ import annotations

import importlib
import sys

import pytest
from inner_runs import (
    _OWN_CHUNK_SLOTS,
    _in_own_stack_chunk,
    _library_module,
    inline_runs_have_their_own_stack_chunk,
    keeps_library_modules,
)


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


def test_inline_runs_start_from_a_frame_too_large_for_a_small_stack_chunk(
        pytester: pytest.Pytester) -> None:
    assert inline_runs_have_their_own_stack_chunk()
    # CPython 3.11's rule (Python/pystate.c, push_chunk): a frame that does not fit gets a
    # chunk of the smallest power of two from 16 KiB up holding its slots plus 1 000; what
    # is left of it is the room of the frames the run calls.
    frame = _in_own_stack_chunk.__code__.co_nlocals
    assert frame > _OWN_CHUNK_SLOTS
    chunk = 16 * 2 ** 10
    while chunk < 8 * (frame + 1000):
        chunk *= 2
    assert chunk == 512 * 2 ** 10 and chunk // 8 - frame > 30_000
    assert _in_own_stack_chunk(lambda: 42) == 42
    with pytest.raises(KeyError, match="passed through"):
        _in_own_stack_chunk(lambda: {}["passed through"])
    # The run itself is pytester's, unchanged: its hook recorder comes back.
    pytester.makepyfile(test_one="def test_it():\n    pass\n")
    pytester.inline_run("-p", "no:cacheprovider").assertoutcome(passed=1)
