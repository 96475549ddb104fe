"""kvcheck's one error family.

Every error kvcheck raises on purpose derives from ``KVCheckError``, so a caller (the CLI, a CI
script) catches one type. Two branches say whose fault it is:

* ``KVCheckInputError`` (also a ``ValueError``): bad input or misuse: a wrong option, a
  malformed file or trace, a call the protocol forbids. The message names the problem and the
  fix.
* ``KVCheckFailure`` (also an ``AssertionError``): the implementation under test broke a rule:
  a mismatch with the oracle, a broken law or invariant, a protocol violation, a hung call.
  pytest reports these as test failures.

This module sits in the parent package and imports nothing, so every subpackage may use it.
"""

from __future__ import annotations

__all__ = ["KVCheckError", "KVCheckFailure", "KVCheckInputError"]


class KVCheckError(Exception):
    """Base of every error kvcheck raises on purpose."""


class KVCheckInputError(KVCheckError, ValueError):
    """Bad input or misuse; the message names the problem and the fix."""


class KVCheckFailure(KVCheckError, AssertionError):
    """The implementation under test broke a rule (a conformance failure)."""
