"""Whose fault a ``BaseException`` is: the implementation's, or the user's Ctrl-C.

An adapter call (a factory, a manager or pool method, a sizing function: everything that runs
under ``CallLimit.call``) that raises a ``BaseException`` which is not an ``Exception``
(``KeyboardInterrupt``, ``SystemExit``, ``GeneratorExit``, a ``BaseException`` subclass of its
own, pytest's ``skip()`` / ``fail()`` / ``xfail()``, Hypothesis's ``StopTest``), or that calls
``pytest.exit()``, did so on its own: the call is turned into ``AdapterRaised``, a
``KVCheckFailure`` naming the call and what it raised (chained to it), so that test fails as
the implementation's fault, with op, trace and repro like any exception an adapter raises,
and the session goes on. Declining a spec is ``UnsupportedSpec`` from the factory; an adapter
that skips a test from inside a call would hide a failure from the verdict, so a skip is a
failure too.

Left as they are (they are not the implementation's doing):

* a ``KeyboardInterrupt`` once the user pressed Ctrl-C: ``watch_user_interrupts()`` installs a
  SIGINT handler that notes the signal and then does what the handler it replaced did
  (Python's default raises ``KeyboardInterrupt``), so a real signal stops the run as
  interrupted. Where the handler is not installed (not the main thread) or was replaced
  since, every ``KeyboardInterrupt`` is taken as the user's: a Ctrl-C is never blamed on the
  implementation;
* pytest-timeout's failure, raised by its SIGALRM handler inside the call (a frame of
  ``pytest_timeout`` in the traceback): the test ran too long, which proves nothing about the
  call it happened to interrupt (``kvcheck.plugin.outcomes`` recognises it);
* kvcheck's own ``_AsyncTimeout`` (the call limit's watchdog): ``CallLimit`` passes it by.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType, TracebackType

from kvcheck.conformance.errors import AdapterRaised

__all__ = ["AdapterRaised", "is_adapters_doing", "raised_text", "user_interrupted",
           "watch_user_interrupts"]


_Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None


class _Watch:
    """The SIGINT handler's state (one per process)."""

    previous: _Handler = signal.default_int_handler
    received = False  # a SIGINT arrived since the session started


_WATCH = _Watch()


def _on_sigint(signum: int, frame: FrameType | None) -> object:
    _WATCH.received = True
    previous = _WATCH.previous
    if callable(previous):  # Python's default_int_handler raises KeyboardInterrupt
        return previous(signum, frame)
    if previous == signal.SIG_IGN:
        return None
    if previous == signal.SIG_DFL:  # the default action ends the process: let it
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.raise_signal(signal.SIGINT)
        return None
    raise KeyboardInterrupt  # a handler installed from C: Python's own behaviour


def watch_user_interrupts() -> bool:
    """Install the SIGINT handler that tells a real Ctrl-C from a ``KeyboardInterrupt`` an
    adapter raises (idempotent; chains to the handler it replaces), at the start of a session:
    a Ctrl-C noted before (an earlier in-process session's) is forgotten. Returns whether it
    is installed (only the main thread can install one)."""
    _WATCH.received = False
    if threading.current_thread() is not threading.main_thread():
        return _watching()
    current = signal.getsignal(signal.SIGINT)
    if current is _on_sigint:
        return True
    with contextlib.suppress(ValueError, OSError):  # an embedded interpreter without signals
        signal.signal(signal.SIGINT, _on_sigint)
        _WATCH.previous = current
        return True
    return False


def _watching() -> bool:
    try:
        return signal.getsignal(signal.SIGINT) is _on_sigint
    except ValueError:  # pragma: no cover - a platform without SIGINT
        return False


def user_interrupted() -> bool:
    """Whether a SIGINT reached the process since the session started."""
    return _WATCH.received


def _from_pytest_timeout(tb: TracebackType | None) -> bool:
    while tb is not None:
        if tb.tb_frame.f_globals.get("__name__") == "pytest_timeout":
            return True
        tb = tb.tb_next
    return False


def _pytest_outcome(exc: BaseException, name: str) -> bool:
    outcomes = sys.modules.get("_pytest.outcomes")
    kind = getattr(outcomes, name, None) if outcomes is not None else None
    return isinstance(kind, type) and isinstance(exc, kind)


def is_adapters_doing(exc: BaseException) -> bool:
    """Whether ``exc``, raised out of an adapter call, is the implementation's doing and must
    become ``AdapterRaised`` (see the module doc): an ``Exception`` only when it is pytest's
    ``Exit``; a ``KeyboardInterrupt`` only when no signal caused it."""
    if isinstance(exc, Exception):
        return _pytest_outcome(exc, "Exit")
    if isinstance(exc, KeyboardInterrupt):
        return _watching() and not _WATCH.received
    if _pytest_outcome(exc, "OutcomeException"):
        return not _from_pytest_timeout(exc.__traceback__)
    return True


def raised_text(exc: BaseException) -> str:
    """What the call did, as a failure message says it."""
    name = type(exc).__name__
    if _pytest_outcome(exc, "OutcomeException") or _pytest_outcome(exc, "Exit"):
        verb = {"Skipped": "skip", "Failed": "fail", "XFailed": "xfail", "Exit": "exit"}.get(
            name, name)
        reason = str(getattr(exc, "msg", "") or "")
        return (f"called pytest.{verb}({reason!r}); an adapter never ends or skips a test "
                "itself (to decline a spec, the factory raises UnsupportedSpec)")
    if isinstance(exc, KeyboardInterrupt):
        what = "KeyboardInterrupt, not caused by a signal (no Ctrl-C reached kvcheck)"
    elif isinstance(exc, SystemExit):
        what = f"SystemExit({exc.code!r}) (sys.exit() inside an adapter call)"
    else:
        text = str(exc)
        what = f"{name}({text!r})" if text else name
        if not isinstance(exc, GeneratorExit):
            what += " (a BaseException subclass)"
    return (f"raised {what}: an adapter call must return or raise an Exception; kvcheck "
            "counts it as the implementation's failure")
