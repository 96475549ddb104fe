"""Every error the conformance harness raises, in one place.

Two kinds, as ``kvcheck.errors`` defines them:

* failures of the implementation under test (``KVCheckFailure``, an ``AssertionError``, so
  pytest reports a failed test): a broken protocol rule, a disagreement with the oracle or
  a golden scenario, a broken law, a hung call, a ``BaseException`` raised by an adapter,
  memory past the limit;
* unusable input (``KVCheckInputError``, a ``ValueError``): an implementation that cannot be
  loaded, a trace or corpus that cannot be replayed, a harness call against its own rules.

``UnsupportedSpec`` is neither: the adapter declines a spec its design does not support, and
the test is not applicable. Each class is also importable from the module that raises it.
"""

from __future__ import annotations

from kvcheck.errors import KVCheckError, KVCheckFailure, KVCheckInputError

__all__ = [
    "AdapterRaised",
    "AdapterTimeout",
    "ConformanceMismatch",
    "CorpusError",
    "GoldenMismatch",
    "ImplLoadError",
    "IndexerMismatch",
    "MemoryLimitExceeded",
    "OffloadLawBroken",
    "OffloadMismatch",
    "PinningMisuse",
    "ProtocolViolation",
    "SizingAnswerError",
    "SpecMutated",
    "TraceError",
    "UnsupportedSpec",
]


class UnsupportedSpec(KVCheckError):
    """Raised by a factory to decline a spec its design does not support (a block size, a
    pool size...). A scripted test whose spec is declined is skipped as not applicable;
    random workloads draw another spec. Declare the supported sizes in ``ImplInfo`` where
    you can (``block_sizes``, ``num_blocks_range``): declared limits are visible up front."""



class ImplLoadError(KVCheckInputError):
    """An implementation cannot be loaded; the message (``kvcheck: --kv-impl=X: problem`` then
    ``  Fix: ...``) names the problem and the fix."""



class TraceError(KVCheckInputError):
    """A trace file that cannot be replayed; the message names the file, the op and the
    problem."""



class CorpusError(KVCheckInputError):
    """A corpus file that cannot be used; the message names the file, the trace and the
    step."""



class PinningMisuse(KVCheckInputError):
    """kvcheck (or a test) broke the lookup rule of ``pinning_lookup``: a request was looked
    up again, or freed, while its last lookup's pins were outstanding. A harness bug, never
    the implementation's fault."""



class ProtocolViolation(KVCheckFailure):
    """An adapter answer breaks the protocol (a type, a range, a consistency rule)."""



class SpecMutated(ProtocolViolation):
    """An adapter wrote to a spec it was given (``object.__setattr__`` on a frozen spec or on
    one of its groups, a list swapped in...)."""



class SizingAnswerError(KVCheckFailure):
    """A sizing function answered with the wrong type or an impossible value."""



class AdapterTimeout(KVCheckFailure):
    """An adapter call did not return within the per-call limit (``--kv-timeout``)."""



class AdapterRaised(KVCheckFailure):
    """An adapter call raised a ``BaseException`` that is not an ``Exception`` (or called
    ``pytest.exit()``); ``raised_name`` is that exception's class name (the repro's comment)."""

    def __init__(self, message: str, raised_name: str) -> None:
        super().__init__(message)
        self.raised_name = raised_name



class MemoryLimitExceeded(KVCheckFailure):
    """The test process's memory grew past ``--kv-max-memory``."""



class ConformanceMismatch(KVCheckFailure):
    """The implementation and the oracle disagree (or a law broke) after some op."""



class GoldenMismatch(KVCheckFailure):
    """The implementation left a golden scenario: the message names the scenario, the row,
    the call, the column and both values, with the calls made so far."""



class IndexerMismatch(KVCheckFailure):
    """An indexer's answer differs from the truth (the message names the worker, the probe,
    both answers, the last deliveries and the repro)."""



class OffloadLawBroken(KVCheckFailure):
    """An answer no correct offload tier gives (the message names the call and the law)."""



class OffloadMismatch(KVCheckFailure):
    """The implementation's tier broke a law or answered unlike the oracle's."""

