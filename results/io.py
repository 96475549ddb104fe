"""Atomic result-file writes (a reader never sees a half-written file), the checks an
output path passes before a command computes anything (``check_output_path``), and the
claim a long-running writer takes on its output (``lock_output``)."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from kvcheck.atomic import write_atomic
from kvcheck.lock import OutputBusyError, OutputLock, acquire_output_lock
from kvcheck.results.errors import OutputPathError
from kvcheck.results.schema import dump_lines, validate_record

__all__ = ["OutputPathError", "check_output_path", "lock_output", "write_atomic",
           "write_records"]


def _same_file(a: Path, b: Path) -> bool:
    try:
        if a.resolve() == b.resolve():
            return True
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_output_path(path: str | Path, option: str, inputs: Iterable[str | Path] = (),
                      example: str = "out.txt", *,
                      input_options: Mapping[str, str | Path] | None = None,
                      output_options: Mapping[str, str | Path] | None = None) -> Path:
    """Refuse, before anything is read or written, an output that would destroy an input
    or another output, or cannot be written: the one check every kvcheck output passes (the
    CLIs' ``-o`` / ``--markdown`` / ``--report``, the plugins' ``--kv-report`` and
    ``--kv-bench-report``).

    Refused: an empty path; a path ending in a separator (it names a folder); one of
    ``inputs`` or of the files of ``input_options`` / ``output_options`` (the same path once
    resolved, or the same file through a symlink or hard link); a directory; an existing
    file that is not a regular one (a device such as ``/dev/stdout``, a FIFO, a socket:
    the atomic write would replace it); a place whose folder cannot be created or written
    into (checked with a trial file in the nearest existing folder, removed at once).
    Nothing is left behind: missing parent folders are created later by ``write_atomic``.

    Args:
        path: the output path given on the command line.
        option: how the user gave it (``"-o"``, ``"--markdown"``), for the message.
        inputs: the files the command reads (records).
        example: a file name for the suggested fix.
        input_options: other options' input files, by option (``{"--kv-skips-file": p}``).
        output_options: the same run's other outputs, by option (``{"--kv-report": p}``).

    Raises:
        OutputPathError: ``"OPTION PATH: problem; fix"`` (the fix is after the last ``; ``).
    """
    def refuse(problem: str, fix: str) -> OutputPathError:
        return OutputPathError(f"{option} {path}: {problem}; {fix}")

    if not str(path).strip():
        raise refuse("empty path", f"name a file, e.g. {option} {example}")
    if str(path).endswith(("/", os.sep)):
        raise refuse("ends in a path separator, so it names a folder, not a file",
                     f"name a file, e.g. {option} {Path(path) / example}")
    target = Path(path)
    for source in inputs:
        if _same_file(target, Path(source)):
            raise refuse(f"is also an input file ({source}); writing there would replace "
                         "the records with the report",
                         f"write the output to another file, e.g. {option} {example}")
    for other, source in (input_options or {}).items():
        if _same_file(target, Path(source)):
            raise refuse(f"is also the {other} input ({source}), which writing there would "
                         "destroy", f"write the output to another file, e.g. {option} "
                         f"{example}")
    for other, source in (output_options or {}).items():
        if _same_file(target, Path(source)):
            raise refuse(f"is also the {other} output ({source}), and one would replace the "
                         "other", f"write each to its own file, e.g. {option} {example}")
    if target.is_dir():
        raise refuse("is a directory", f"name a file inside it, e.g. {option} "
                     f"{target / example}")
    if target.exists() and not target.is_file():
        raise refuse(f"is not a regular file (a {_file_kind(target)}), which the atomic "
                     "write would replace", f"name a regular file, e.g. {option} {example}")
    # The nearest folder that exists: write_atomic creates the missing ones below it, so a
    # trial file there (removed at once) proves the write can happen, without creating
    # anything that would stay behind if the command then fails on its input.
    folder = target.absolute().parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        if not folder.is_dir():
            raise NotADirectoryError(f"{folder} is not a directory")
        fd, trial = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".probe", dir=folder)
        os.close(fd)
        os.unlink(trial)
    except OSError as exc:
        raise refuse(f"cannot write there ({exc.strerror or exc})",
                     "name a file in a folder you can write to") from None
    return target


def _file_kind(path: Path) -> str:
    mode = path.stat().st_mode
    for test, kind in ((stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISFIFO, "named pipe"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return kind
    return "special file"


def lock_output(path: str | Path, option: str, example: str = "out.txt") -> OutputLock:
    """Claim ``path`` for this process until ``release`` (``kvcheck.lock``): a second run
    writing the same file at once is refused before it starts, naming the first.

    Raises:
        OutputPathError: another live process holds the claim, or the lock file cannot be
            created; the same ``"OPTION PATH: problem; fix"`` form as ``check_output_path``.
    """
    try:
        return acquire_output_lock(path)
    except OutputBusyError as exc:
        holder = f" ({exc.holder})" if exc.holder else ""
        raise OutputPathError(
            f"{option} {path}: another kvcheck run is writing this file{holder}, and one "
            f"record would be lost; wait for it to finish, or write to another file, e.g. "
            f"{option} {example}") from None
    except OSError as exc:
        raise OutputPathError(f"{option} {path}: cannot lock it for writing "
                              f"({exc.strerror or exc}); name a file in a folder you can "
                              "write to") from None


def write_records(path: str | Path, records: Iterable[Mapping[str, object]]) -> Path:
    """Validate then atomically write records as JSON Lines (replacing the file)."""
    records = [validate_record(dict(r), f"record {i}") for i, r in enumerate(records)]
    return write_atomic(path, dump_lines(records))
