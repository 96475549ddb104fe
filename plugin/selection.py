"""Skip / xfail files: plain lists of test-id substrings, ``#`` comments allowed.

A line matches every collected test whose node id contains it, so ``test_eviction.py::`` targets
a module, ``test_free_order_golden`` a test and ``[my-impl]`` one implementation. Lines that
match nothing are reported (a typo must not silently keep a known failure hidden).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

__all__ = ["ID_FILE_OPTIONS", "apply_id_file", "read_id_file"]

#: The options naming files of test ids: option -> its ``config.option`` attribute.
ID_FILE_OPTIONS = {"--kv-skips-file": "kv_skips_file", "--kv-xfails-file": "kv_xfails_file"}


def read_id_file(path: str | Path, option: str) -> list[str]:
    """Non-empty, non-comment lines of ``path`` (text after ``#`` is dropped).

    Raises:
        pytest.UsageError: the file cannot be read, or is not UTF-8 text.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise pytest.UsageError(
            f"kvcheck: {option}={path}: cannot read it ({exc.strerror or exc})\n"
            "  Fix: pass an existing text file with one test-id substring per line"
        ) from None
    nul = data.find(b"\0")
    if nul >= 0:
        raise pytest.UsageError(
            f"kvcheck: {option}={path}: a binary file (NUL byte at offset {nul}), not a list "
            "of test ids\n  Fix: pass a UTF-8 text file with one test-id substring per line")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise pytest.UsageError(
            f"kvcheck: {option}={path}: not UTF-8 text (byte {data[exc.start]:#04x} at offset "
            f"{exc.start}, line {line})\n  Fix: save the file as UTF-8") from None
    ids = []
    for raw_line in text.splitlines():
        test_id = raw_line.split("#", 1)[0].strip()
        if test_id:
            ids.append(test_id)
    return ids


def apply_id_file(items: Sequence[pytest.Item], ids: list[str], mark: pytest.MarkDecorator,
                  option: str) -> tuple[set[str], list[str]]:
    """Add ``mark`` to every item whose node id contains one of ``ids``.

    Returns:
        The node ids marked, and warnings for the ids that matched no collected test.

    Raises:
        pytest.UsageError: a line matches every collected test (of two or more): such a
            file would silently turn the whole run into skips or expected failures.
    """
    matched: dict[str, int] = dict.fromkeys(ids, 0)
    marked: set[str] = set()
    for item in items:
        for test_id in ids:
            if test_id in item.nodeid:
                item.add_marker(mark)
                matched[test_id] += 1
                marked.add(item.nodeid)
    if len(items) > 1:
        for test_id, count in matched.items():
            if count == len(items):
                raise pytest.UsageError(
                    f"kvcheck: {option}: the line {test_id!r} matches every collected test "
                    f"({count}), so the run could not check anything\n"
                    "  Fix: list the ids of the tests themselves (e.g. "
                    "'test_eviction.py::test_free_order_golden_test_evict'), one per line")
    warnings = [
        f"{option}: {test_id!r} matches no collected test (typo, or a renamed test?)"
        for test_id, count in matched.items()
        if count == 0
    ]
    return marked, warnings
