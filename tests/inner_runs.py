"""In-process runs of the shipped suite on an implementation, for the tests that prove the
suite has teeth (``tests/mutants/test_mutants.py``, ``tests/conformance/test_hybrid_area.py``,
``tests/conformance/test_batch_metadata_mutants.py``); importable because pyproject sets
``pythonpath = ["tests"]``.

Such a run wants only the verdict, so Hypothesis runs without its shrink phase: shrinking a
failing workload would take most of a minute (minutes for a multi-group one) and change no
verdict.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest
from hypothesis import Phase, settings

import kvcheck.adapters.reference  # kept imported across the in-process runs
import kvcheck.conformance
import kvcheck.conformance.differential  # kept across the in-process runs

NO_SHRINK = "kvcheck-inner-run-no-shrink"
settings.register_profile(NO_SHRINK, phases=[Phase.explicit, Phase.reuse, Phase.generate])


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
