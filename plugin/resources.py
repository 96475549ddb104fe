"""The test process's resources in a pytest session (issue 23 item 3): the memory limit, the
forks of adapter calls, and the threads and child processes an implementation leaves behind.

``configure_resources(config)`` (from the plugin's ``pytest_configure``, before the
implementations are loaded) checks ``--kv-max-memory`` (a usage error names the bounds),
watches forks (``kvcheck.conformance.forked``) and notes the threads and child processes that
exist already; ``ResourceWatch.start(state)``, once the session state exists, starts the
``MemoryWatch`` of a run with implementations and registers the hooks:

* **memory**: a test during which the limit was passed fails (the adapter call that was
  refused says so; if none was, the test fails at its end), its report carries the reason
  (``kv_resource_stop``, so an xdist controller learns it too), the session stops after it
  (``session.shouldfail``: exit status 1, the test failed) and the verdict is incomplete,
  the record saying why (``KVSessionState.resource_stops``; a limit passed after the last
  test's calls still makes the run incomplete);
* **forks**: a process forked inside an adapter call is ended as that call returns
  (``kvcheck.conformance.forked``); any other fork that runs on into the session is ended at
  the next session hook (a test, a report, the end of the session), before it can print or
  write anything;
* **the garbage collector**: what is alive once collection ends (the shipped recorded corpus,
  the collected tests, the imported modules: most of the process's objects) is moved out of
  the collector's generations (``gc.freeze``): the collections that the run's hundreds of
  thousands of adapter calls trigger no longer walk it again and again (a whole-suite run of
  the reference without kernels: 6.9 s instead of 8.8 s, with the corpus decoded with the
  collector paused, then moved to the oldest generation unwalked). From pytest's command line
  a collection of the young generations runs first (the garbage collection made is not frozen;
  a full one would walk the corpus, 0.17 s), and the objects are given back at interpreter
  exit (``gc.unfreeze`` in an ``atexit`` hook), after pytest's own last collections, which
  skip them: the interpreter's final collection then frees them as it did before (left
  frozen, extension modules such as Triton's reported them as leaked). An in-process
  session (``pytester``, ``pytest.main()`` from a program) skips that first collection (its
  caller's heap made it cost up to a second) and gives everything back at its end
  (``gc.unfreeze`` in ``pytest_unconfigure``, the caller's objects too). A benchmark run
  too: its rounds still decide when the collector runs (``bench.measure.timing.collector_off``:
  a full collection before each round, the collector off inside), and that full collection
  no longer walks Torch's and pytest's objects, which no round made and none frees (a
  scaled-down ``--kv-bench`` run of the reference's allocator: 1.7 s instead of 9.2 s, at
  the default scale 17.5 s instead of 32.5 s);
* **leftovers**: threads started during the session and still running at its end (kvcheck's
  own and the test tools' aside) and child processes still running are named in a warning
  of the terminal summary. When pytest runs from its command line (``pytest``, ``python -m
  pytest``; not an in-process ``pytester`` run, nor ``pytest.main()`` from a program, whose
  process is its caller's), a non-daemon thread or ``multiprocessing`` child still running at
  interpreter exit would keep the process alive forever: a ``threading`` exit hook (which
  runs before Python joins those threads) then says so on the standard error and ends the
  process with pytest's exit status, its output flushed (other ``atexit`` handlers do not
  run then).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import sys
import threading
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from kvcheck.conformance import forked
from kvcheck.conformance.memory_limit import (
    MemoryLimitExceeded,
    MemoryWatch,
    default_limit,
    machine_memory,
    mib,
    parse_size,
    resident_bytes,
)
from kvcheck.conformance.short_repr import short_repr
from kvcheck.errors import KVCheckInputError

if TYPE_CHECKING:
    from kvcheck.plugin.state import KVSessionState

__all__ = ["RESOURCE_STOP", "ResourceWatch", "configure_resources", "memory_limit_option"]

#: The user property a test's report carries when the memory limit stopped the session.
RESOURCE_STOP = "kv_resource_stop"
#: Threads of these modules are the test tools' own (pytest, xdist's execnet, kvcheck).
_TOOL_MODULES = ("_pytest", "pytest", "pluggy", "execnet", "xdist", "kvcheck.conformance",
                 "kvcheck.plugin", "coverage", "pytest_cov")
#: At least this much room above the memory the process holds when the session starts.
_MIN_HEADROOM = 16 << 20


def memory_limit_option(config: pytest.Config) -> int:
    """``--kv-max-memory`` in bytes (0: off), its default when not given.

    Raises:
        pytest.UsageError: not a size, or outside (RSS now + 16 MiB, this machine's memory].
    """
    text = config.getoption("kv_max_memory")
    if text is None:
        return default_limit() if resident_bytes() is not None else 0
    flag = f"--kv-max-memory={text}"
    try:
        limit = parse_size(str(text))
    except KVCheckInputError as exc:
        raise pytest.UsageError(f"kvcheck: {flag}: {exc}\n  Fix: e.g. --kv-max-memory=8G, "
                                "or --kv-max-memory=0 for no limit") from None
    if limit == 0:
        return 0
    rss = resident_bytes()
    if rss is None:
        raise pytest.UsageError(
            f"kvcheck: {flag}: this platform does not show a process's memory (no /proc, no "
            "getrusage)\n  Fix: leave the option out or pass --kv-max-memory=0")
    total = machine_memory()
    low = rss + _MIN_HEADROOM
    if limit < low or (total is not None and limit > total):
        room = f"between {mib(low)} and {mib(total)}" if total else f"at least {mib(low)}"
        raise pytest.UsageError(
            f"kvcheck: {flag}: must be {room} (above the {mib(rss)} this process holds now, "
            "at most this machine's memory)\n"
            f"  Fix: pass a limit in that range (default: half the machine's memory, "
            f"{mib(default_limit())}), or 0 for no limit")
    return limit


def configure_resources(config: pytest.Config) -> ResourceWatch:
    """Check ``--kv-max-memory`` and start watching forks, threads and children (see the
    module doc); ``start`` the returned watch once the session state exists."""
    limit = memory_limit_option(config)
    capture = config.pluginmanager.get_plugin("capturemanager")
    forked.watch_forks(None if capture is None
                       else lambda: capture.suspend_global_capture(in_=False))
    return ResourceWatch(config, limit, _console_session())


class ResourceWatch:
    """The session's hooks for memory, forks and leftovers (see the module doc)."""

    def __init__(self, config: pytest.Config, limit: int, console: bool) -> None:
        self.config = config
        self.limit = limit
        self.console = console
        self.state: KVSessionState | None = None
        self.memory: MemoryWatch | None = None
        self.session: pytest.Session | None = None
        self.threads_before = {t.ident for t in threading.enumerate()}
        self.children_before = set(child_pids())
        self.reported = False  # the memory stop was noted in a report
        self.frozen = False  # gc.freeze() was called at the end of collection

    def start(self, state: KVSessionState) -> None:
        """In a run with implementations (nothing otherwise: a project that merely has
        kvcheck installed is left alone): start the memory limit, register the hooks."""
        self.state = state
        if not state.impls:
            return
        given = self.config.getoption("kv_max_memory")
        if self.limit and not self.config.getoption("collectonly"):
            option = (f"--kv-max-memory={given} ({mib(self.limit)})" if given is not None
                      else f"--kv-max-memory (default {mib(self.limit)}: half the machine's "
                           "memory)")
            self.memory = MemoryWatch(self.limit, option)
            self.memory.start()
        self.config.pluginmanager.register(self, "kvcheck-resources")

    def _no_forked_child(self, at: str) -> None:
        if forked.is_forked_child():
            forked.end_forked_child(at)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self._no_forked_child("the start of the session")
        self.session = session

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        # Not for --collect-only (the inventory child of a partial run): no test would gain.
        if not self.frozen and not self.config.getoption("collectonly"):
            if self.console:  # unfrozen only at exit: freeze no garbage made by collection
                gc.collect(1)  # the young generations: the oldest holds the recorded corpus
                atexit.register(gc.unfreeze)
            gc.freeze()
            self.frozen = True

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, object, object]:
        self._no_forked_child(f"the test {item.nodeid}")
        result = yield
        memory = self.memory
        # Stop once a test has failed for the limit (passed after a test's calls, the limit
        # fails the next test, whose calls are refused).
        if memory is not None and memory.growth is not None and self.reported \
                and not item.session.shouldfail:
            item.session.shouldfail = f"kvcheck: {memory.growth}"
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, object, object]:
        """A test during which the memory limit was passed fails with ``MemoryLimitExceeded``:
        the refused call's message, which whatever the test made of it (a mismatch, a
        Hypothesis "flaky" error) is chained to; or, when no call was refused, at its end."""
        memory = self.memory
        failure: BaseException | None = None
        result: object = None
        try:
            result = yield
        except Exception as exc:  # noqa: BLE001 - re-raised below unless the limit explains it
            failure = exc
        finally:  # a skip or an exit too: the report says why the session stops
            if memory is not None and memory.growth is not None and not self.reported:
                self.reported = True
                item.user_properties.append((RESOURCE_STOP, memory.record_reason))
        if memory is None or memory.growth is None:
            if failure is not None:
                raise failure
            return result
        if isinstance(failure, MemoryLimitExceeded):
            raise failure
        raise MemoryLimitExceeded(memory.refused or memory.failure(None)) from failure

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._no_forked_child(f"the report of {report.nodeid}")
        stops = self.state.resource_stops if self.state is not None else []
        for name, value in report.user_properties:
            if name == RESOURCE_STOP and value not in stops:
                stops.append(str(value))

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> Generator[None, None, None]:
        """Before anyone reports: no forked child goes on, and a limit passed after the last
        test's calls still makes the run incomplete."""
        self._no_forked_child("the end of the session")
        memory = self.memory
        if memory is not None and memory.growth is not None and not self.reported \
                and self.state is not None:
            self.reported = True
            self.state.resource_stops.append(memory.record_reason)
        return (yield)

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if hasattr(self.config, "workerinput"):
            return
        for line in self.leftover_lines():
            terminalreporter.write_line(f"kvcheck warning: {line}", yellow=True)

    # ------------------------------------------------------------------ leftovers
    def leftover_threads(self) -> list[threading.Thread]:
        """Threads started during the session, still running, not the test tools' own."""
        return [t for t in threading.enumerate()
                if t.ident not in self.threads_before and t.is_alive()
                and not _thread_origin(t).startswith(_TOOL_MODULES)]

    def leftover_children(self) -> list[int]:
        """Child processes started during the session and still running."""
        return [pid for pid in child_pids() if pid not in self.children_before]

    def leftover_lines(self) -> list[str]:
        """The terminal summary's warnings about what is left running."""
        lines = []
        threads = self.leftover_threads()
        if threads:
            shown = ", ".join(_thread_text(t) for t in threads)
            lines.append(
                f"{len(threads)} thread(s) started during the session are still running: "
                f"{shown}; kvcheck does not wait for them (an adapter should stop the threads "
                "it starts, or make them daemon threads)")
        children = self.leftover_children()
        if children:
            shown = ", ".join(f"pid {pid} ({_command(pid)})" for pid in children)
            lines.append(
                f"{len(children)} child process(es) started during the session are still "
                f"running: {shown}; they are left running (an adapter should end the "
                "processes it starts)")
        return lines

    def _blockers(self) -> list[str]:
        """What would keep the interpreter from exiting: non-daemon threads left running
        and ``multiprocessing`` children it would join."""
        found = [_thread_text(t) for t in self.leftover_threads() if not t.daemon]
        mp = sys.modules.get("multiprocessing")
        if mp is not None:
            found += [f"multiprocessing child pid {p.pid}" for p in mp.active_children()
                      if not p.daemon]
        return found

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self.frozen and not self.console:  # in-process: the caller's objects can be freed
            self.frozen = False
            gc.unfreeze()
        if self.memory is not None:
            self.memory.stop()
        session = self.session
        if not self.console or session is None or forked.is_forked_child() \
                or not self._blockers():
            return
        status = int(session.exitstatus)
        register = getattr(threading, "_register_atexit", None)
        if register is not None:
            register(lambda: self._end_if_blocked(status))

    def _end_if_blocked(self, status: int) -> None:
        """At interpreter exit, before Python joins non-daemon threads: if something left
        running would block the exit, end the process with pytest's exit status."""
        blockers = self._blockers()
        if not blockers:
            return
        message = (f"kvcheck: not waiting for what the implementation left running "
                   f"({', '.join(blockers)}): ending the process with pytest's exit status "
                   f"{status}\n")
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        with contextlib.suppress(OSError):
            os.write(2, message.encode("utf-8", "replace"))
        os._exit(status)


def _console_session() -> bool:
    """Whether this session is pytest's command line (``pytest``, ``python -m pytest``),
    not nested in another session in the same process (``pytester``'s in-process runs)."""
    import _pytest.config
    import _pytest.main

    wrap_session = getattr(_pytest.main, "wrap_session", None)
    # pytest 8: console_main; 9: _console_main (console_main, deprecated, calls it).
    mains = {f.__code__ for f in (getattr(_pytest.config, name, None)
                                  for name in ("console_main", "_console_main"))
             if f is not None and hasattr(f, "__code__")}
    if wrap_session is None or not mains:  # pragma: no cover - pytest's internals moved
        return False
    codes = []
    frame = sys._getframe()
    while frame is not None:
        codes.append(frame.f_code)
        frame = frame.f_back  # type: ignore[assignment]  # None ends the loop
    return codes.count(wrap_session.__code__) == 1 and not mains.isdisjoint(codes)


def _thread_origin(thread: threading.Thread) -> str:
    """The module of what ``thread`` runs: its target, or its class's ``run``."""
    target = getattr(thread, "_target", None)
    if target is None:
        target = type(thread).run
    return str(getattr(target, "__module__", "") or "")


def _thread_text(thread: threading.Thread) -> str:
    target = getattr(thread, "_target", None) or type(thread).run
    where = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', '?')}"
    return f"{thread.name!r} ({'daemon' if thread.daemon else 'non-daemon'}, runs {where})"


def child_pids() -> list[int]:
    """This process's children that are still running (zombies aside); Linux ``/proc``,
    else the ``multiprocessing`` children of this process.

    A thread may end between listing ``/proc/self/task`` and reading its ``children`` file
    (pytest-timeout's timers do, between two tests): that thread is skipped, not the whole
    answer. Where no ``children`` file can be read (a kernel without
    ``CONFIG_PROC_CHILDREN``), the parent field of every ``/proc/PID/stat`` is read instead."""
    tasks = Path("/proc/self/task")
    pids: set[int] = set()
    read_any = False
    try:
        entries = list(tasks.iterdir())
    except OSError:
        mp = sys.modules.get("multiprocessing")
        return [p.pid for p in mp.active_children() if p.pid] if mp is not None else []
    for task in entries:
        try:
            text = (task / "children").read_text()
        except OSError:
            continue  # the thread ended meanwhile, or the kernel has no children file
        read_any = True
        pids.update(int(p) for p in text.split() if p.isdigit())
    if not read_any:
        pids = set(_children_by_parent(os.getpid()))
    return sorted(pid for pid in pids if _state(pid) not in ("Z", "X", ""))


def _children_by_parent(parent: int) -> list[int]:
    """The pids whose ``/proc/PID/stat`` names ``parent`` as their parent."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if len(fields) > 1 and fields[1] == str(parent):
            found.append(int(entry.name))
    return found


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rpartition(")")[2].split()[0] if ")" in stat else ""


def _command(pid: int) -> str:
    """The process's command line for a message: the program by its file name (a venv's
    path would use up the space), then its arguments, cut to 80 characters."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    argv = raw.decode("utf-8", "replace").split("\0")
    if argv and argv[0]:
        argv[0] = os.path.basename(argv[0])
    return short_repr(" ".join(argv).strip(), 80)
