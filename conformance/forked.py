"""A process the implementation forks never runs the session (issue 23 item 3).

An adapter that calls ``os.fork()`` in its factory (or in any call) returns twice: in the
child, the factory returns into kvcheck, which would run the rest of the session a second
time, print a second verdict and write the record again. ``watch_forks()`` registers
``os.register_at_fork`` hooks (once per process) and remembers the process that started the
session:

* before a fork, the forking thread's stack tells whether the fork happens inside an
  adapter call (a ``CallLimit.call`` frame: the factory, the load-time probe, every guarded
  call); the registry of guards is locked across the fork, so the child never inherits it
  held;
* such a child is ended as that adapter call returns into kvcheck (a profile function set
  in the child only watches for the return of that call's frame): ``end_forked_child``
  writes ``kvcheck: process C, forked by IMPL.METHOD in the pytest process P, returned into
  the pytest session (...); ending it ...`` to the standard error (pytest's capture
  suspended first) and exits with ``FORKED_CHILD_EXIT_CODE``, without flushing the output
  buffers it shares with its parent;
* the pytest side (``kvcheck.plugin.resources``) also ends such a child at the next session
  hook (the next test, the end of the session), and the verdict and record are only made by
  the process that started the session (``is_forked_child``).

A child that never returns into kvcheck (``multiprocessing`` with the fork start method runs
its target and exits; ``subprocess`` execs) is left alone, and so is a fork made outside
adapter calls (``pytest-forked`` runs each test in a child of its own).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from types import FrameType
from typing import NoReturn, TypedDict

from kvcheck.conformance import guard
from kvcheck.conformance.call_limit import CallLimit

__all__ = ["FORKED_CHILD_EXIT_CODE", "end_forked_child", "is_forked_child", "watch_forks"]

#: Exit status of a forked child that kvcheck ends.
FORKED_CHILD_EXIT_CODE = 1

_CALL_CODE = CallLimit.call.__code__
# The process that started the session (0: none yet), whether the fork in progress happens
# inside an adapter call (and which), and what this process is when it is such a child.
class _State(TypedDict):
    owner: int
    fork_in: tuple[str, FrameType] | None
    child_of: tuple[int, str] | None
    registered: bool
    before_exit: Callable[[], None] | None


_state: _State = {"owner": 0, "fork_in": None, "child_of": None, "registered": False,
                  "before_exit": None}


def watch_forks(before_exit: Callable[[], None] | None = None) -> None:
    """Make this process the one that runs the session, and watch the forks of adapter calls
    (see the module doc). ``before_exit`` is called in a child about to be ended (e.g. to
    stop pytest's output capture, so the message reaches the terminal)."""
    if _state["child_of"] is None:
        _state["owner"] = os.getpid()
    _state["before_exit"] = before_exit
    if not _state["registered"] and hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_before_fork, after_in_parent=_after_in_parent,
                            after_in_child=_after_in_child)
        _state["registered"] = True


def is_forked_child() -> bool:
    """Whether this process is not the one that started the session (a fork of it)."""
    owner: int = _state["owner"]
    return bool(owner) and os.getpid() != owner


def _adapter_call() -> tuple[str, FrameType] | None:
    """``IMPL.METHOD`` and the ``CallLimit.call`` frame of the adapter call the current
    thread is in, if any."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code is _CALL_CODE:
            f_locals = frame.f_locals
            limit = f_locals.get("self")
            name = f"{getattr(limit, 'impl', 'implementation')}.{f_locals.get('method', '?')}"
            return name, frame
        frame = frame.f_back
    return None


def _before_fork() -> None:
    _state["fork_in"] = _adapter_call() if _state["owner"] else None
    guard.live_guards()[0].acquire()


def _after_in_parent() -> None:
    guard.live_guards()[0].release()
    _state["fork_in"] = None  # drops the frame


def _after_in_child() -> None:
    guard.live_guards()[0].release()
    found = _state["fork_in"]
    _state["fork_in"] = None
    if found is None:
        return
    where, call_frame = found
    _state["child_of"] = (_state["owner"], where)

    # The child is ended as the adapter call returns into kvcheck (or unwinds), before any
    # of kvcheck's code runs in it: some of it is not safe after a fork (faulthandler's
    # timer waits for its thread, which the child does not have). Only this child pays for
    # the profile function.
    def on_return(frame: FrameType, event: str, arg: object) -> None:
        if event == "return" and frame is call_frame:
            end_forked_child(f"as {where} returned")

    sys.setprofile(on_return)

    # Should the adapter replace the profile function, its next guarded call ends it.
    def diversion(impl: str) -> guard.AdapterCall:
        def end(method: str, fn: object, *args: object) -> NoReturn:
            end_forked_child(f"its next call, {impl}.{method}")

        return end

    guard.divert_calls(diversion)


def end_forked_child(at: str) -> NoReturn:
    """End this process, a fork of the session's process (``at``: where it was caught),
    saying so on the standard error. Buffered output is not flushed: it is the parent's."""
    owner, where = _state["child_of"] or (_state["owner"], "the implementation")
    hook = _state["before_exit"]
    if hook is not None:
        with contextlib.suppress(Exception):  # the child ends whatever the hook does
            hook()
    message = (f"\nkvcheck: process {os.getpid()}, forked by {where} in the pytest process "
               f"{owner}, returned into the pytest session ({at}); ending it (exit status "
               f"{FORKED_CHILD_EXIT_CODE}): only the process that started the session runs "
               "tests, prints the verdict and writes the record. Fix: a forked child must "
               "exec or exit (os._exit), never return into its caller\n")
    with contextlib.suppress(OSError):
        os.write(2, message.encode("utf-8", "replace"))
    os._exit(FORKED_CHILD_EXIT_CODE)
