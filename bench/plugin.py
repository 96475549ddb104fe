"""kvcheck's benchmark plugin (pytest11 entry point ``kvcheck-bench``), built on pytest-benchmark.

::

    pytest --kv-impl=reference --kv-bench                 # allocator on the CPU; kernels: CUDA
    pytest --kv-impl=mypkg.adapter --kv-bench --kv-bench-scale=4 --kv-bench-report=out.jsonl
    pytest --kv-impl=reference --kv-bench --kv-bench-device=cpu   # time the torch references
    pytest --kv-impl=reference --kv-bench --benchmark-json=pb.json -k scheduler

Every option lives here (loaded before argument parsing, so ``--pyargs`` works too). With
``--kv-bench`` and no test paths the installed ``kvcheck.bench`` folder is collected; its
``bench_*.py`` files are collected by ``pytest_collect_file`` below, whatever ``python_files``
says.

The two plugins cooperate only through the hooks of ``kvcheck.plugin.hooks``: this plugin
answers ``pytest_kvcheck_bench_active`` (so under ``--kv-bench`` the conformance plugin leaves
the test paths to it, prints no verdict and writes no record) and asks
``pytest_kvcheck_profiles`` for the profile its records name. The benchmarks use the
conformance plugin's ``kv_impl`` / ``kv_reference`` fixtures, pytest-benchmark's ``benchmark``
fixture and ``kv_bench`` (the ``BenchSession``). At the end the plugin prints one table per
group, and with ``--kv-bench-report`` writes kvcheck result records (``kind="benchmark"``, raw
samples, environment with GPU, driver, CUDA, torch, triton, CPU and the kvcheck commit);
pytest-benchmark's own ``--benchmark-json`` carries the same figures in ``extra_info`` and the
same machine details (``pytest_benchmark_update_machine_info``).
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Generator
from pathlib import Path

import pytest

from kvcheck.bench.cli_args import float_in
from kvcheck.bench.options import (
    PLUGIN_PREFIX,
    add_report_option,
    add_rounds_option,
    add_scale_option,
    add_seed_option,
    add_warmup_option,
)
from kvcheck.bench.session import BenchOptions, BenchSession
from kvcheck.errors import KVCheckInputError
from kvcheck.plugin.hooks import add_hookspecs

__all__ = ["BENCH_STATE", "BenchState"]

_BENCH_DIR = Path(__file__).resolve().parent
_PB_COLUMNS = ["min", "median", "iqr", "max", "rounds"]


# The numeric options are bounded at parse time (exit 4, naming the bound); the options the
# tools share are declared once, in kvcheck.bench.options, with the tools' bounds.
#: 100 TB/s, over ten times today's fastest HBM.
_MAX_PEAK_GBPS = 100_000.0
_peak_gbps = float_in(0.0, _MAX_PEAK_GBPS, "GB/s of DRAM bandwidth", "--kv-bench-peak-gbps=4800",
                      low_open=True)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvcheck-bench", "kvcheck benchmarks (needs pytest-benchmark)")
    add = group.addoption
    add("--kv-bench", action="store_true", default=False,
        help="run kvcheck's benchmarks (with no test paths: the installed kvcheck.bench suite) "
             "against --kv-impl; allocator benchmarks on the CPU, kernel benchmarks on CUDA")
    add_scale_option(add, prefix=PLUGIN_PREFIX, note="the allocator workloads; the whole run "
                     "takes well under a minute on 2 cores with the reference")
    add_seed_option(add, prefix=PLUGIN_PREFIX)
    add_rounds_option(add, default=None, per="benchmark", unit="rounds", prefix=PLUGIN_PREFIX,
                      default_text="5 allocator, 30 CUDA kernel, 3 CPU kernel")
    add_warmup_option(add, default=None, per="benchmark", unit="rounds", prefix=PLUGIN_PREFIX,
                      default_text="1 allocator, 5 CUDA kernel")
    add("--kv-bench-device", choices=("auto", "cuda", "cpu"), default="auto",
        help="kernel benchmarks' device: auto (CUDA if present, else skipped), cuda, or cpu "
             "(times only the torch references, labelled cpu)")
    add("--kv-bench-l2", choices=("cold", "warm"), default="cold",
        help="L2 before each timed kernel call: cold (flushed, the default) or warm; recorded")
    add("--kv-bench-peak-gbps", type=_peak_gbps, default=None, metavar="GBPS",
        help="theoretical DRAM bandwidth to report %% of peak against, at most 10^5 (default: "
             "from the driver's memory clock and bus width)")
    add("--kv-bench-workload", action="append", default=[], metavar="NAME|trace:PATH",
        help="time the scheduler benchmark (test_scheduler) on this workload instead of the "
             "built-in scenarios: a scenario name, or trace:PATH for a request trace file "
             "(JSON Lines: explicit tokens, Mooncake-style hash_ids, or lengths; see kvcheck "
             "bench trace --help); repeat for several")
    add_report_option(add, prefix=PLUGIN_PREFIX, what="one record per implementation / kernel "
                      "provider, with raw samples and the full environment,")


def _options(config: pytest.Config) -> BenchOptions:
    return BenchOptions(
        enabled=bool(config.getoption("kv_bench", False)),
        scale=config.getoption("kv_bench_scale", 1.0),
        seed=config.getoption("kv_bench_seed", 0),
        rounds=config.getoption("kv_bench_rounds", None),
        warmup=config.getoption("kv_bench_warmup", None),
        device=config.getoption("kv_bench_device", "auto"),
        l2=config.getoption("kv_bench_l2", "cold"),
        peak_gbps=config.getoption("kv_bench_peak_gbps", None),
        report=config.getoption("kv_bench_report", None),
        workloads=tuple(config.getoption("kv_bench_workload", None) or ()),
    )


class BenchState:
    """The session object (``config.stash[BENCH_STATE]``), registered for its hooks."""

    def __init__(self, config: pytest.Config, options: BenchOptions) -> None:
        self.config = config
        self.session = BenchSession(options)
        self.skipped: dict[str, int] = {}  # skip reason -> benchmarks

    @property
    def is_xdist_worker(self) -> bool:
        return hasattr(self.config, "workerinput")

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        o = self.session.options
        if not o.enabled:
            return []
        return [(f"kvcheck-bench: scale={o.scale:g} seed={o.seed} "
                 f"rounds={o.rounds or 'default'} "
                 f"warmup={o.warmup if o.warmup is not None else 'default'} "
                 f"device={o.device} l2={o.l2} report={o.report or '-'}")]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and _is_bench_nodeid(report.nodeid) and isinstance(
                report.longrepr, tuple):
            reason = str(report.longrepr[2]).removeprefix("Skipped: ")
            self.skipped[reason] = self.skipped.get(reason, 0) + 1

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> Generator[None, object, object]:
        # Before pytest-benchmark writes its JSON: cross-provider ratios into extra_info.
        self.session.finalize()
        self.session.close()
        result = yield
        report = self.session.options.report
        if report and not self.is_xdist_worker and self.session.results:
            path = self.write_report(report)
            terminal = self.config.pluginmanager.get_plugin("terminalreporter")
            if terminal is not None:
                terminal.write_line(f"kvcheck-bench: result records written to {path}")
        return result

    def write_report(self, report: str) -> Path:
        """Write the result records to ``report`` (``--kv-bench-report``), atomically."""
        from kvcheck.bench.measure.machine import kvcheck_commit
        from kvcheck.results.environment import collect_environment
        from kvcheck.results.io import write_records

        environment = {**collect_environment(), "kvcheck_commit": kvcheck_commit()}
        options = dataclasses.asdict(self.session.options)
        if options.get("report"):  # the file name only: no machine paths in shared records
            options["report"] = Path(options["report"]).name
        extra = {"options": options,
                 "kernel_device": self.session.device_info(),
                 "skipped": dict(self.skipped)}
        records = self.session.records(_profile(self.config), environment, extra)
        return write_records(report, records)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.is_xdist_worker or not (self.session.results or self.session.options.enabled):
            return
        from kvcheck.bench.table import render_tables

        self.session.finalize()
        lines = render_tables(self.session.results, self.session.device_info())
        if lines:
            terminalreporter.section("kvcheck benchmarks", sep="=")
        for line in lines:
            terminalreporter.write_line(line)
        for reason, count in sorted(self.skipped.items()):
            terminalreporter.write_line(f"kvcheck-bench: {count} skipped: {reason}")


def _is_bench_nodeid(nodeid: str) -> bool:
    return "bench_" in nodeid.split("::", 1)[0]


def _profile(config: pytest.Config) -> str:
    """The records' profile: the first ``--kv-impl``'s active profile, as the conformance
    plugin answers ``pytest_kvcheck_profiles`` (vllm-0.33 when nothing answers)."""
    profiles = config.hook.pytest_kvcheck_profiles(config=config)
    return next(iter(profiles.values())) if profiles else "vllm-0.33"


BENCH_STATE = pytest.StashKey[BenchState]()


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    """Declare the hooks shared with the conformance plugin (``kvcheck.plugin.hooks``)."""
    add_hookspecs(pluginmanager)


def pytest_kvcheck_bench_active(config: pytest.Config) -> bool:
    """``--kv-bench``: this session runs the benchmarks, not a conformance check."""
    return bool(config.getoption("kv_bench"))


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """Checks and pytest-benchmark defaults, before any plugin's ``pytest_configure`` (so
    before pytest-benchmark builds its session from the options)."""
    if not config.getoption("kv_bench", False):
        return
    if not (config.pluginmanager.hasplugin("benchmark")
            or config.pluginmanager.hasplugin("pytest_benchmark.plugin")):
        raise pytest.UsageError(
            "kvcheck: --kv-bench needs pytest-benchmark\n"
            "  Fix: pip install 'kvcheck[bench]' (and do not pass -p no:benchmark)")
    if getattr(config.option, "numprocesses", None):
        raise pytest.UsageError(
            "kvcheck: --kv-bench runs benchmarks one at a time; pytest-benchmark disables "
            "itself under xdist\n  Fix: drop -n / --numprocesses for benchmark runs")
    if getattr(config.option, "benchmark_columns", "unset") is None:
        config.option.benchmark_columns = list(_PB_COLUMNS)


def pytest_configure(config: pytest.Config) -> None:
    # With --kv-bench the conformance plugin leaves config.args alone
    # (pytest_kvcheck_bench_active), so the order of the two pytest_configure does not matter.
    options = _options(config)
    state = BenchState(config, options)
    config.stash[BENCH_STATE] = state
    config.pluginmanager.register(state, "kvcheck-bench-session")
    if not options.enabled:
        return
    try:
        state.session.check_workloads()
    except KVCheckInputError as exc:
        fix = getattr(exc, "fix", "")  # a TraceFileError's fix gets its own line
        problem = getattr(exc, "problem", str(exc)) if fix else str(exc)
        raise pytest.UsageError(f"kvcheck: --kv-bench-workload: {problem}"
                                + (f"\n  Fix: {fix}" if fix else "")) from None
    if options.report is not None and not state.is_xdist_worker:
        _claim_report(config, options)
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        # `pytest --kv-impl=X --kv-bench` with no paths runs the shipped benchmarks.
        config.args = [str(_BENCH_DIR)]


def _claim_report(config: pytest.Config, options: BenchOptions) -> None:
    """``--kv-bench-report``, checked and locked before any benchmark runs (a folder, an
    unwritable place, a trace file it would replace, the same file as ``--kv-report``, a
    report another run is writing: a usage error now, not a traceback after the run)."""
    from kvcheck.bench.workload.source import is_trace_workload, trace_path
    from kvcheck.plugin.outputs import claim_session_output

    traces = {f"--kv-bench-workload={v}": trace_path(v) for v in options.workloads
              if is_trace_workload(v)}
    claim_session_output(config, options.report or "", "--kv-bench-report",
                         example="bench.jsonl", inputs=traces)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    """Collect ``bench_*.py`` of the kvcheck.bench folder (``python_files`` need not list
    them); files pytest collects anyway (explicit paths, matching patterns) are left to it."""
    if not (file_path.name.startswith("bench_") and file_path.suffix == ".py"):
        return None
    try:
        if file_path.resolve().parent != _BENCH_DIR:
            return None
    except OSError:
        return None
    if parent.session.isinitpath(file_path):
        return None
    if any(fnmatch.fnmatch(file_path.name, pattern)
           for pattern in parent.config.getini("python_files")):
        return None
    return pytest.Module.from_parent(parent, path=file_path)


@pytest.hookimpl(trylast=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``test_scheduler``'s ``scenario``: the ``--kv-bench-workload`` values when given (ids:
    scenario names, ``trace:<file name>``), else every built-in scenario. ``trylast``: after
    the suite plugin's ``kv_impl``, so ids read ``test_scheduler[<impl>-<scenario>]``."""
    if (metafunc.definition.name != "test_scheduler"
            or metafunc.definition.path.name != "bench_allocator.py"
            or "scenario" not in metafunc.fixturenames):
        return
    from kvcheck.bench.workload.scenarios import SCENARIOS
    from kvcheck.bench.workload.source import is_trace_workload, trace_path

    chosen = metafunc.config.getoption("kv_bench_workload", None) or list(SCENARIOS)
    metafunc.parametrize("scenario", chosen, ids=[
        f"trace:{trace_path(v).name}" if is_trace_workload(v) else v for v in chosen])


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(config: pytest.Config,
                                         machine_info: dict[str, object]) -> None:
    """GPU, driver, CUDA, torch, triton and the kvcheck commit in pytest-benchmark's JSON."""
    state = config.stash.get(BENCH_STATE, None)
    if state is None or not state.session.results:
        return
    from kvcheck.bench.measure.machine import kvcheck_commit
    from kvcheck.results.environment import collect_environment

    env = collect_environment()
    machine_info["kvcheck"] = {
        "hardware_key": env["hardware_key"], "gpu": env.get("gpu_model"),
        "driver": env.get("driver"), "cuda": env.get("cuda"), "torch": env.get("torch"),
        "triton": env.get("triton"), "cpu": env.get("cpu"), "commit": kvcheck_commit(),
        "kernel_device": state.session.device_info(),
    }


@pytest.fixture(scope="session")
def kv_bench(pytestconfig: pytest.Config) -> BenchSession:
    """The benchmark session: options, workloads, baselines, the kernel device, results."""
    return pytestconfig.stash[BENCH_STATE].session
