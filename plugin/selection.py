"""Skip / xfail files: plain lists of test-id substrings, ``#`` comments allowed.

A line matches every collected test whose node id contains it, so ``test_eviction.py::`` targets
a module, ``test_free_order_golden`` a test and ``[my-impl]`` one implementation. Lines that
match nothing are reported (a typo must not silently keep a known failure hidden).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest

__all__ = ["apply_id_file", "read_id_file"]


def read_id_file(path: str | Path, option: str) -> list[str]:
    """Non-empty, non-comment lines of ``path`` (text after ``#`` is dropped).

    Raises:
        pytest.UsageError: the file cannot be read.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise pytest.UsageError(
            f"kvcheck: {option}={path}: cannot read it ({exc.strerror or exc})\n"
            "  Fix: pass an existing text file with one test-id substring per line"
        ) from None
    ids = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            ids.append(line)
    return ids


def apply_id_file(items: Iterable[pytest.Item], ids: list[str], mark: pytest.MarkDecorator,
                  option: str) -> list[str]:
    """Add ``mark`` to every item whose node id contains one of ``ids``.

    Returns:
        Warnings for the ids that matched no collected test.
    """
    matched: set[str] = set()
    for item in items:
        for test_id in ids:
            if test_id in item.nodeid:
                item.add_marker(mark)
                matched.add(test_id)
    return [
        f"{option}: {test_id!r} matches no collected test (typo, or a renamed test?)"
        for test_id in ids
        if test_id not in matched
    ]
