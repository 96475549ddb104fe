"""Every error the command line and the pytest plugin raise themselves (also importable from
the module that raises it); the conformance, results and benchmark layers keep their own."""

from __future__ import annotations

from kvcheck.errors import KVCheckInputError

__all__ = ["ScaffoldError"]


class ScaffoldError(KVCheckInputError):
    """The skeleton cannot be written (bad name, existing file, unwritable folder); the
    message names the problem and the fix."""

