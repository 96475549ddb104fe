"""The verdict, the per-area terminal summary and the ``--kv-report`` record.

Outcome bookkeeping (reruns, timeouts) lives in ``kvcheck.plugin.outcomes``; ``SessionOutcomes``
and ``area_of`` are re-exported here for code written against kvcheck 0.1.
"""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path

from kvcheck.conformance import SUITE_VERSION
from kvcheck.conformance.loader import ImplHandle
from kvcheck.conformance.protocol import effective_capabilities
from kvcheck.plugin.completeness import RUN_DID_NOT_FINISH, Completeness
from kvcheck.plugin.coverage import Coverage, measure
from kvcheck.plugin.outcomes import SessionOutcomes, area_of
from kvcheck.results.environment import collect_environment
from kvcheck.results.io import OutputPathError, check_output_path, write_records
from kvcheck.results.schema import OUTCOMES, Record, make_conformance_record, validate_record

__all__ = ["SessionOutcomes", "area_of", "check_report_path", "conformance_record", "coverage_of",
           "judge", "render_summary", "verdict", "write_report", "write_unfinished_report"]


def verdict(impl: str, profile: str, counts: dict[str, dict[str, int]],
            completeness: Completeness, flaky: int = 0,
            coverage: Coverage | None = None) -> tuple[bool, str]:
    """(conforms, one line) for the summary and the record.

    A failed (or errored) suite test is proof that the implementation does not conform,
    however much of the suite ran (a test pytest-timeout stopped is not: it did not finish):
    the line then leads with "does NOT conform" and names the failing areas, and a run that
    fell short says how in parentheses (``incomplete run: ran N of M applicable tests;
    reasons``, ``interrupted after N tests``, ``aborted after N tests: reasons``). Without a
    failure, "conforms" needs a complete run: every applicable suite test ran, and none
    failed; a run that fell short is ``incomplete``, and one that was stopped or aborted
    (Ctrl-C, an INTERNALERROR, a session that never finished) gets no verdict at all.
    ``flaky``: tests that passed only after reruns (they count as passed, as in pytest's
    summary, and are named in the line).

    ``coverage`` (``kvcheck.plugin.coverage``): how much the run checked. A complete run
    without failures then states it in parentheses (``conforms to P (N tests ran at block
    sizes ...; laws: conservation n, ...)``), and one whose law families fall short of the
    profile's minimum is ``insufficient coverage`` (not conforming), naming the families and
    what to declare. Failing, incomplete and stopped runs keep their line: the summary and
    the record carry the counts.
    """
    unfinished = Counter(area_of(t) for t in completeness.timed_out)
    failing = [a for a, c in counts.items() if c["failed"] + c["error"] > unfinished[a]]
    tests = _tests(sum(sum(c.values()) for c in counts.values()))
    if failing:
        line = f"{impl} does NOT conform to {profile}: failing areas: {', '.join(failing)}"
        shortfall = _shortfall(completeness, tests)
        return False, f"{line} ({shortfall})" if shortfall else line
    if completeness.interrupted:
        if completeness.reasons == (RUN_DID_NOT_FINISH,):
            return False, f"{impl}: no verdict: {RUN_DID_NOT_FINISH}"
        if "interrupted" in completeness.reasons:  # Ctrl-C
            return False, f"{impl}: interrupted after {tests}: no verdict"
        return False, (f"{impl}: aborted after {tests} ({'; '.join(completeness.reasons)}): "
                       "no verdict")
    if not completeness.complete:
        return False, (f"{impl}: incomplete: {_ran_of(completeness)} "
                       f"({'; '.join(completeness.reasons)})")
    checked = sum(c["passed"] + c["xfailed"] + c["xpassed"] for c in counts.values())
    known = sum(c["xfailed"] for c in counts.values())
    if checked == 0:
        return False, f"{impl}: nothing was checked (every test skipped)"
    short = coverage is not None and bool(coverage.short)
    if coverage is None:
        line = f"{impl} conforms to {profile}"
    elif short:
        line = (f"{impl}: insufficient coverage for {profile} ({coverage.brief()}): "
                f"{coverage.shortfall()}")
    else:
        line = f"{impl} conforms to {profile} ({coverage.brief()})"
    if known:
        deviations = f"{known} known deviation{'s' * (known != 1)} (xfailed)"
        line += f"; {deviations}" if short else f" except {deviations}"
    skipped = sum(c["skipped"] for c in counts.values())
    if skipped:
        line += f"; {skipped} test{'s' * (skipped != 1)} skipped (see below)"
    if flaky:
        line += (f"; {flaky} test{'s' * (flaky != 1)} passed only on rerun (flaky, listed in "
                 "the record)")
    return not short, line


def coverage_of(impl: ImplHandle, profile: str, outcomes: SessionOutcomes) -> Coverage:
    """How much ``impl``'s run checked under ``profile`` (``kvcheck.plugin.coverage``)."""
    return measure(outcomes.facts(impl.name), effective_capabilities(impl.info, profile),
                   profile)


def judge(impl: ImplHandle, profile: str, outcomes: SessionOutcomes,
          completeness: Completeness) -> tuple[bool, str, Coverage]:
    """(conforms, the verdict line, the coverage) of ``impl``'s run: what every output shows.
    ``conforms`` also needs a complete run."""
    coverage = coverage_of(impl, profile, outcomes)
    conforms, line = verdict(impl.name, profile, outcomes.counts(impl.name), completeness,
                             len(outcomes.flaky(impl.name)), coverage)
    return conforms and completeness.complete, line, coverage


def _tests(n: int) -> str:
    return f"{n} test{'s' * (n != 1)}"


def _ran_of(completeness: Completeness) -> str:
    total = "?" if completeness.applicable is None else str(completeness.applicable)
    return f"ran {completeness.ran} of {total} applicable tests"


def _shortfall(completeness: Completeness, tests: str) -> str:
    """How a run with a failure fell short of the whole applicable suite ("" when complete),
    for the parentheses after "does NOT conform": the failure is proof, this is context."""
    if completeness.complete:
        return ""
    reasons = "; ".join(completeness.reasons)
    if completeness.interrupted:
        # The test Ctrl-C stopped reports nothing (pytest re-raises KeyboardInterrupt), so
        # the failures counted all came before it.
        if "interrupted" in completeness.reasons:
            return f"interrupted after {tests}"
        return f"aborted after {tests}: {reasons}"
    return f"incomplete run: {_ran_of(completeness)}" + (f"; {reasons}" if reasons else "")


def render_summary(impl: ImplHandle, profile: str, outcomes: SessionOutcomes,
                   completeness: Completeness) -> list[str]:
    """The rich per-area table and the verdict line, as plain text lines."""
    from rich.console import Console
    from rich.table import Table

    counts = outcomes.counts(impl.name)
    table = Table(title=f"kvcheck conformance: {impl.name} {impl.info.version} ({profile})")
    table.add_column("area")
    for outcome in OUTCOMES:
        table.add_column(outcome, justify="right")
    for area, row in counts.items():
        table.add_row(area, *(str(row[o]) for o in OUTCOMES))
    buf = io.StringIO()
    Console(file=buf, width=100, force_terminal=False, color_system=None).print(table)
    conforms, line, coverage = judge(impl, profile, outcomes, completeness)
    # The shortfall is named only where it decided the verdict ("insufficient coverage").
    shortfall = not conforms and line.startswith(f"{impl.name}: insufficient coverage for ")
    skipped = [f"  skipped {sum(areas.values())} "
               f"({', '.join(f'{a} {n}' for a, n in areas.items())}): {reason}"
               for reason, areas in outcomes.skipped_groups(impl.name)]
    flaky = [f"  flaky (passed on rerun): {test}" for test in outcomes.flaky(impl.name)]
    return (buf.getvalue().rstrip("\n").splitlines()
            + [f"verdict: {line}", *coverage.summary_lines(shortfall=shortfall), *skipped,
               *flaky])


def conformance_record(impl: ImplHandle, profile: str, outcomes: SessionOutcomes,
                       completeness: Completeness, seed: int | None,
                       environment: Mapping[str, object]) -> Record:
    """A validated conformance record for one implementation.

    Tests that were rerun (pytest-rerunfailures) are listed in the record's free-form
    ``extra``: ``extra.reruns`` maps each to its number of reruns, ``extra.flaky`` lists those
    that passed only after a rerun (their outcome is ``passed``: the last attempt decides).
    Its ``coverage`` says how much the run checked (``Coverage.as_record``).
    """
    counts = outcomes.counts(impl.name)
    flaky = outcomes.flaky(impl.name)
    conforms, line, coverage = judge(impl, profile, outcomes, completeness)
    record = make_conformance_record(
        implementation=impl, profile=profile, seed=seed,
        outcomes=dict(sorted(outcomes.by_impl.get(impl.name, {}).items())), areas=counts,
        verdict=line, conforms=conforms,
        complete=completeness.complete, completeness=completeness.as_record(),
        environment=environment, suite_version=SUITE_VERSION,
        coverage=coverage.as_record())
    reruns = outcomes.reruns(impl.name)
    if reruns:
        record["extra"] = {"reruns": reruns, "flaky": flaky}
        validate_record(record, f"conformance record of {impl.name!r}")
    return record


def write_report(path: str, impls: list[ImplHandle], profile_for: Callable[[ImplHandle], str],
                 outcomes: SessionOutcomes, completeness: dict[str, Completeness],
                 seed: int | None) -> Path:
    """Write one record per implementation to ``path`` atomically (JSON Lines); an existing
    file is replaced, as ``--junitxml`` does."""
    environment = collect_environment()
    records = [conformance_record(i, profile_for(i), outcomes, completeness[i.name], seed,
                                  environment) for i in impls]
    return write_records(path, records)


def write_unfinished_report(path: str, impls: list[ImplHandle],
                            profile_for: Callable[[ImplHandle], str], seed: int | None) -> Path:
    """Write, before the first test, the record a session that never ends leaves behind:
    incomplete, interrupted, no verdict (``RUN_DID_NOT_FINISH``). The end of the session
    replaces it; a process that is killed first (pytest-timeout's ``thread`` method, a
    crash, the OOM killer) leaves this, never an earlier run's verdict."""
    unfinished = Completeness(None, 0, (RUN_DID_NOT_FINISH,), interrupted=True)
    return write_report(path, impls, profile_for, SessionOutcomes(),
                        {i.name: unfinished for i in impls}, seed)


def check_report_path(path: str, option: str) -> None:
    """Fail before the run if ``path`` cannot take a record (empty, a folder, under a file,
    an unwritable folder): the same checks as every kvcheck output. A session claims its
    report with ``kvcheck.plugin.outputs.claim_session_output`` (these checks, the other
    outputs and inputs, and the lock); this is the check alone.

    Raises:
        pytest.UsageError: naming the problem and the fix.
    """
    from kvcheck.plugin.outputs import usage_error

    try:
        check_output_path(path, option, example="kvcheck.jsonl")
    except OutputPathError as exc:
        raise usage_error(exc) from None
