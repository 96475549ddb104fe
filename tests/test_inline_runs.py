"""pytester's in-process runs keep the library modules they import, and only those
(``inner_runs.keep_library_modules_across_inline_runs``), and each starts in a data-stack chunk
of its own (``inner_runs.run_inline_runs_in_their_own_stack_chunk``); both installed by
``conftest.py``. Nothing keeps a finished run alive: neither Hypothesis's cache of the modules
it read, nor typing's overloads (``inner_runs.release_dropped_modules``), nor the run's plugin
manager (``inner_runs.unlink_hook_recorder``), nor ``kv_helpers``' shared runs."""

from __future__ import annotations

import importlib
import sys
import typing
from typing import Any
from unittest import mock

import kv_helpers
import pytest
from inner_runs import (
    _OWN_CHUNK_SLOTS,
    _in_own_stack_chunk,
    _library_module,
    inline_runs_have_their_own_stack_chunk,
    keeps_library_modules,
    releases_dropped_modules,
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


def test_inline_runs_leave_no_dropped_module_in_hypothesis_constants_cache(
        pytester: pytest.Pytester) -> None:
    # Hypothesis reads the constants of each local module a test run has imported, caching
    # them by module: a dropped test module (and through its loader, the run's config,
    # plugin manager and hook recorder) would stay alive in that cache.
    from hypothesis.internal.constants_ast import constants_from_module
    assert releases_dropped_modules()
    pytester.makepyfile(constants_here="LIMIT = 987_654_321\n")
    pytester.makepyfile(test_drawing="import constants_here\n"
                                     "from hypothesis import given, strategies as st\n\n"
                                     "@given(st.integers())\n"
                                     "def test_it(n):\n"
                                     "    assert constants_here.LIMIT\n")
    pytester.syspathinsert()
    seen: list[int] = []

    class SeeTheCache:
        def pytest_runtest_teardown(self) -> None:  # the run's module still imported here
            seen.append(constants_from_module.cache_info().currsize)

    pytester.inline_run("-p", "no:cacheprovider", plugins=[SeeTheCache()]) \
        .assertoutcome(passed=1)
    assert seen and seen[0] > 0, "the run's Hypothesis test read no local module's constants"
    assert "constants_here" not in sys.modules
    assert constants_from_module.cache_info().currsize == 0


def test_a_shared_run_keeps_only_its_lines(pytester: pytest.Pytester) -> None:
    # kv_helpers keeps a shared run for the whole session: with its in-process run's hook
    # recorder, every hook call, report and traceback of that run would stay alive with it.
    def make(pt: pytest.Pytester) -> tuple[pytest.RunResult, str, str]:
        pt.makepyfile(test_two="def test_a():\n    pass\n\ndef test_b():\n    assert 0\n")
        result = pt.runpytest("-p", "no:cacheprovider")
        assert hasattr(result, "reprec")  # pytester's in-process result, as plain_full_run's
        return result, '{"kind": "placeholder"}\n', ""

    with mock.patch.object(kv_helpers, "_one_record", return_value={}):
        shared = kv_helpers._shared_run(pytester, make)
    assert not hasattr(shared.result, "reprec")
    shared.result.assert_outcomes(passed=1, failed=1)
    assert shared.result.ret == pytest.ExitCode.TESTS_FAILED


def test_inline_runs_unlink_their_recorder_and_forget_their_overloads(
        pytester: pytest.Pytester) -> None:
    # A module an in-process run imported first and kept (a library's, kvcheck's) keeps the
    # run's config through its loader, and the config reached the run's hook recorder; and
    # typing kept the dropped test module's @overload definitions (and so the module).
    pytester.makepyfile(test_overloads="from typing import overload\n\n"
                                       "@overload\ndef f(x: int) -> int: ...\n"
                                       "@overload\ndef f(x: str) -> str: ...\n"
                                       "def f(x):\n    return x\n\n"
                                       "def test_it():\n    assert f(1) == 1\n")
    grabbed: list[Any] = []

    class Grab:
        def pytest_collection_finish(self, session: pytest.Session) -> None:
            module = session.items[0].module  # type: ignore[attr-defined]
            grabbed.append(module.f)
            assert len(typing.get_overloads(module.f)) == 2  # registered while it runs

    rec = pytester.inline_run("-p", "no:cacheprovider", plugins=[Grab()])
    rec.assertoutcome(passed=1)  # the test still reads its run
    assert not hasattr(rec._pluginmanager, "reprec")
    assert typing.get_overloads(grabbed[0]) == []
