"""kvcheck's one error family.

Every error kvcheck raises on purpose derives from ``KVCheckError``, so a caller (the CLI, a CI
script) catches one type. Two branches say whose fault it is:

* ``KVCheckInputError`` (also a ``ValueError``): bad input or misuse: a wrong option, a
  malformed file or trace, a call the protocol forbids. The message names the problem and the
  fix.
* ``KVCheckFailure`` (also an ``AssertionError``): the implementation under test broke a rule:
  a mismatch with the oracle, a broken law or invariant, a protocol violation, a hung call.
  pytest reports these as test failures.

The leaf classes live in one ``errors`` module per layer (``kvcheck.reference_impl.errors``,
``kvcheck.conformance.errors``, ``kvcheck.events.errors``, ``kvcheck.wire.errors``,
``kvcheck.results.errors``, ``kvcheck.bench.errors``, ``kvcheck.plugin.errors``); this one
holds the bases and the core modules' own (``OutputBusyError``, of ``kvcheck.lock``).

This module sits in the parent package and imports nothing, so every subpackage may use it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: this module imports nothing at run time
    from pathlib import Path

__all__ = ["KVCheckError", "KVCheckFailure", "KVCheckInputError", "OutputBusyError"]


class KVCheckError(Exception):
    """Base of every error kvcheck raises on purpose."""


class KVCheckInputError(KVCheckError, ValueError):
    """Bad input or misuse; the message names the problem and the fix."""


class KVCheckFailure(KVCheckError, AssertionError):
    """The implementation under test broke a rule (a conformance failure)."""


class OutputBusyError(KVCheckInputError):
    """Another live process holds the output's lock. ``holder``: its description (pid,
    host, start time, command line) as it wrote it, or "" when unreadable."""

    def __init__(self, path: Path, holder: str) -> None:
        super().__init__(f"{path} is being written by another process"
                         + (f" ({holder})" if holder else ""))
        self.path = path
        self.holder = holder

