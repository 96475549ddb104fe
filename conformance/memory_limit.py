"""A memory limit on the test process (``--kv-max-memory``, issue 23 item 3).

An adapter whose memory grows with every call (a leak of 2 MB a call reaches gigabytes in a
few thousand calls) must fail its test, not take the machine. ``MemoryWatch(limit)`` samples
the process's resident set size (RSS) from a daemon thread every ``PERIOD_S`` seconds: one
read of ``/proc/self/statm`` (a few microseconds, about 0.01 % of a core at 20 reads a
second; nothing is added to the adapter calls themselves). Where ``/proc`` is missing the
peak RSS of ``getrusage`` is read instead (it only grows, which is all a limit needs).

Once RSS is past the limit the watch diverts every guarded call (``kvcheck.conformance.guard.
divert_calls``): the next adapter call is not made and raises ``MemoryLimitExceeded`` naming
the growth (RSS at the start of the watch -> now), the limit and that call (and the guarded
call that was running when the limit was passed, when one was). The pytest side
(``kvcheck.plugin.resources``) fails the test if no call did, and ends the session with an
incomplete verdict. Growth inside one single call is seen only when that call returns; a
call that allocates without bound is the per-call limit's to stop (``--kv-timeout``).

Sizes (``parse_size``): a number of MiB (``4096``), or a number with a binary unit (``512K``,
``4G``, ``1.5GiB``, ``2T``; ``KB``/``MB``/``GB``/``TB`` are read as binary units too); ``0``
turns the limit off. The default (``default_limit``) is half the machine's memory: the
physical memory, or the cgroup limit of a container when that is lower.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from types import FrameType, FunctionType
from typing import NoReturn

from kvcheck.conformance import guard
from kvcheck.conformance.call_limit import arg_text
from kvcheck.conformance.errors import MemoryLimitExceeded
from kvcheck.errors import KVCheckInputError

__all__ = [
    "PERIOD_S",
    "MemoryLimitExceeded",
    "MemoryWatch",
    "default_limit",
    "machine_memory",
    "mib",
    "parse_size",
    "resident_bytes",
]

#: Seconds between two samples of the resident set size.
PERIOD_S = 0.05
_MIB = 1 << 20
_UNITS = {"": _MIB, "k": 1 << 10, "m": _MIB, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(?:([kmgt])(?:i?b)?)?\s*", re.IGNORECASE)
_MAX_DIGITS = 18
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def mib(size: int) -> str:
    """``size`` bytes in MiB, for messages (``1290 MiB``)."""
    return f"{size / _MIB:.0f} MiB"


def parse_size(text: str) -> int:
    """``text`` (see the module doc) in bytes; 0 for off.

    Raises:
        KVCheckInputError: not a size (the message shows the accepted forms).
    """
    match = _SIZE.fullmatch(text)
    if match is None:
        raise KVCheckInputError(
            f"{text!r} is not a size: give MiB (4096) or a number with a unit (512M, 4G, "
            "1.5GiB), or 0 for no limit")
    number, unit = match.groups()
    if len(number) > _MAX_DIGITS:  # beyond any machine (and beyond a float's precision)
        return 1 << 80
    return int(float(number) * _UNITS[(unit or "").lower()])


def _proc_rss() -> int | None:
    try:
        fd = os.open("/proc/self/statm", os.O_RDONLY)
    except OSError:
        return None
    try:
        return int(os.read(fd, 128).split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None
    finally:
        os.close(fd)


def _peak_rss() -> int | None:
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


_USE_PROC = _proc_rss() is not None


def resident_bytes() -> int | None:
    """The process's resident set size in bytes (peak RSS where ``/proc`` is missing; None
    where neither can be read)."""
    return _proc_rss() if _USE_PROC else _peak_rss()


def machine_memory() -> int | None:
    """The memory this process may use in bytes: physical memory, or the cgroup limit when
    lower (None: unknown)."""
    sizes: list[int] = []
    with contextlib.suppress(AttributeError, ValueError, OSError):
        sizes.append(os.sysconf("SC_PHYS_PAGES") * _PAGE)
    for path in _CGROUP_LIMITS:
        try:
            with open(path, encoding="ascii") as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < 1 << 60:  # "max" or a huge number: no limit
            sizes.append(int(text))
    return min(sizes) if sizes else None


def default_limit() -> int:
    """Half of ``machine_memory()`` (0, i.e. off, when it is unknown)."""
    total = machine_memory()
    return total // 2 if total else 0


# The guard methods by code object, to name the guarded call running when the limit is passed
# (a ``*_per_group`` method by the protocol method it checks).
_GUARD_CODES = {f.__code__: name.removesuffix("_per_group")
                for cls in {*guard.GuardedManager.__mro__, *guard.GuardedBlockPool.__mro__}
                for name, f in vars(cls).items() if isinstance(f, FunctionType)}


def _running_call(thread: int) -> str | None:
    """``IMPL.METHOD`` of the innermost guarded call of ``thread`` in progress, if any."""
    frame: FrameType | None = sys._current_frames().get(thread)
    while frame is not None:
        name = _GUARD_CODES.get(frame.f_code)
        if name is not None and not name.startswith("_"):
            owner = frame.f_locals.get("self")
            return f"{getattr(owner, '_impl', 'implementation')}.{name}"
        frame = frame.f_back
    return None


class MemoryWatch:
    """The sampling thread of one session (see the module doc).

    Args:
        limit: bytes of RSS past which the session stops (> 0).
        option: how messages name the setting (``--kv-max-memory=4096 MiB``).
        period: seconds between samples.
    """

    def __init__(self, limit: int, option: str, period: float = PERIOD_S) -> None:
        self.limit = limit
        self.option = option
        self.period = period
        self.start_rss = 0
        #: Set when the limit was passed: what the test failure and the record say.
        self.growth: str | None = None
        #: The message of the first adapter call refused since (None: none was).
        self.refused: str | None = None
        self._running: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._main = threading.get_ident()

    def start(self) -> None:
        """Take the starting RSS and start sampling (from the thread that runs the tests)."""
        self.start_rss = resident_bytes() or 0
        self._main = threading.get_ident()
        self._thread = threading.Thread(target=self._loop, name="kvcheck-memory-limit",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling and give every guard its own calls back."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)
        if self.growth is not None:
            guard.restore_calls()

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            rss = resident_bytes()
            if rss is None:
                return
            if rss > self.limit:
                self.trip(rss)
                return

    def trip(self, rss: int) -> None:
        """The limit was passed at ``rss`` bytes: divert every guarded call."""
        self._running = _running_call(self._main)
        self.growth = (f"the test process's memory (resident set) grew from "
                       f"{mib(self.start_rss)} at the start of the session to {mib(rss)}, past "
                       f"{self.option}")
        guard.divert_calls(self._refusal)

    def _refusal(self, impl: str) -> guard.AdapterCall:
        def refuse(method: str, fn: object, *args: object) -> NoReturn:
            __tracebackhide__ = True
            shown = ", ".join(arg_text(a) for a in args)
            message = self.failure(f"{impl}.{method}({shown})")
            if self.refused is None:
                self.refused = message
            raise MemoryLimitExceeded(message)

        return refuse

    def failure(self, call: str | None) -> str:
        """The message of the test that fails for the limit; ``call``: the adapter call that
        was refused (None: the limit was seen after the test's last call)."""
        running = (f" while {self._running} was running" if self._running else
                   " between adapter calls")
        refused = (f"; this call, {call}, was not made" if call is not None
                   else "; seen after the test's last adapter call")
        return (f"memory limit: {self.growth}; it was passed{running}{refused}. The session "
                f"stops here (an incomplete run). Fix: find what the implementation keeps "
                f"from call to call, or raise the limit (0 = no limit)")

    @property
    def record_reason(self) -> str:
        """The completeness reason the record carries."""
        return f"stopped by the memory limit: {self.growth}"
