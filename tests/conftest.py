"""Fixtures shared by the test folders (plain helpers live in ``kv_helpers``)."""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# Bytecode caching on for the Python processes these tests start (hundreds of pytest runs,
# CLIs and servers over the same sources): with PYTHONDONTWRITEBYTECODE set, as CI machines
# often have it, each one compiled kvcheck and rewrote the suite's asserts again, about 2 s a
# start. The variable is dropped here, before xdist starts its workers, so they and every child
# inherit the default; __pycache__ is in .gitignore.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
    sys.dont_write_bytecode = False

# Hypothesis keeps, beside its example database, a cache of the constants it reads from the
# source of the modules under test (`.hypothesis/constants/`, one file per source hash). The
# pytest processes these tests start each run in a fresh folder, so each of them parsed
# kvcheck's ~150 modules again: 0.5 s of CPU a process, against 0.04 s with the cache. The
# checkout's own `.hypothesis` folder (git-ignored, where a run from the root keeps it anyway)
# serves every process of the session, unless the caller chose another. The shipped suite runs
# with database=None, so only that cache is shared with it.
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY",
                      str(Path(__file__).resolve().parents[1] / ".hypothesis"))


# pytester's in-process runs keep the library modules they import, and each starts in a
# data-stack chunk of its own (inner_runs.py says why). Imported here, after the bytecode
# setting above: it imports kvcheck.
from inner_runs import (
    keep_library_modules_across_inline_runs,
    run_inline_runs_in_their_own_stack_chunk,
)

keep_library_modules_across_inline_runs()
run_inline_runs_in_their_own_stack_chunk()


@pytest.fixture
def impl_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) \
        -> Iterator[Callable[[str, str], str]]:
    """``make(name, body)`` writes module ``name`` (``body`` dedented) where it imports, and
    returns ``name`` (for ``--kv-impl``/``load_impl``); the modules are forgotten at the end."""
    made: list[str] = []

    def make(name: str, body: str) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
        made.append(name)
        return name

    monkeypatch.syspath_prepend(str(tmp_path))
    yield make
    for name in made:
        sys.modules.pop(name, None)


def pytest_configure(config: pytest.Config) -> None:
    # Our own suite lists its slowest tests unless asked otherwise (`--durations=N`): CI's log
    # then shows where its minutes go (docs/ci.md), with no extra run.
    if getattr(config.option, "durations", None) is None:
        config.option.durations = 30


#: Files whose tests take most of this suite's worker time (documented commands re-run, whole
#: kvcheck suites run inside a test: about two thirds of it, measured with --durations=0).
#: They are collected first, longest first, so that they start first: run last, one of them
#: kept a worker busy for minutes after the other had finished (the README's doc test alone
#: takes ~2.5 min).
LONG_RUNNING_FIRST = (
    "tests/test_docs.py",
    "tests/plugin/test_verdicts.py",
    "tests/indexers/test_indexers.py",
    "tests/plugin/test_plugin.py",
    "tests/mutants/test_mutants.py",
    "tests/conformance/test_hybrid_area.py",
    "tests/wire/test_serve_record.py",
    "tests/plugin/test_ecosystem_",
    "tests/wire/test_engines.py",
    "tests/designs/test_designs.py",
)


def _start_rank(item: pytest.Item) -> int:
    return next((rank for rank, prefix in enumerate(LONG_RUNNING_FIRST)
                 if item.nodeid.startswith(prefix)), len(LONG_RUNNING_FIRST))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long-running files first, in ``LONG_RUNNING_FIRST``'s order, each file's own order
    kept (a scheduling hint only: every test runs, in any order)."""
    items.sort(key=_start_rank)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """With ``-n`` and no ``--dist`` of the user's, xdist's work-stealing scheduler: each
    worker starts on its half of the collection (the long files in the first), and one that
    runs out takes half of the other's pending tests, so both finish together; the default
    ``load`` scheduler hands out fixed chunks and left one worker idle at the end. None lets
    xdist choose (an explicit ``--dist``)."""
    if config.getoption("dist") != "load" or "--dist" in " ".join(config.invocation_params.args):
        return None
    from xdist.scheduler import WorkStealingScheduling

    return WorkStealingScheduling(config, log)  # type: ignore[arg-type]
