"""Adapters that hang, flood or leak (issue 23 item 3): the memory limit, forks of adapter
calls, threads and child processes left running, and the bounds of every numeric option.

The cases that need a real process (memory, threads, forks) run pytest in a subprocess under
a hard timeout; the option bounds are usage errors of in-process runs."""

from __future__ import annotations

import gc
import json
import os
import threading
import time
from pathlib import Path

import pytest
from kv_helpers import reference_capabilities_source

from kvcheck.conformance.call_limit import CallLimit
from kvcheck.conformance.guard import GuardedManager
from kvcheck.conformance.memory_limit import (
    MemoryLimitExceeded,
    MemoryWatch,
    machine_memory,
    parse_size,
    resident_bytes,
)
from kvcheck.conformance.protocol import KVCacheSpec

_CAPS = reference_capabilities_source("_R.capabilities", drop={"block_pool"})
#: A hard limit on each subprocess run: a case that hangs (the non-daemon thread kept pytest
#: alive forever) fails on it. Each case takes 3-15 s on an idle 2-core machine; the margin is
#: for a loaded CI machine (wall time is not asserted: these machines are shared and noisy).
_HARD_TIMEOUT = 120


def adapter(name: str, body: str) -> str:
    """An adapter module: the reference, named ``name``, with ``body`` (a ``class M``)."""
    return f"""
import os, sys, threading, time
from kvcheck.adapters.reference import IMPL_INFO as _R, ReferenceManager
from kvcheck.conformance.protocol import ImplInfo
IMPL_INFO = ImplInfo({name!r}, "0", {_CAPS})
{body}
def make_kv_cache_manager(spec):
    return M(spec)
"""


def run(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, float]:
    start = time.perf_counter()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args,
                                           timeout=_HARD_TIMEOUT)
    return result, time.perf_counter() - start


# --------------------------------------------------------------------------- memory
LEAKY = adapter("leaky", """
KEPT = []
class M(ReferenceManager):
    def allocate_slots(self, *args, **kwargs):
        KEPT.append(b"\\1" * (10 << 20))  # 10 MiB a call, written (resident), never freed
        return super().allocate_slots(*args, **kwargs)
""")
#: Sets --kv-max-memory to the process's RSS + 100 MiB, measured where the plugin checks it.
RSS_PLUS_100M = """
import pytest
from kvcheck.conformance.memory_limit import resident_bytes

@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    config.option.kv_max_memory = f"{(resident_bytes() >> 20) + 100}M"
"""


def test_memory_growth_fails_the_test_and_stops_the_session(pytester: pytest.Pytester) -> None:
    """An adapter that keeps 10 MiB per call: past RSS + 100 MiB the test fails naming the
    growth and the call, the session stops cleanly, the verdict and the record say
    incomplete because of the memory limit."""
    pytester.makepyfile(leaky_impl=LEAKY)
    pytester.makeconftest(RSS_PLUS_100M)
    result, _ = run(pytester, "--kv-impl=leaky_impl", "--kv-report=r.jsonl",
                       "-k", "allocation or prefix_caching")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    out = result.stdout.str()
    result.stdout.fnmatch_lines([
        ("*MemoryLimitExceeded: memory limit: the test process's memory (resident set) grew "
        "from * MiB at the start of the session to * MiB, past --kv-max-memory=*M (* MiB);*"
        "The session stops here (an incomplete run).*"),
        ("verdict: leaky does NOT conform to vllm-0.33: *(incomplete run: *stopped by the "
        "memory limit: *"),
        "! kvcheck: the test process's memory (resident set) grew from * !",
    ])
    assert "was not made" in out or "seen after the test's last adapter call" in out
    outcomes = result.parseoutcomes()
    assert outcomes["failed"] == 1, outcomes
    record = json.loads((pytester.path / "r.jsonl").read_text())
    assert record["conforms"] is False and record["complete"] is False
    assert any(r.startswith("stopped by the memory limit: the test process's memory")
               for r in record["completeness"]["reasons"])


def test_memory_watch_diverts_guarded_calls_and_gives_them_back() -> None:
    class Fake:
        def num_free_blocks(self) -> int:
            return 3

    mgr = GuardedManager(Fake(), impl="fake", spec=KVCacheSpec(num_blocks=4, block_size=4),
                         reserved=(0,), limit=CallLimit(5, "fake"))
    watch = MemoryWatch(1 << 30, "--kv-max-memory=1G")
    watch.start_rss = 100 << 20
    try:
        watch.trip(2 << 30)
        with pytest.raises(MemoryLimitExceeded, match=(
                r"memory limit: the test process's memory \(resident set\) grew from 100 MiB at "
                r"the start of the session to 2048 MiB, past --kv-max-memory=1G; it was passed "
                r"between adapter calls; this call, fake.num_free_blocks\(\), was not made")):
            mgr.num_free_blocks()
        assert watch.refused is not None and "fake.num_free_blocks()" in watch.refused
    finally:
        watch.stop()
    assert mgr.num_free_blocks() == 3


def test_sizes() -> None:
    assert parse_size("4096") == 4096 << 20
    assert parse_size("512M") == parse_size("512MiB") == parse_size("512mb") == 512 << 20
    assert parse_size("1.5G") == 3 << 29
    assert parse_size("0") == 0
    assert parse_size("9" * 40) >= 1 << 80  # beyond any machine, refused by the bound
    for bad in ("", "-1", "1e3", "nan", "inf", "4 X", "G"):
        with pytest.raises(ValueError, match="is not a size"):
            parse_size(bad)


# --------------------------------------------------------------------------- leftovers
LEFT_RUNNING = adapter("lefty", """
STARTED = []
def spin():
    while True:
        time.sleep(0.05)
class M(ReferenceManager):
    def __init__(self, spec):
        super().__init__(spec)
        if not STARTED:
            import subprocess
            STARTED.append(threading.Thread(target=spin, name="spin-forever"))
            STARTED.append(threading.Thread(target=spin, name="quiet", daemon=True))
            for t in STARTED:
                t.start()
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            with open("child.pid", "a") as f:  # every process that built one, one a line
                f.write(f"{child.pid}\\n")
""")


def test_threads_and_children_left_running_are_named_and_do_not_keep_pytest_alive(
        pytester: pytest.Pytester) -> None:
    """A non-daemon thread the factory starts used to keep pytest alive forever after the
    verdict; now it is named, and the process ends with pytest's exit status (1 here: a
    user's own failing test)."""
    pytester.makepyfile(lefty_impl=LEFT_RUNNING, test_mine="def test_mine():\n    assert 0\n")
    try:
        result, _ = run(pytester, "--kv-impl=lefty_impl", "-k",
                           "test_first_allocation or test_mine", "test_mine.py",
                           "--pyargs", "kvcheck.conformance")
    finally:
        pid_file = pytester.path / "child.pid"
        children = [int(p) for p in pid_file.read_text().split()] if pid_file.exists() else []
        for pid in children:
            os.kill(pid, 9)
    assert len(children) == 1, "one session process built the adapter"
    child = children[0]
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        ("kvcheck warning: 2 thread(s) started during the session are still running: "
        "'spin-forever' (non-daemon, runs lefty_impl.spin), 'quiet' (daemon, runs "
        "lefty_impl.spin); kvcheck does not wait for them*"),
        (f"kvcheck warning: 1 child process(es) started during the session are still running: "
        f"pid {child} (*time.sleep(60)*); they are left running*"),
    ])
    result.stderr.fnmatch_lines([
        ("kvcheck: not waiting for what the implementation left running ('spin-forever' "
        "(non-daemon, runs lefty_impl.spin)): ending the process with pytest's exit status 1"),
    ])


# --------------------------------------------------------------------------- forks
FORKY = adapter("forky", """
FORKED = set()
def fork_once(where):
    if where in FORKED:
        return
    FORKED.add(where)
    pid = os.fork()
    if pid:
        with open(f"{where}.pid", "w") as f:
            f.write(str(pid))
def exits_itself():
    with open("mp-child-ran", "w") as f:
        f.write("ok")
class M(ReferenceManager):
    def __init__(self, spec):
        if "mp" not in FORKED:  # a fork that exits on its own is left alone
            FORKED.add("mp")
            import multiprocessing
            p = multiprocessing.get_context("fork").Process(target=exits_itself)
            p.start()
            p.join()
        fork_once("factory")
        super().__init__(spec)
    def allocate_slots(self, *args, **kwargs):
        fork_once("allocate_slots")
        return super().allocate_slots(*args, **kwargs)
""")


def test_child_pids_survive_a_thread_ending_and_a_kernel_without_children_files(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """CI once lost the leftover-child warning: a timer thread ended between listing
    ``/proc/self/task`` and reading its ``children`` file, and the whole answer was dropped.
    Now a vanished task is skipped, and with no readable ``children`` file at all the parent
    field of every ``/proc/PID/stat`` answers."""
    import subprocess
    import sys

    from kvcheck.plugin import resources

    if not Path("/proc/self/task").is_dir():
        pytest.skip("needs Linux /proc")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        real_iterdir = Path.iterdir

        def with_a_vanished_task(self: Path):  # one more task, gone before it is read
            listed = list(real_iterdir(self))
            return iter([self / "999999999", *listed] if self.name == "task" else listed)

        monkeypatch.setattr(Path, "iterdir", with_a_vanished_task)
        assert child.pid in resources.child_pids()

        real_read_text = Path.read_text

        def no_children_files(self: Path, *args, **kwargs):
            if self.name == "children":
                raise FileNotFoundError(self)
            return real_read_text(self, *args, **kwargs)

        monkeypatch.setattr(Path, "read_text", no_children_files)
        assert child.pid in resources.child_pids()
    finally:
        child.kill()
        child.wait()


def test_forked_children_never_run_the_session(pytester: pytest.Pytester) -> None:
    """An adapter that forks in its factory (and in a call) used to run the session twice and
    write the report twice; each child is now ended as the forking call returns, saying so,
    and only the process that started the session prints the verdict and writes the record.
    A fork that runs its own work and exits (multiprocessing) is left alone."""
    pytester.makepyfile(forky_impl=FORKY)
    result, _ = run(pytester, "--kv-impl=forky_impl", "--kv-report=r.jsonl",
                       "-k", "test_first_allocation")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    err = result.stderr.str()
    for where in ("make_kv_cache_manager", "allocate_slots"):
        child = pytester.path / ("factory.pid" if where == "make_kv_cache_manager"
                                 else "allocate_slots.pid")
        pid = int(child.read_text())
        assert f"kvcheck: process {pid}, forked by forky.{where} in the pytest process " in err
        assert (f"returned into the pytest session (as forky.{where} returned); ending it "
                "(exit status 1)") in err
        assert _not_running(pid)
    assert err.count("kvcheck: process ") == 2
    out = result.stdout.str()
    assert out.count("verdict: forky") == 1 and out.count("result record written") == 1
    assert len((pytester.path / "r.jsonl").read_text().splitlines()) == 1
    assert (pytester.path / "mp-child-ran").read_text() == "ok"


def _not_running(pid: int) -> bool:
    """Whether ``pid`` has ended (gone, or a zombie waiting for its parent)."""
    for _ in range(50):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


# --------------------------------------------------------------------------- option bounds
def usage_error(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    result = pytester.runpytest("-p", "no:cacheprovider", "--kv-impl=reference", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    assert "Traceback" not in result.stderr.str()
    assert "passed" not in result.stdout.str(), "nothing may run before the error"
    return result


@pytest.mark.parametrize(("option", "message"), [
    (f"--kv-max-examples={10**23}",
     f"*--kv-max-examples={10**23}: must be >= 1 and <= 1000000 (10^6)*"),
    ("--kv-max-examples=1000001", "*--kv-max-examples=1000001: must be >= 1 and <= 1000000*"),
    (f"--kv-max-examples={'9' * 4000}",
     "*--kv-max-examples=<a 4000-digit number>: must be >= 1 and <= 1000000*"),
    ("--kv-seed=-1", "*--kv-seed=-1: must be >= 0 and <= 9223372036854775807 (2^63 - 1)*"),
    (f"--kv-seed={2**63}", f"*--kv-seed={2**63}: must be >= 0 and <= 9223372036854775807*"),
    ("--kv-timeout=1e12", "*--kv-timeout=1e+12: must be at most 86400 seconds (a day)*"),
    ("--kv-timeout=86401", "*--kv-timeout=86401: must be at most 86400 seconds*"),
    ("--kv-max-memory=lots", ("*--kv-max-memory=lots: 'lots' is not a size: give MiB (4096) or "
                             "a number with a unit (512M, 4G, 1.5GiB), or 0 for no limit*")),
    ("--kv-max-memory=-5", "*--kv-max-memory=-5: '-5' is not a size*"),
    ("--kv-max-memory=1M", ("*--kv-max-memory=1M: must be between * MiB and * MiB (above the "
                           "* MiB this process holds now, at most this machine's memory)*")),
    ("--kv-max-memory=4096T", "*--kv-max-memory=4096T: must be between * MiB and * MiB*"),
])
def test_numeric_options_out_of_bounds_are_refused(pytester: pytest.Pytester, option: str,
                                                    message: str) -> None:
    result = usage_error(pytester, option)
    result.stderr.fnmatch_lines([message, "*Fix: *"])


def test_memory_limit_bounds_name_this_machine(pytester: pytest.Pytester) -> None:
    total = machine_memory()
    rss = resident_bytes()
    assert total is not None and rss is not None
    result = usage_error(pytester, f"--kv-max-memory={(total >> 20) + 1}")
    result.stderr.fnmatch_lines([f"*and {total / (1 << 20):.0f} MiB (above the*",
                                 f"*default: half the machine's memory, {total / 2**21:.0f} MiB*"])


@pytest.mark.parametrize(("option", "message"), [
    ("--kv-bench-scale=1e300", "--kv-bench-scale: 1e300 is not a finite number in (0, 64] ("),
    ("--kv-bench-scale=inf", "--kv-bench-scale: inf is not a finite number in (0, 64] ("),
    ("--kv-bench-scale=nan", "--kv-bench-scale: nan is not a finite number in (0, 64] ("),
    (f"--kv-bench-seed={2**63}",
     f"--kv-bench-seed: {2**63} is not an int in [0, 2^63-1] (a workload seed)"),
    ("--kv-bench-rounds=1000000000",
     ("--kv-bench-rounds: 1000000000 is not an int in [1, 10000] (timed rounds per "
      "benchmark); Fix: e.g. --kv-bench-rounds=5")),
    (f"--kv-bench-warmup={'9' * 5000}",
     f"--kv-bench-warmup: {'9' * 40}... is not an int in [0, 1000] ("),
    ("--kv-bench-peak-gbps=1e9",
     "--kv-bench-peak-gbps: 1e9 is not a finite number in (0, 100000] ("),
])
def test_benchmark_numeric_options_out_of_bounds_are_refused(
        pytester: pytest.Pytester, option: str, message: str) -> None:
    """Refused at parse time (exit 4) by the benchmark commands' argument types: the value
    (cut to 40 characters), the range, what it counts and a good value."""
    result = pytester.runpytest("-p", "no:cacheprovider", option)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


def test_bounds_are_accepted_at_the_edges(pytester: pytest.Pytester) -> None:
    """The largest values are accepted (collect-only: nothing runs)."""
    result = pytester.runpytest("-p", "no:cacheprovider", "--kv-impl=reference",
                                "--kv-max-examples=1000000", f"--kv-seed={2**63 - 1}",
                                "--kv-timeout=86400", "--kv-max-memory=0", "--kv-bench-scale=64",
                                "--kv-bench-rounds=10000", "--kv-bench-warmup=1000",
                                "--collect-only", "-q",
                                "-k", "test_first_allocation")
    assert result.ret == pytest.ExitCode.OK, result.stderr.str()



STOPPABLE = adapter("stoppable", """
STARTED = []
def spin(stop):
    while not os.path.exists(stop):
        time.sleep(0.02)
class M(ReferenceManager):
    def __init__(self, spec):
        super().__init__(spec)
        if not STARTED:
            STARTED.append(threading.Thread(target=spin, name="in-process-spin",
                                            args=(os.path.abspath("stop"),)))
            STARTED[0].start()
""")
CONSOLE_PROBE = """
from pathlib import Path
from kvcheck.plugin.resources import _console_session

def pytest_configure(config):
    Path("console.txt").write_text(str(_console_session()))
"""


def test_an_in_process_run_warns_but_never_ends_the_process(pytester: pytest.Pytester) -> None:
    """pytester's in-process runs share this process: a leftover thread is named, but the
    process is never ended for it (only pytest's own command line is)."""
    pytester.makepyfile(stoppable_impl=STOPPABLE)
    pytester.makeconftest(CONSOLE_PROBE)
    pytester.syspathinsert()
    try:
        result = pytester.runpytest("-p", "no:cacheprovider", "--kv-impl=stoppable_impl",
                                    "-k", "test_first_allocation")
    finally:
        (pytester.path / "stop").write_text("")
        for thread in threading.enumerate():
            if thread.name == "in-process-spin":
                thread.join(timeout=5)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([("kvcheck warning: 1 thread(s) started during the session "
                                  "are still running: 'in-process-spin' (non-daemon, *")])
    assert (pytester.path / "console.txt").read_text() == "False"


# --------------------------------------------------------------------------- the collector
FREEZE_PROBE = """
import gc, json
from pathlib import Path

def test_probe():
    Path("frozen.json").write_text(json.dumps(gc.get_freeze_count()))
"""
BENCH_ACTIVE = """
def pytest_kvcheck_bench_active(config):
    return True
"""
#: Registered before kvcheck's own exit hook (at configure, kvcheck's at the end of
#: collection), so it runs after it: what is frozen when the interpreter finalizes.
AT_EXIT_PROBE = """
import atexit, gc
from pathlib import Path

def pytest_configure(config):
    out = Path(__file__).parent / "at_exit.txt"
    atexit.register(lambda: out.write_text(str(gc.get_freeze_count())))
"""


@pytest.mark.parametrize("where", ["console", "in-process", "benchmark run"])
def test_what_collection_leaves_alive_is_frozen_for_the_run(pytester: pytest.Pytester,
                                                           where: str) -> None:
    """The objects alive at the end of collection are out of the collector's generations
    while the tests run (``gc.freeze``); an in-process session gives them back at its end
    (this process's own objects included), pytest's command line at interpreter exit (left
    frozen, Triton's extension objects were reported as leaked at exit). A benchmark run
    freezes them too: the full collection before each of its rounds then walks only what
    the rounds made."""
    pytester.makepyfile(test_probe=FREEZE_PROBE)
    if where == "benchmark run":
        pytester.makeconftest(BENCH_ACTIVE)
    if where == "console":
        pytester.makeconftest(AT_EXIT_PROBE)
    args = ("-p", "no:cacheprovider", "--kv-impl=reference", "test_probe.py")
    assert gc.get_freeze_count() == 0
    if where == "console":
        result, _ = run(pytester, *args)
    else:
        result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.OK
    frozen = json.loads((pytester.path / "frozen.json").read_text())
    assert frozen > 10_000  # the modules, the collected test, kvcheck's tables...
    assert gc.get_freeze_count() == 0  # given back (in-process), or another process's
    if where == "console":
        assert (pytester.path / "at_exit.txt").read_text() == "0"


def test_a_collect_only_run_freezes_nothing(pytester: pytest.Pytester) -> None:
    """No test runs under --collect-only (the inventory child of every partial run), so the
    freeze and the full collection before it would be pure cost."""
    pytester.makeconftest("""
import gc, json
from pathlib import Path

def pytest_sessionfinish(session):
    Path(__file__).with_name("frozen.json").write_text(json.dumps(gc.get_freeze_count()))
""")
    result, _ = run(pytester, "--collect-only", "-q", "--kv-impl=reference")
    assert result.ret == pytest.ExitCode.OK
    assert json.loads((pytester.path / "frozen.json").read_text()) == 0
