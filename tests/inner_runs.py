"""In-process runs of the shipped suite on an implementation, for the tests that prove the
suite has teeth (``tests/mutants/test_mutants.py``, ``tests/conformance/test_hybrid_area.py``,
``tests/conformance/test_batch_metadata_mutants.py``); importable because pyproject sets
``pythonpath = ["tests"]``.

Such a run wants only the verdict, so Hypothesis runs without its shrink phase: shrinking a
failing workload would take most of a minute (minutes for a multi-group one) and change no
verdict.
"""

from __future__ import annotations

import sys
import sysconfig
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import pytest
from _pytest import pytester as _pytester
from hypothesis import Phase, settings

import kvcheck.conformance

_T = TypeVar("_T")

NO_SHRINK = "kvcheck-inner-run-no-shrink"
settings.register_profile(NO_SHRINK, phases=[Phase.explicit, Phase.reuse, Phase.generate])


#: pytester's private method taking the ``sys.modules`` snapshot of an in-process run.
_TAKE_SNAPSHOT = "_Pytester__take_sys_modules_snapshot"
_LIBRARY_DIRS = tuple({sysconfig.get_paths()[key]
                       for key in ("stdlib", "platstdlib", "purelib", "platlib")})


def _library_module(name: str) -> bool:
    """Whether ``name`` is a module of an installed library or of kvcheck (not a test module,
    nor one a test wrote): what an in-process run may leave imported for the next one."""
    if name.rsplit(".", 1)[-1].startswith(("test_", "conftest")):
        return False
    if name.startswith("kvcheck."):
        return True
    file = getattr(sys.modules.get(name), "__file__", None) or ""
    return file.startswith(_LIBRARY_DIRS)


def _snapshot_keeping_library_modules(self: pytest.Pytester) -> _pytester.SysModulesSnapshot:
    return _pytester.SysModulesSnapshot(preserve=_library_module)


def keep_library_modules_across_inline_runs() -> None:
    """Make pytester's in-process runs keep the library modules they import.

    ``Pytester.inline_run`` puts ``sys.modules`` back as it was after each run, so every
    in-process run of the suite imported again what the previous one had imported first:
    about 80 Hypothesis modules, 46 of rich (the verdict table), and kvcheck's goldens, corpus
    reader and workload machine, whose caches (the decoded corpus) went with them. Measured:
    a whole-suite run in process took 8.3-8.9 s, 7.0-7.3 s keeping them; a one-area run 1.45
    s, 1.25 s (hundreds of such runs in this suite). Test modules and the modules tests write
    (implementations, mutants) are still dropped after each run, as pytester intends.

    pytester has no option for it: its private snapshot method is replaced. Where a pytest
    release renamed it, nothing is replaced (the runs are only slower) and
    ``tests/test_inline_runs.py`` fails on ``keeps_library_modules()``."""
    if hasattr(_pytester.Pytester, _TAKE_SNAPSHOT) and hasattr(_pytester, "SysModulesSnapshot"):
        setattr(_pytester.Pytester, _TAKE_SNAPSHOT, _snapshot_keeping_library_modules)


def keeps_library_modules() -> bool:
    """Whether pytester's in-process runs keep the library modules (installed above)."""
    return getattr(_pytester.Pytester, _TAKE_SNAPSHOT, None) is \
        _snapshot_keeping_library_modules


#: Frame slots (locals) of ``_in_own_stack_chunk``: CPython allocates a frame that does not
#: fit the current data-stack chunk a new chunk of the smallest power of two at least
#: ``8 * (slots + 1000)`` bytes, here 512 KiB, about half of it left for the frames called
#: from it (some 33 000 slots: a stack many times deeper than a test run's).
_OWN_CHUNK_SLOTS = 31_800


def _make_own_chunk_caller() -> Callable[[Callable[[], _T]], _T]:
    """``call(fn)``: ``fn()`` from a frame of ``_OWN_CHUNK_SLOTS`` locals (never assigned:
    the dead branch only declares them), which gets a data-stack chunk of its own."""
    names = " = ".join(f"_{i}" for i in range(_OWN_CHUNK_SLOTS))
    namespace: dict[str, object] = {}
    exec(compile(f"def call(fn):\n    if False:\n        {names} = None\n    return fn()\n",
                 "<inner_runs: own data-stack chunk>", "exec"), namespace)
    return namespace["call"]  # type: ignore[return-value]


_in_own_stack_chunk = _make_own_chunk_caller()
_INLINE_RUN = _pytester.Pytester.inline_run

try:  # Hypothesis's cache of the constants it read in each local module, keyed by the module
    from hypothesis.internal.constants_ast import constants_from_module as _MODULE_CONSTANTS
except ImportError:  # a Hypothesis release that moved it: nothing to release
    _MODULE_CONSTANTS = None


def release_dropped_modules() -> None:
    """Let go of the modules an in-process run imported and pytester dropped after it.

    Hypothesis reads the constants of every local module it has not seen (by ``id``) and
    keeps them in an LRU cache keyed by the module object. A test module an in-process run
    imported stays in that cache after pytester drops it from ``sys.modules``, and with it
    its globals and its ``__loader__``, the run's assertion-rewriting hook: the run's whole
    config, plugin manager and hook recorder (every report and traceback of the run). With
    the other roots (``unlink_hook_recorder``, Hypothesis's machine classes, ``kv_helpers``'
    shared run), ``tests/plugin/test_verdicts.py`` alone left 1.26 million objects alive at
    its end (0.66 million without them), each of the worker's full collections walking them.
    A module Hypothesis has seen is never read again, so the cache serves no later lookup:
    emptying it costs nothing.

    ``typing`` keeps the ``@overload`` definitions of every module by name (for
    ``typing.get_overloads``, which nothing here calls): a dropped module's stay there, and
    with them that module; they are cleared too."""
    cache_clear = getattr(_MODULE_CONSTANTS, "cache_clear", None)
    if cache_clear is not None:
        cache_clear()
    typing.clear_overloads()


def releases_dropped_modules() -> bool:
    """Whether ``release_dropped_modules`` finds Hypothesis's cache to empty."""
    return callable(getattr(_MODULE_CONSTANTS, "cache_clear", None))


def unlink_hook_recorder(rec: _pytester.HookRecorder) -> None:
    """Take ``rec`` off its run's plugin manager (``pluginmanager.reprec``, set by pytester).

    A module the run imported first and that stays imported (kvcheck's, a library's) keeps
    its loader, the run's assertion-rewriting hook, and so the run's config and plugin
    manager: through this attribute, every hook call, report and traceback of the run (100
    000 objects for a whole-suite run) for as long as the process lives. The test reading
    the run holds the recorder itself."""
    pluginmanager = getattr(rec, "_pluginmanager", None)
    if pluginmanager is not None and getattr(pluginmanager, "reprec", None) is rec:
        del pluginmanager.reprec


def _inline_run_in_own_stack_chunk(self: pytest.Pytester, *args: Any,
                                   **kwargs: Any) -> _pytester.HookRecorder:
    try:
        rec = _in_own_stack_chunk(lambda: _INLINE_RUN(self, *args, **kwargs))
        unlink_hook_recorder(rec)
        return rec
    finally:
        release_dropped_modules()


def run_inline_runs_in_their_own_stack_chunk() -> None:
    """Make each in-process run start at the bottom of a large data-stack chunk of its own.

    CPython 3.11 keeps frames in 16 KiB chunks, allocated with ``mmap`` when a call does not
    fit the current one and unmapped as soon as the first frame of a chunk returns. A hot
    call that sits on a chunk boundary so maps and unmaps a chunk (and faults its pages in)
    at every call. The depth an in-process run starts at (the outer test's stack, plus
    pytester's hook recorder: pluggy's ``traced_hookexec``, ``Result.from_call`` and a lambda)
    put the suite's hot paths (hashing, the guarded ``allocate_slots``) on such a boundary:
    measured on ``tests/plugin/test_verdicts.py``, 18.4 s of system time (22 000 ``mmap`` and
    as many ``munmap`` per whole-suite run, against 1 800 from a command line) and a
    whole-suite run half as fast again as from a command line. Run from a chunk with room
    for any test's stack, no call crosses a boundary. ``tests/test_inline_runs.py`` checks
    it is installed.

    After each run, ``unlink_hook_recorder`` and ``release_dropped_modules``."""
    _pytester.Pytester.inline_run = _inline_run_in_own_stack_chunk  # type: ignore[method-assign]


def inline_runs_have_their_own_stack_chunk() -> bool:
    """Whether ``run_inline_runs_in_their_own_stack_chunk`` is installed."""
    return _pytester.Pytester.inline_run is _inline_run_in_own_stack_chunk


class NoShrinkProfile:
    """Inner-run plugin: the no-shrink Hypothesis profile during the run (the suite's
    ``kv_settings`` inherit every field they do not set from it), the previous profile
    afterwards."""

    def __init__(self) -> None:
        self.previous = settings.get_current_profile_name()

    def pytest_configure(self, config: pytest.Config) -> None:
        settings.load_profile(NO_SHRINK)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        settings.load_profile(self.previous)


class NoTracebacks:
    """Inner-run plugin: failures reported without their tracebacks' source (``--tb=no``'s
    style, set directly: that option belongs to the terminal reporter, which ``run_area``
    leaves out). A run that only reads outcomes spent more time formatting a failing
    implementation's tracebacks than running it."""

    def pytest_configure(self, config: pytest.Config) -> None:
        config.option.tbstyle = "no"


class AreaOutcome(NamedTuple):
    """One area run: its failed and passed test functions (names without parameters), and
    how many tests it skipped."""

    failed: set[str]
    passed: set[str]
    skipped: int


def run_area(pytester: pytest.Pytester, area_file: Path, impl: str, *args: str,
             path: Path | None = None, option: str = "--kv-impl") -> AreaOutcome:
    """Run one suite module (an area) in-process on ``--kv-impl=impl`` (or another
    ``option``: ``--kv-indexer``) with ``args``, no shrinking, and ``path`` (default:
    pytester's folder) on ``sys.path`` for the implementation's import. The checkout's
    pytest settings are not used (an empty ini), nor the terminal reporter (the verdict, and
    the whole-suite inventory it would collect, are not needed: with no summary, record or
    JUnit file to write, the plugin computes no verdict, so such a run starts no child
    pytest), nor failure tracebacks (``NoTracebacks``)."""
    ini = pytester.makeini("[pytest]\n")
    pytester.syspathinsert(path)
    rec = pytester.inline_run(f"{option}={impl}", *args, "-p", "no:cacheprovider",
                              "-p", "no:terminal", "-c", str(ini), str(area_file),
                              plugins=[NoShrinkProfile(), NoTracebacks()])
    passed, skipped, failed = rec.listoutcomes()
    assert passed or failed, f"{impl}: nothing ran"

    def functions(reports: list[pytest.TestReport]) -> set[str]:
        return {r.nodeid.split("::")[-1].split("[")[0] for r in reports}

    return AreaOutcome(functions(failed), functions(passed), len(skipped))


#: The shipped suite's modules, and the hand-written mutants the area tests load by name.
SUITE = Path(kvcheck.conformance.__file__).resolve().parent
MUTANTS_DIR = Path(__file__).resolve().parent / "mutants"
#: ``tests/mutants/test_mutants.py``'s examples per random test in a mutant run.
MUTANT_MAX_EXAMPLES = 15


def run_suite_file(pytester: pytest.Pytester, file: str, impl: str, profile: str,
                   only: set[str] | None = None) -> AreaOutcome:
    """Run the suite module ``file`` (``conformance/<file>``) on ``impl`` (the reference, or
    a mutant of ``tests/mutants/``) under ``profile`` at the mutant-run settings; ``only``:
    just these test functions."""
    select = ("-k", " or ".join(sorted(only))) if only else ()
    return run_area(pytester, SUITE / file, impl, f"--kv-profile={profile}",
                    f"--kv-max-examples={MUTANT_MAX_EXAMPLES}", *select, path=MUTANTS_DIR)


def assert_mutant_fails(pytester: pytest.Pytester, mutant: str,
                        must_fail: set[tuple[str, str]], profile: str) -> None:
    """Each ``(suite file, test function)`` of ``must_fail`` fails on ``mutant`` under
    ``profile`` (others may fail too): one run per file, of just those functions."""
    for file in sorted({f for f, _ in must_fail}):
        wanted = {t for f, t in must_fail if f == file}
        failed = run_suite_file(pytester, file, mutant, profile, only=wanted).failed
        assert wanted <= failed, (
            f"{mutant}: {file}: {sorted(wanted - failed)} passed, but must fail (failed: "
            f"{sorted(failed)})")


def assert_mutants_listed(prefix: str, listed: dict[str, set[tuple[str, str]]]) -> None:
    """Each ``tests/mutants/<prefix>*.py`` has an entry in ``listed``, and vice versa."""
    files = {p.stem for p in MUTANTS_DIR.glob(f"{prefix}*.py")}
    assert files == set(listed), (sorted(files), sorted(listed))
