"""Atomic result-file writes (a reader never sees a half-written file), and the checks an
output path passes before a command computes anything (``check_output_path``)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kvcheck.atomic import write_atomic
from kvcheck.errors import KVCheckInputError
from kvcheck.results.schema import dump_lines, validate_record

__all__ = ["OutputPathError", "check_output_path", "write_atomic", "write_records"]


class OutputPathError(KVCheckInputError):
    """An output path that cannot (or must not) be written; the message names the fix."""


def _same_file(a: Path, b: Path) -> bool:
    try:
        if a.resolve() == b.resolve():
            return True
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_output_path(path: str | Path, option: str, inputs: Iterable[str | Path] = (),
                      example: str = "out.txt") -> Path:
    """Refuse, before anything is read or written, an output that would destroy an input
    or cannot be written.

    Refused: an empty path; one of ``inputs`` (the same path once resolved, or the same file
    through a link); a directory; a place whose folder cannot be created or written into
    (checked with a trial file in the nearest existing folder, removed at once). Nothing is
    left behind: missing parent folders are created later by ``write_atomic``.

    Args:
        path: the output path given on the command line.
        option: how the user gave it (``"-o"``, ``"--markdown"``), for the message.
        inputs: the files the command reads.
        example: a file name for the suggested fix.

    Raises:
        OutputPathError: naming the path, the problem and the fix.
    """
    def refuse(problem: str, fix: str) -> OutputPathError:
        return OutputPathError(f"{option} {path}: {problem}; {fix}")

    if not str(path).strip():
        raise refuse("empty path", f"name a file, e.g. {option} {example}")
    target = Path(path)
    for source in inputs:
        if _same_file(target, Path(source)):
            raise refuse(f"is also an input file ({source}); writing there would replace "
                         "the records with the report",
                         f"write the output to another file, e.g. {option} {example}")
    if target.is_dir():
        raise refuse("is a directory", f"name a file inside it, e.g. {option} "
                     f"{target / example}")
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


def write_records(path: str | Path, records: Iterable[Mapping[str, Any]]) -> Path:
    """Validate then atomically write records as JSON Lines (replacing the file)."""
    records = [validate_record(dict(r), f"record {i}") for i, r in enumerate(records)]
    return write_atomic(path, dump_lines(records))
