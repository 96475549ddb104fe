"""The session's state: resolved options, the suite inventory, the collected outcomes, and
the hooks that turn them into the verdict, the ``--kv-report`` record, pytest-html's summary
and JUnit XML properties.

One ``KVSessionState`` per pytest session, in ``config.stash[KV_STATE]``, registered as a
plugin object so its hook methods see every report (on the xdist controller, the reports the
workers send). The record is written twice: before the first test a record saying the run did
not finish (what a killed process leaves), at the end the real one.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvcheck.conformance.forked import is_forked_child
from kvcheck.conformance.loader import DEFAULT_CALL_TIMEOUT, ImplHandle
from kvcheck.plugin.completeness import (
    Completeness,
    SuiteInventory,
    assess,
    inventory_subprocess,
    is_suite_path,
)
from kvcheck.plugin.integrations import (
    add_junit_properties,
    html_verdict,
    junit_properties,
    junit_xml_active,
    measure_root_package,
    start_own_line,
)
from kvcheck.plugin.outcomes import SessionOutcomes
from kvcheck.plugin.report import judge, render_summary, write_report, write_unfinished_report

__all__ = ["KV_STATE", "KVSessionState", "Verdict"]


@dataclass(frozen=True)
class Verdict:
    """One implementation's result, as every output shows it."""

    impl: ImplHandle
    profile: str
    counts: dict[str, dict[str, int]]
    completeness: Completeness
    conforms: bool
    line: str


class KVSessionState:
    """Resolved options, the suite inventory and collected outcomes (see the module
    docstring)."""

    def __init__(self, config: pytest.Config, impls: list[ImplHandle], profile: str | None,
                 max_examples: int, seed: int | None, report_path: str | None,
                 oracle: ImplHandle | None = None, impl_value: str = "",
                 call_timeout: float = DEFAULT_CALL_TIMEOUT,
                 indexer_value: str | None = None) -> None:
        self.config = config
        self.impls = impls
        # The --kv-impl and --kv-indexer texts, for the inventory subprocess.
        self.impl_value = impl_value
        self.indexer_value = indexer_value
        # What kv_pair compares the implementation with (--kv-oracle; the reference by
        # default). None until needed when no implementation is selected.
        self.oracle = oracle
        self.profile_override = profile
        self.max_examples = max_examples
        self.seed = seed
        self.report_path = report_path
        self.outcomes = SessionOutcomes()
        self.selection_warnings: list[str] = []
        # Completeness facts (see kvcheck.plugin.completeness).
        self.inventory: SuiteInventory | None = None
        self.interrupted = False
        self.collect_errors: list[str] = []
        self.worker_crashed = False
        self.crash_failed_the_run = False  # the exit status was raised for a crashed worker
        self.internal_error = False
        self.stop_reason: str | None = None
        # Why a resource limit stopped the session (the memory limit; kvcheck.plugin.resources).
        self.resource_stops: list[str] = []
        self._completeness: dict[str, Completeness] | None = None
        self.call_timeout = call_timeout  # --kv-timeout, for adapters loaded later
        self.written: Path | None = None  # the --kv-report file, once written at the end
        self._finished = False  # pytest_sessionfinish has gathered the facts

    def profile_for(self, impl: ImplHandle) -> str:
        """``--kv-profile`` if given, else the profile the implementation claims."""
        return self.profile_override or impl.info.profile

    @property
    def reports_conformance(self) -> bool:
        """Whether this process prints the verdict and writes the record: an implementation
        was selected, this is not an xdist worker (the controller aggregates), nor a process
        the implementation forked (``kvcheck.conformance.forked``), and the run is not a
        benchmark run (``pytest_kvcheck_bench_active``: benchmark outcomes are no conformance
        verdict)."""
        return (bool(self.impls) and not _is_xdist_worker(self.config)
                and not is_forked_child()
                and not self.config.hook.pytest_kvcheck_bench_active(config=self.config)
                and not self.config.getoption("kv_inventory"))

    # ------------------------------------------------------------------ session start
    @pytest.hookimpl(trylast=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        # trylast: after pytest-cov has started measuring (on an xdist worker it starts here).
        measure_root_package()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> None:
        """Before the first test (collection is over, so a usage error found while
        collecting has not replaced an earlier record): the record of a run that did not
        finish, which the end of the session replaces."""
        if self.reports_conformance and self.report_path:
            write_unfinished_report(self.report_path, self.impls, self.profile_for, self.seed)

    # ------------------------------------------------------------------ outcomes
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = dict(report.user_properties)
        if props.get("kv_suite"):
            self.outcomes.add(report, props)

    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        # Session.Interrupted is pytest's own stop after collection errors, not a Ctrl-C.
        if not isinstance(excinfo.value, pytest.Session.Interrupted):
            self.interrupted = True

    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(
            self, collector: pytest.Collector) -> Generator[None, pytest.CollectReport,
                                                             pytest.CollectReport]:
        # The collector's own path: a report's fspath is relative to a folder that varies.
        report = yield
        path = getattr(collector, "path", None)
        if report.failed and path is not None and is_suite_path(path):
            self.collect_errors.append(Path(path).name)
        return report

    # ------------------------------------------------------------------ xdist controller
    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: object, error: object) -> None:
        """A worker finished: take its inventory (all workers collect the same tests)."""
        if error:
            self.worker_crashed = True
        data = getattr(node, "workeroutput", {}).get("kvcheck_inventory")
        if data is not None and self.inventory is None:
            self.inventory = SuiteInventory.from_wire(data)

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport,
                               sched: object) -> None:
        self.worker_crashed = True

    # ------------------------------------------------------------------ verdicts
    def completeness(self) -> dict[str, Completeness]:
        """Per implementation name; computed once, at the end of the session."""
        if self._completeness is None:
            full = None
            if self.inventory is not None and self.inventory.known \
                    and self.inventory.partial_files:
                full = inventory_subprocess(self.impl_value, self.profile_override,
                                            _import_path_env(self.impls),
                                            indexer_value=self.indexer_value)
            self._completeness = {
                impl.name: assess(
                    impl.name, self.inventory, full, self.outcomes.reported(impl.name),
                    interrupted=self.interrupted, stop_reason=self.stop_reason,
                    worker_crashed=self.worker_crashed, internal_error=self.internal_error,
                    timed_out=self.outcomes.timed_out(impl.name),
                    resource_stops=self.resource_stops)
                for impl in self.impls
            }
        return self._completeness

    def verdicts(self) -> list[Verdict]:
        """Each implementation's verdict; valid once the session has finished."""
        completeness = self.completeness()
        result = []
        for impl in self.impls:
            profile = self.profile_for(impl)
            comp = completeness[impl.name]
            conforms, line, _ = judge(impl, profile, self.outcomes, comp)
            result.append(Verdict(impl, profile, self.outcomes.counts(impl.name), comp,
                                  conforms, line))
        return result

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter,
                                exitstatus: int) -> None:
        if not self.reports_conformance or exitstatus == pytest.ExitCode.USAGE_ERROR:
            return  # a usage error already said what is wrong; nothing ran
        completeness = self.completeness()
        start_own_line(terminalreporter)
        for impl in self.impls:
            for line in render_summary(impl, self.profile_for(impl), self.outcomes,
                                       completeness[impl.name]):
                terminalreporter.write_line(line)
        for message in self.selection_warnings:
            terminalreporter.write_line(f"kvcheck warning: {message}", yellow=True)
        if self.crash_failed_the_run:
            terminalreporter.write_line(
                "kvcheck: exit status 1: an xdist worker crashed, so the run is incomplete "
                "even though every reported test passed", red=True)
        if self.written is not None:  # said here, after the progress line has ended
            terminalreporter.write_line(f"kvcheck: result record written to {self.written}")

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """Gather how the session ended before any plugin reports it (pytest-html's summary
        and the JUnit XML file are produced in their own ``pytest_sessionfinish``)."""
        workeroutput = getattr(self.config, "workeroutput", None)
        if isinstance(workeroutput, dict) and self.inventory is not None:
            # An xdist worker: hand the inventory to the controller.
            workeroutput["kvcheck_inventory"] = self.inventory.to_wire()
        if self.worker_crashed and self.impls and session.exitstatus == pytest.ExitCode.OK:
            # A crashed worker's test can pass on a rerun (pytest-rerunfailures), leaving
            # exit 0 though the tests the worker had left were lost: the verdict says
            # incomplete, and the exit status must not say otherwise.
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
            self.crash_failed_the_run = True
        if not self.reports_conformance or exitstatus == pytest.ExitCode.USAGE_ERROR:
            return
        self.internal_error = exitstatus == pytest.ExitCode.INTERNAL_ERROR
        stop = session.shouldfail or session.shouldstop
        self.stop_reason = stop if isinstance(stop, str) and stop else None
        self._finished = True
        # The verdict is computed when something reads it (the terminal summary, the record,
        # pytest-html, the JUnit properties here): a partial run's completeness collects the
        # whole suite in a subprocess, which a run that reports nothing (an in-process run
        # without the terminal reporter, as kvcheck's own mutant tests make) does not pay.
        if junit_xml_active(self.config):
            properties = [p for v in self.verdicts()
                          for p in junit_properties(v.impl.name, v.line, v.conforms,
                                                    v.completeness.complete)]
            add_junit_properties(self.config, properties)

    @pytest.hookimpl(trylast=True, optionalhook=True)
    def pytest_html_results_summary(self, prefix: list[str]) -> None:
        """pytest-html (``--html``): the verdict and the per-area table atop its summary
        (only ``prefix`` is taken: pytest-html 3 passes no ``session``)."""
        if not self._finished:
            return
        prefix.extend(
            html_verdict(f"kvcheck conformance: {v.impl.name} {v.impl.info.version} "
                         f"({v.profile})", v.line, v.conforms, v.counts)
            for v in self.verdicts())

    def write_record(self) -> None:
        """Write the ``--kv-report`` record (replacing the one written before the first test)."""
        if self._finished and self.report_path:
            self.written = write_report(self.report_path, self.impls, self.profile_for,
                                        self.outcomes, self.completeness(), self.seed)


class _RecordWriter:
    """Writes the record last, once every other plugin's ``pytest_sessionfinish`` has run
    (a plugin object of its own: one object cannot implement a hook twice)."""

    def __init__(self, state: KVSessionState) -> None:
        self.state = state

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self) -> None:
        self.state.write_record()
        # Every test is over: end what the implementations keep running (an exec: engine's
        # process), before the leftover-process warning looks.
        for impl in [*self.state.impls, self.state.oracle]:
            if impl is not None:
                impl.close()


def register(config: pytest.Config, state: KVSessionState) -> None:
    """Put ``state`` in ``config.stash[KV_STATE]`` and register its hooks."""
    config.stash[KV_STATE] = state
    config.pluginmanager.register(state, "kvcheck-session")
    config.pluginmanager.register(_RecordWriter(state), "kvcheck-record")


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _import_path_env(impls: list[ImplHandle]) -> dict[str, str]:
    """``PYTHONPATH`` with the folders the implementations were imported from first, so a
    child pytest imports the same modules (an adapter found in the current folder too)."""
    roots: list[str] = []
    for impl in impls:
        file = getattr(impl.module, "__file__", None)
        if not file:
            continue
        root = Path(file).resolve().parent
        depth = impl.module.__name__.count(".") + (Path(file).stem == "__init__")
        for _ in range(depth):
            root = root.parent
        if str(root) not in roots:
            roots.append(str(root))
    existing = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join(roots + ([existing] if existing else []))}


KV_STATE = pytest.StashKey[KVSessionState]()
