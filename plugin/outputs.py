"""The files a kvcheck session or command writes, claimed before the work starts.

Every output is checked by ``kvcheck.results.io.check_output_path`` (one function, one
message style for every writer) and, when this process will write it, claimed with
``kvcheck.results.io.lock_output`` until the session ends, so a second run writing the same
file at once is refused before it runs. In a pytest session the outputs are ``--kv-report``
(the conformance plugin) and ``--kv-bench-report`` (the benchmark plugin); each is also
checked against the session's other outputs (``--junitxml``, ``--html``,
``--benchmark-json``, the other report) and inputs (``--kv-skips-file``,
``--kv-xfails-file``), whichever plugin is configured first. Only the process that writes
claims: an xdist worker, a ``--kv-inventory`` subprocess or a benchmark run's (unwritten)
``--kv-report`` only check.

``is_corpus_file`` is the cheap test ``kvcheck record -o`` applies before replacing an
existing file.
"""

from __future__ import annotations

import lzma
from collections.abc import Mapping
from pathlib import Path

import pytest

from kvcheck.plugin.selection import ID_FILE_OPTIONS
from kvcheck.results.io import OutputPathError, check_output_path, lock_output

__all__ = ["claim_session_output", "is_corpus_file", "session_outputs", "usage_error"]

#: pytest options naming files a session writes: option -> ``config.option`` attribute.
_OUTPUT_OPTIONS = {"--kv-report": "kv_report", "--kv-bench-report": "kv_bench_report",
                   "--junitxml": "xmlpath", "--html": "htmlpath",
                   "--benchmark-json": "benchmark_json", "--kv-inventory": "kv_inventory"}
#: pytest options naming files a session reads.
#: How a corpus file starts (``kvcheck.conformance.recorded``): the xz magic, then canonical
#: CBOR whose first key is ``format``.
_XZ_MAGIC = b"\xfd7zXZ\x00"
_SNIFF_BYTES = 1 << 16


def usage_error(exc: OutputPathError) -> pytest.UsageError:
    """``OPTION PATH: problem; fix`` as pytest's usage error: ``kvcheck: problem`` and a
    ``  Fix:`` line (the fix is what follows the last ``; ``)."""
    problem, _, fix = str(exc).rpartition("; ")
    return pytest.UsageError(f"kvcheck: {problem}\n  Fix: {fix}")


def _option_paths(config: pytest.Config, options: Mapping[str, str]) -> dict[str, str]:
    found = {}
    for flag, dest in options.items():
        value = getattr(config.option, dest, None)
        if value is not None and str(value).strip():
            found[flag] = str(value)
    return found


def session_outputs(config: pytest.Config) -> dict[str, str]:
    """The files this session's options say it writes, by option."""
    return _option_paths(config, _OUTPUT_OPTIONS)


def claim_session_output(config: pytest.Config, path: str, option: str, *, example: str,
                         writes: bool = True,
                         inputs: Mapping[str, str | Path] | None = None) -> None:
    """Check ``path`` (the value of ``option``) before the session runs and, if this process
    ``writes`` it, hold its lock until the session ends (``config.add_cleanup``).

    Args:
        inputs: further input files by option (the benchmark plugin's trace files).

    Raises:
        pytest.UsageError: a path ``check_output_path`` refuses, the same file as another
            of the session's outputs or inputs, or a file another live run is writing.
    """
    outputs = {flag: p for flag, p in session_outputs(config).items() if flag != option}
    try:
        check_output_path(path, option, example=example,
                          input_options={**_option_paths(config, ID_FILE_OPTIONS),
                                         **(inputs or {})},
                          output_options=outputs)
        lock = lock_output(path, option, example) if writes else None
    except OutputPathError as exc:
        raise usage_error(exc) from None
    if lock is not None:
        config.add_cleanup(lock.release)


def is_corpus_file(path: str | Path) -> bool:
    """Whether ``path`` starts as a kvcheck recorded corpus does (xz, then CBOR naming the
    corpus format); reads at most 64 KiB and decompresses a few bytes, whatever its size."""
    from kvcheck.conformance.recorded import FORMAT

    try:
        with open(path, "rb") as f:
            head = f.read(_SNIFF_BYTES)
    except OSError:
        return False
    if not head.startswith(_XZ_MAGIC):
        return False
    try:
        raw = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(head, max_length=256)
    except lzma.LZMAError:
        return False
    return FORMAT.encode() in raw[:64]
