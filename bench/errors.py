"""Every error the benchmarks raise, in one place (each also importable from the module that
raises it). Input errors end a command with exit status 2 and the message; an unavailable
provider or counter is a skip reason."""

from __future__ import annotations

from kvcheck.errors import KVCheckError, KVCheckFailure, KVCheckInputError

__all__ = ["BenchCheckFailure", "CountingUnavailable", "ProviderUnavailable", "TraceFileError"]


class BenchCheckFailure(KVCheckFailure):
    """A benchmark's own check of the implementation failed while it was timed (an answer
    unlike the reference's, a kernel output off its torch reference): the figures of a wrong
    implementation are not recorded."""


class TraceFileError(KVCheckInputError):
    """A trace file that cannot be read or replayed; the message names the file, the line,
    the field, the limit and (``fix``, also at the end of the message) what to do."""

    def __init__(self, problem: str, fix: str = "") -> None:
        super().__init__(f"{problem}; fix: {fix}" if fix else problem)
        self.problem = problem
        self.fix = fix



class CountingUnavailable(KVCheckInputError):
    """Instructions cannot be counted here (no valgrind); the message says how to fix it."""



class ProviderUnavailable(KVCheckError):
    """The provider cannot run this op here; the message is the skip reason."""

