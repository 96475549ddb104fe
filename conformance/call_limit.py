"""A per-call time limit on adapter calls (``--kv-timeout``): a hung call fails its test with
``AdapterTimeout`` naming the call, and the session goes on.

Mechanism, cheapest first:

* **Main thread** (where pytest runs tests): nothing per call but bookkeeping (no system
  call: a suite run makes about 230,000 adapter calls). A watchdog thread wakes every
  ``period`` (a quarter of the smallest limit in use, between 0.02 and 0.5 s) and, once a
  call has run past its limit, sends SIGALRM to the main thread (``pthread_kill``), whose
  handler raises ``AdapterTimeout`` inside the stuck call; a blocking system call is
  interrupted by it too. So a call is interrupted between ``limit`` and ``limit + period``
  seconds after it started. kvcheck arms no timer of its own: another user of SIGALRM
  (pytest-timeout's ``signal`` method) keeps its timer untouched, and an alarm kvcheck did
  not send is handed to that user's handler (which is put back after each call).
* **Other threads**, or a platform without SIGALRM: the same watchdog raises
  ``AdapterTimeout`` in the calling thread (``PyThreadState_SetAsyncExc``) once the limit has
  passed; it takes effect at the next Python bytecode of that thread.
* **A call that cannot be abandoned** (stuck in C code; or one that swallows the exception and
  keeps going): ``limit + grace`` seconds after it started, the watchdog writes
  ``kvcheck: IMPL.METHOD(...) did not return within N s and could not be interrupted; ending
  the session: no verdict`` to the original standard error, dumps every thread's stack and
  exits the process with ``STUCK_EXIT_CODE``. Code that holds the GIL starves the watchdog
  too, so while calls are being made ``faulthandler.dump_traceback_later(..., exit=True)`` is
  kept armed a little beyond that point as the last resort (its output is ``Timeout
  (h:mm:ss)!`` and the stack of the stuck call). Known cost of the last resort: a process
  suspended (Ctrl-Z) for longer than ``limit + grace`` in the middle of the run may be ended
  when resumed; pass ``--kv-timeout=0`` when debugging.
* **A forked child** (``os.fork``) starts its own watchdog at its first call (threads are not
  inherited), without the faulthandler last resort (whose timer thread is the parent's).

Time the garbage collector spends collecting during a call is not the call's: a collection of a
large heap (a whole pytest session's objects, when suites run in-process) can take longer than a
tight limit. A ``gc.callbacks`` clock adds those pauses to the call's deadline, and no alarm is
sent while a collection is running (its handler would run inside some object's ``__del__``,
where a raised exception is only printed and lost): the watchdog looks again a period later.
A call that is interrupted and yet returns normally (it caught the exception, or the exception
was raised where Python cannot propagate it) still fails with ``AdapterTimeout``, saying so: an
interruption is never lost.

A limit of ``0`` or ``None`` turns all of this off (the call is made directly). Either way a
call that raises a ``BaseException`` of its own (``KeyboardInterrupt`` without a Ctrl-C,
``SystemExit``, ``GeneratorExit``, pytest's ``skip()``...) raises ``AdapterRaised`` instead
(``kvcheck.conformance.interrupts``).
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, TypeVar

from kvcheck.conformance.errors import AdapterTimeout
from kvcheck.conformance.interrupts import AdapterRaised, is_adapters_doing, raised_text
from kvcheck.conformance.protocol import RequestView
from kvcheck.errors import KVCheckInputError

if TYPE_CHECKING:
    from typing_extensions import TypeVarTuple, Unpack

    _Args = TypeVarTuple("_Args")

__all__ = [
    "DEFAULT_CALL_TIMEOUT",
    "GRACE_S",
    "STUCK_EXIT_CODE",
    "AdapterRaised",
    "AdapterTimeout",
    "CallLimit",
    "abbreviate",
    "arg_text",
    "set_last_resort",
]

#: Default per-call limit in seconds. Adapter calls on a small pool take microseconds to
#: milliseconds; a minute is far beyond any sane call (Triton-interpreted kernels are not
#: adapter calls through this limit).
DEFAULT_CALL_TIMEOUT = 60.0
#: Seconds after the limit during which an interrupted call may still unwind; a call still
#: running then ends the session.
GRACE_S = 10.0
#: Exit status of a session ended because a call could not be interrupted (pytest's
#: "interrupted": there is no verdict).
STUCK_EXIT_CODE = 2

_T = TypeVar("_T")
#: What ``signal.signal`` accepts and ``signal.getsignal`` returns.
_Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None

_MAIN_IDENT: int = threading.main_thread().ident or 0
_HAVE_ALARM = hasattr(signal, "pthread_kill") and hasattr(signal, "SIGALRM")
# Bound once: the main thread's path runs on every adapter call.
_get_ident = threading.get_ident
_monotonic = time.monotonic
if _HAVE_ALARM:
    _SIGALRM = signal.SIGALRM
# A private copy of the standard error the process started with: while pytest captures
# output, fd 2 points at a temporary file that a dying process never shows.
try:
    _STDERR_FD = os.dup(2)
except OSError:  # no standard error at all
    _STDERR_FD = -1


def abbreviate(value: object, limit: int = 120) -> str:
    """``repr(value)`` cut to ``limit`` characters (with ``...`` where cut)."""
    try:
        text = repr(value)
    except Exception as exc:  # noqa: BLE001 - a broken __repr__ must not hide the real problem
        text = f"<{type(value).__name__} (repr raised {type(exc).__name__})>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def arg_text(value: object) -> str:
    """An argument as failure messages show it: a ``RequestView`` by its id and sizes (its
    token tuple can be long), anything else abbreviated."""
    if type(value) is RequestView:
        return (f"RequestView({value.request_id!r}, {value.num_tokens} tokens, "
                f"num_computed_tokens={value.num_computed_tokens})")
    return abbreviate(value, 60)


class _GCClock:
    """Seconds the garbage collector has paused this process (``gc.callbacks``), counted from
    the first ``CallLimit`` with a limit. One collection runs at a time (it holds the GIL)."""

    __slots__ = ("paused", "since", "started")

    def __init__(self) -> None:
        self.paused = 0.0  # finished collections, seconds in all
        self.since: float | None = None  # start of the collection running now
        self.started = False

    def start(self) -> None:
        if not self.started:
            self.started = True
            gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.since = _monotonic()
        elif self.since is not None:
            self.paused += _monotonic() - self.since
            self.since = None

    def paused_until(self, now: float) -> float:
        """``paused`` plus the part of the running collection before ``now``."""
        since = self.since
        return self.paused + (now - since if since is not None and now > since else 0.0)


_GC = _GCClock()


class _Call:
    """One timed call in progress (read by the alarm handler and the watchdog)."""

    __slots__ = ("args", "deadline", "done", "gc_start", "limit", "method", "raised", "start",
                 "thread")

    def __init__(self, limit: CallLimit, method: str, args: tuple[object, ...], start: float,
                 thread: int) -> None:
        self.limit = limit
        self.method = method
        self.args = args
        self.start = start
        self.deadline = start + limit.seconds
        self.gc_start = _GC.paused  # the collector's pauses so far (see due())
        self.thread = thread
        self.done = False
        self.raised = False

    def due(self, now: float) -> float:
        """The deadline moved by the time the garbage collector has paused the process since
        the call started (that time is not the call's)."""
        return self.deadline + _GC.paused_until(now) - self.gc_start

    def describe(self) -> str:
        args = ", ".join(arg_text(a) for a in self.args)
        return f"{self.limit.impl}.{self.method}({args})"

    def timeout_message(self) -> str:
        return (f"{self.describe()} did not return within {self.limit.seconds:g} s "
                f"(--kv-timeout={self.limit.seconds:g}; 0 = no limit)")

    def swallowed_message(self, now: float) -> str:
        return (f"{self.timeout_message()}: it was interrupted at the limit, yet returned "
                f"normally after {now - self.start:.3g} s (it caught the interruption, or the "
                "interruption was raised where Python cannot propagate it)")


class CallLimit:
    """The per-call limit of one implementation.

    Args:
        seconds: the limit; ``0`` or ``None``: no limit.
        impl: the implementation's name, for messages.
        grace: seconds after the limit before an uninterruptible call ends the session.
    """

    __slots__ = ("grace", "impl", "seconds")

    def __init__(self, seconds: float | None, impl: str = "implementation",
                 grace: float = GRACE_S) -> None:
        if seconds is not None and not (seconds >= 0 and seconds != float("inf")):
            raise KVCheckInputError(
                f"call limit {seconds!r}: must be a finite number of seconds >= 0")
        self.seconds = float(seconds) if seconds else 0.0
        self.impl = impl
        self.grace = grace
        if self.seconds:
            _GC.start()
            _WATCHDOG.tighten(self)

    def __repr__(self) -> str:
        return f"CallLimit({self.seconds:g}, impl={self.impl!r})"

    def call(self, method: str, fn: Callable[[Unpack[_Args]], _T], *args: Unpack[_Args]) -> _T:
        """``fn(*args)`` under the limit; ``method`` names the call in messages.

        Raises:
            AdapterTimeout: the call ran past the limit (it was interrupted).
            AdapterRaised: the call raised a BaseException that is not an Exception, or
                called pytest.exit() (``kvcheck.conformance.interrupts``: the
                implementation's doing; a real Ctrl-C passes through).
        """
        try:  # free until something is raised (zero-cost try blocks)
            if not self.seconds:
                return fn(*args)
            thread = _get_ident()
            if thread == _MAIN_IDENT and _HAVE_ALARM:
                if _ALARM.call is not None:  # nested in a timed call: the outer limit covers it
                    return fn(*args)
                return _ALARM.run(self, method, fn, args)
            return _WATCHDOG.run_threaded(self, method, fn, args, thread)
        except BaseException as exc:
            if type(exc) is _AsyncTimeout or not is_adapters_doing(exc):
                raise
            shown = ", ".join(arg_text(a) for a in args)
            raise AdapterRaised(f"{self.impl}.{method}({shown}) {raised_text(exc)}",
                                type(exc).__name__) from exc


# ---------------------------------------------------------------- main thread: SIGALRM
class _Alarm:
    """The main thread's timed call and its SIGALRM handler (one per process). The watchdog
    sends the alarm (``sent`` tells it from anyone else's); the call itself makes no system
    call unless someone else's Python handler must be swapped out for it."""

    def __init__(self) -> None:
        self.call: _Call | None = None
        self.previous: _Handler = signal.SIG_DFL  # the handler ours replaced
        self.sent = False  # the watchdog sent SIGALRM and the handler has not run since

    def run(self, limit: CallLimit, method: str, fn: Callable[[Unpack[_Args]], _T],
            args: tuple[Unpack[_Args]]) -> _T:
        current = _getsignal(_SIGALRM)
        swapped = False
        if current is not _on_alarm:
            if current is None:  # a handler installed from C: we cannot chain to it
                return _WATCHDOG.run_threaded(limit, method, fn, args, _MAIN_IDENT)
            self.previous = current
            signal.signal(signal.SIGALRM, _on_alarm)
            # Default / ignore: ours stays installed (it behaves like them when the alarm is
            # not ours). Someone's Python handler: put it back after the call.
            swapped = callable(current)
        call = _Call(limit, method, args, _monotonic(), _MAIN_IDENT)
        self.call = call  # what the watchdog looks at
        watchdog = _WATCHDOG
        if watchdog.thread is None or not watchdog.last_resort_armed:
            watchdog.watch(call)
        try:
            result = fn(*args)
        finally:
            call.done = True
            self.call = None
            if swapped:
                signal.signal(signal.SIGALRM, self.previous)
                # An alarm the watchdog sent as the call returned goes to their handler now
                # (a rare race: a call past its limit returning at that very moment); ours
                # must not then take their next one for it.
                self.sent = False
        if call.raised:  # interrupted, and yet it returned: the timeout is not lost
            raise AdapterTimeout(call.swallowed_message(_monotonic()))
        return result

    def delegate(self, signum: int, frame: FrameType | None) -> object:
        """The alarm is not ours: do what the replaced handler would have done."""
        previous = self.previous
        if callable(previous):
            return previous(signum, frame)
        if previous == signal.SIG_IGN:
            return None
        # SIG_DFL terminates the process on SIGALRM: let it.
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGALRM)
        return None


try:  # the C-level getsignal skips the enum conversion of signal.getsignal (~25x faster)
    from _signal import getsignal as _getsignal  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - CPython always has it
    _getsignal = signal.getsignal
_ALARM = _Alarm()


def _on_alarm(signum: int, frame: FrameType | None) -> object:
    alarm = _ALARM
    if not alarm.sent:  # a timer of someone else's (pytest-timeout): theirs to handle
        return alarm.delegate(signum, frame)
    # Ours. (A timer of theirs that fires at the very moment the watchdog sends ours is
    # merged into one delivery by the kernel or by Python's handler: that one is lost.)
    alarm.sent = False
    call = alarm.call
    if call is None or call.done or call.raised:
        return None  # the call returned (or was interrupted) after the watchdog looked
    if _GC.since is not None:
        # A collection is running: the handler runs inside some __del__ (where an exception
        # is lost), and the pause is not the call's. The watchdog looks again a period later.
        return None
    now = _monotonic()
    if now >= call.due(now) - 1e-3:
        call.raised = True
        raise AdapterTimeout(call.timeout_message())
    return None  # a collection moved the deadline: the watchdog sends again when it is due


# ---------------------------------------------------------------- watchdog
class _Watchdog:
    """One daemon thread: interrupts timed calls past their limit (the main thread's with
    SIGALRM, other threads' with an asynchronous exception), ends the session when a call
    cannot be interrupted, and keeps the faulthandler last resort armed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: dict[int, _Call] = {}  # thread ident -> its timed call
        self.thread: threading.Thread | None = None
        self.period = 0.5  # seconds between looks: how late past its limit a call may end
        self.wake = threading.Event()  # set: look now, with the period just shortened
        self.last_resort_armed = False
        self.last_resort = True

    def tighten(self, limit: CallLimit) -> None:
        """Look at least every quarter of ``limit`` (and of its grace), from now on."""
        period = max(0.02, min(limit.seconds, limit.grace) / 4)
        if period < self.period:
            self.period = period
            self.wake.set()

    def _start(self, limit: CallLimit) -> None:
        self.tighten(limit)
        if self.thread is None or not self.thread.is_alive():
            self.thread = threading.Thread(target=self._loop, name="kvcheck-call-limit",
                                           daemon=True)
            self.thread.start()

    def watch(self, call: _Call) -> None:
        """Start the thread if needed and arm the last resort (the main thread's call path
        calls this only when one of them is missing)."""
        if self.thread is None:
            self._start(call.limit)
        if not self.last_resort_armed and self.last_resort:
            self._arm_last_resort(call.limit.seconds + call.limit.grace + 2 * self.period)

    def forget_after_fork(self) -> None:
        """In a forked child: the parent's thread and calls are not this process's. The next
        call starts a thread; the last resort stays off (faulthandler's timer thread is the
        parent's, and re-arming it in a child is not safe)."""
        self.lock = threading.Lock()
        self.calls = {}
        self.thread = None
        self.wake = threading.Event()
        self.last_resort_armed = False
        self.last_resort = False

    def run_threaded(self, limit: CallLimit, method: str, fn: Callable[[Unpack[_Args]], _T],
                     args: tuple[Unpack[_Args]], thread: int) -> _T:
        if thread in self.calls:  # nested
            return fn(*args)
        call = _Call(limit, method, args, time.monotonic(), thread)
        self._start(limit)
        self.calls[thread] = call
        try:
            result = fn(*args)
        except _AsyncTimeout:
            raise AdapterTimeout(call.timeout_message()) from None
        finally:
            call.done = True
            self.calls.pop(thread, None)
        if call.raised:  # interrupted, and yet it returned: the timeout is not lost
            raise AdapterTimeout(call.swallowed_message(time.monotonic()))
        return result

    def _arm_last_resort(self, seconds: float) -> None:
        with self.lock:
            fd = _STDERR_FD if _STDERR_FD >= 0 else 2
            try:
                faulthandler.dump_traceback_later(seconds, exit=True, file=fd)
            except (ValueError, OSError, RuntimeError):
                self.last_resort = False
                return
            self.last_resort_armed = True

    def _loop(self) -> None:
        if _HAVE_ALARM:
            # Someone else's process-wide timer (pytest-timeout) may be delivered to any
            # thread that does not block SIGALRM; here it would interrupt nothing. Block it.
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        while True:
            if self.wake.wait(self.period):
                self.wake.clear()
            now = time.monotonic()
            main = _ALARM.call  # the main thread's call (the others are in self.calls)
            active = [c for c in [main, *list(self.calls.values())]
                      if c is not None and not c.done]
            collecting = _GC.since is not None
            for call in active:
                due = call.due(now)
                if now >= due + call.limit.grace and not call.done:
                    _end_session(call)
                if collecting or now < due or call.raised:
                    continue  # (while collecting, an exception would land in some __del__)
                if call is not main:
                    call.raised = True
                    _async_raise(call.thread)
                elif _getsignal(_SIGALRM) is _on_alarm:
                    # The main thread's handler raises AdapterTimeout in the call (it marks
                    # the call raised), interrupting a blocking system call too.
                    _ALARM.sent = True
                    signal.pthread_kill(_MAIN_IDENT, _SIGALRM)
            if self.last_resort:
                self._refresh_last_resort()

    def _refresh_last_resort(self) -> None:
        """Re-arm the last resort to the soonest "end the session" point of the calls in
        progress, or disarm it when there is none (the next call re-arms it). The flag is
        cleared before the calls are read, so a call starting meanwhile arms it itself."""
        with self.lock:
            self.last_resort_armed = False
            now = time.monotonic()
            pending = [c for c in [_ALARM.call, *list(self.calls.values())]
                       if c is not None and not c.done]
            try:
                if pending:
                    soonest = min(c.due(now) + c.limit.grace for c in pending)
                    faulthandler.dump_traceback_later(
                        max(soonest - now, 0) + 2 * self.period, exit=True,
                        file=_STDERR_FD if _STDERR_FD >= 0 else 2)
                    self.last_resort_armed = True
                else:
                    faulthandler.cancel_dump_traceback_later()
            except (ValueError, OSError, RuntimeError):
                self.last_resort = False  # unusable here: the watchdog still acts


class _AsyncTimeout(BaseException):
    """Raised asynchronously in a thread whose timed call ran past its limit (a
    BaseException, so adapter code catching Exception does not swallow it); converted to
    ``AdapterTimeout`` with the message where the call was made."""


def _async_raise(thread: int) -> None:
    import ctypes

    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread),
                                               ctypes.py_object(_AsyncTimeout))


def _end_session(call: _Call) -> None:
    """The call did not stop: say so on the real standard error and exit (no verdict)."""
    message = (f"\nkvcheck: {call.describe()} did not return within {call.limit.seconds:g} s "
               f"and could not be interrupted; ending the session: no verdict\n"
               f"  (--kv-timeout={call.limit.seconds:g}; it was given {call.limit.grace:g} s "
               "more to unwind. Its stack and every thread's follow.)\n")
    fd = _STDERR_FD if _STDERR_FD >= 0 else 2
    try:
        os.write(fd, message.encode("utf-8", "replace"))
        faulthandler.dump_traceback(file=fd, all_threads=True)
    except OSError:
        pass
    with contextlib.suppress(Exception):  # whatever stdout is, the session ends now
        sys.stdout.flush()
    os._exit(STUCK_EXIT_CODE)


_WATCHDOG = _Watchdog()


def _forget_after_fork() -> None:
    _ALARM.call = None
    _ALARM.sent = False
    _WATCHDOG.forget_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def set_last_resort(enabled: bool) -> None:
    """Turn the faulthandler last resort on or off (e.g. off when pytest's own
    ``faulthandler_timeout`` uses faulthandler's single later-dump timer)."""
    _WATCHDOG.last_resort = enabled
    if not enabled and _WATCHDOG.last_resort_armed:
        with _WATCHDOG.lock:
            faulthandler.cancel_dump_traceback_later()
            _WATCHDOG.last_resort_armed = False
