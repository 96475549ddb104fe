"""Atomic file writes: a reader (or a crashed run) never sees a half-written file.

A kvcheck core module (no kvcheck imports): result records, repro traces and reports are all
written through ``write_atomic``.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

__all__ = ["write_atomic", "write_atomic_bytes"]


def _target_mode(path: Path) -> int:
    """The replaced file's permissions, or what ``open()`` would give a new file (mkstemp's
    0600 would make published records and pages unreadable to others)."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file in the same folder and
    ``os.replace`` (atomic on POSIX and Windows); parent folders are created. The file keeps
    the permissions of the one it replaces (a new one gets the umask's default)."""
    return write_atomic_bytes(path, text.encode("utf-8"))


def write_atomic_bytes(path: str | Path, data: bytes) -> Path:
    """``write_atomic`` for binary content (compressed corpora)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = _target_mode(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path
