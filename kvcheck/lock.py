"""One writer per output file: an exclusive lock a process holds for as long as it may write.

A kvcheck core module (imports only ``kvcheck.errors``). Two runs that write the same report
at once would both say "written" and one record would be lost; the second run is refused
before it starts instead. The lock is ``fcntl.flock`` on a sidecar file next to the output
(``.NAME.lock``), so:

* the kernel releases it when its process ends, however it ends (``kill -9``, the OOM
  killer): a lock left by a killed process never blocks the next run, only a live holder
  does;
* the sidecar holds the holder's pid, host and command line, for the refusal's message;
* a normal release removes the sidecar (and the folders ``acquire_output_lock`` created for
  it, when still empty): a finished run leaves nothing behind.

Where ``fcntl`` is missing (Windows) or the file system refuses ``flock`` (some network
mounts), the lock degrades to no lock at all (``OutputLock.held`` is False): kvcheck then
behaves as it did without it, and atomic writes still keep every file whole.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import sys
import time
from pathlib import Path

from kvcheck.errors import OutputBusyError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["OutputBusyError", "OutputLock", "acquire_output_lock", "lock_file_for"]

#: How much of a lock file's holder description is read back (it is one short line).
_HOLDER_BYTES = 512


class OutputLock:
    """A held (or, where locking is unavailable, a no-op) claim on one output file.

    ``release`` is idempotent; only the process that acquired the lock removes the sidecar
    (a forked child that inherited the descriptor only closes its copy)."""

    def __init__(self, target: Path, lock_file: Path | None, fd: int | None,
                 created: list[Path]) -> None:
        self.target = target
        self.lock_file = lock_file
        self._fd = fd
        self._created = created
        self._pid = os.getpid()

    @property
    def held(self) -> bool:
        """Whether a real lock is held (False: released, or locking unavailable here)."""
        return self._fd is not None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        if os.getpid() == self._pid and self.lock_file is not None:
            # Unlinked while still locked: a process that opened it meanwhile finds, once
            # it gets the lock, that the path now names another file (or none) and retries.
            with contextlib.suppress(OSError):
                os.unlink(self.lock_file)
            for folder in reversed(self._created):
                with contextlib.suppress(OSError):
                    folder.rmdir()  # only when still empty
        os.close(fd)


def lock_file_for(path: str | Path) -> Path:
    """The sidecar lock file of output ``path``: ``.NAME.lock`` beside the file a symlink
    (or ``..``) leads to, so every spelling of one file shares one lock."""
    target = _canonical(Path(path))
    return target.parent / f".{target.name}.lock"


def acquire_output_lock(path: str | Path) -> OutputLock:
    """Take the lock on output ``path`` without waiting.

    Missing folders on the way are created (the output's write would create them anyway)
    and removed again by ``release`` when still empty.

    Raises:
        OutputBusyError: another live process holds it (its description in ``holder``).
        OSError: the lock file cannot be created (an unwritable folder).
    """
    target = _canonical(Path(path))
    lock_file = target.parent / f".{target.name}.lock"
    if fcntl is None:
        return OutputLock(target, None, None, [])
    created = _make_folders(target.parent)
    for _ in range(10):  # a retry only when a holder removed the file meanwhile
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_holder(fd) if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN) else None
            os.close(fd)
            if holder is not None:
                _remove_empty(created)
                raise OutputBusyError(target, holder) from None
            # flock unsupported here (ENOLCK, EOPNOTSUPP...): no lock, as without fcntl.
            with contextlib.suppress(OSError):
                os.unlink(lock_file)
            _remove_empty(created)
            return OutputLock(target, None, None, [])
        if _same_inode(fd, lock_file):
            _describe_holder(fd)
            return OutputLock(target, lock_file, fd, created)
        os.close(fd)
    _remove_empty(created)  # pragma: no cover - ten holders in a row released meanwhile
    raise OutputBusyError(target, "")


def _canonical(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # a symlink loop
        return path.absolute()


def _make_folders(folder: Path) -> list[Path]:
    """Create ``folder`` and missing parents; return the ones created, outermost first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    created = []
    for folder in reversed(missing):
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        created.append(folder)
    return created


def _remove_empty(created: list[Path]) -> None:
    for folder in reversed(created):
        with contextlib.suppress(OSError):
            folder.rmdir()


def _same_inode(fd: int, path: Path) -> bool:
    try:
        mine, now = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (mine.st_dev, mine.st_ino) == (now.st_dev, now.st_ino)


def _describe_holder(fd: int) -> None:
    """Write who holds the lock into the lock file (one line, no ``;``: the refusal's
    message quotes it)."""
    command = " ".join(sys.argv)[:200].replace(";", ",").replace("\n", " ")
    started = time.strftime("%H:%M:%S", time.localtime())
    text = f"process {os.getpid()} on {socket.gethostname()}, started {started}: {command}"
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, text.encode("utf-8", "replace"), 0)


def _read_holder(fd: int) -> str:
    try:
        data = os.pread(fd, _HOLDER_BYTES, 0)
    except OSError:
        return ""
    text = data.decode("utf-8", "replace")
    return "".join(c if c.isprintable() else " " for c in text).strip()
