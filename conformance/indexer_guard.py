"""Answer validation for indexers: every call runs under the handle's call limit
(``--kv-timeout``) and every answer is checked against the protocol before it is compared with
the truth (``kvcheck.conformance.indexer_protocol``).

Rules (a broken one raises ``ProtocolViolation`` naming the call, its arguments, the answer
and the rule):

* ``match(tokens, context)`` is a mapping of worker id (``str``) to ``int`` (never ``bool``),
  each in ``[0, len(tokens) // block_size]``, naming only workers that sent a batch and were
  not removed since;
* ``apply_batch`` / ``apply_events`` / ``remove_worker`` return None; ``apply_events`` does
  not change the batch it is given (it is compared with a private copy after the call).

An exception an indexer raises passes through unchanged (a test that expects a refusal, such
as a store of another block size, checks for it; anywhere else it fails the test).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from kvcheck.conformance.call_limit import CallLimit, arg_text
from kvcheck.conformance.guard import ProtocolViolation
from kvcheck.conformance.indexer_protocol import IndexerConfig, MatchContext
from kvcheck.conformance.short_repr import short_repr

__all__ = ["GuardedIndexer"]


class GuardedIndexer:
    """An indexer whose every call is limited and every answer validated.

    ``known`` is the set of worker ids the index may name (those given a batch and not
    removed since); ``decoded`` says whether it takes ``apply_events`` (``decoded_events``).
    """

    # Any: the implementation's object, whose methods are looked up by name; their answers
    # are checked as they come back.
    def __init__(self, raw: Any, *, impl: str, config: IndexerConfig, limit: CallLimit,
                 decoded: bool) -> None:
        self.raw = raw
        self.impl = impl
        self.config = config
        self.decoded = decoded
        self.known: set[str] = set()
        self.ever: set[str] = set()  # every worker given a batch, removed ones included
        self._limit = limit

    def __repr__(self) -> str:
        return f"<GuardedIndexer of {self.raw!r}>"

    def _violation(self, method: str, args: Sequence[object], value: object,
                   rule: str) -> ProtocolViolation:
        shown = ", ".join(arg_text(a) for a in args)
        return ProtocolViolation(f"{self.impl}.{method}({shown}) returned "
                                 f"{short_repr(value)}: {rule}")

    def _none(self, method: str, args: Sequence[object], value: object) -> None:
        if value is not None:
            raise self._violation(method, args, value, "must return None")

    def deliver(self, worker_id: str, seq: int, payload: bytes, batch: Mapping[str, object],
                replay: bool) -> None:
        """One batch, in the form the indexer takes (``payload`` bytes, or ``batch``, the
        decoded dict, for ``decoded_events``)."""
        self.known.add(worker_id)
        self.ever.add(worker_id)
        if not self.decoded:
            value = self._limit.call("apply_batch", self.raw.apply_batch, worker_id, seq,
                                     payload, replay)
            self._none("apply_batch", (worker_id, seq, f"<{len(payload)} bytes>", replay), value)
            return
        given = copy.deepcopy(dict(batch))
        value = self._limit.call("apply_events", self.raw.apply_events, worker_id, seq, given,
                                 replay)
        args = (worker_id, seq, "<batch>", replay)
        self._none("apply_events", args, value)
        if given != batch:
            raise self._violation("apply_events", args, value,
                                  "the indexer changed the batch it was given (it is "
                                  "read-only: copy what you keep)")

    def remove_worker(self, worker_id: str) -> None:
        value = self._limit.call("remove_worker", self.raw.remove_worker, worker_id)
        self._none("remove_worker", (worker_id,), value)
        self.known.discard(worker_id)

    def match(self, tokens: Sequence[int], context: MatchContext) -> dict[str, int]:
        """The index's answer, checked (see the module doc)."""
        given = list(tokens)
        value: object = self._limit.call("match", self.raw.match, given, context)
        args: tuple[object, ...] = (short_repr(tuple(tokens), 40), context)
        if not isinstance(value, Mapping):
            raise self._violation("match", args, value,
                                  f"must be a mapping of worker id to matched blocks, not a "
                                  f"{type(value).__name__}")
        most = len(tokens) // self.config.block_size
        out: dict[str, int] = {}
        for worker, blocks in value.items():
            if not isinstance(worker, str):
                raise self._violation("match", args, value,
                                      f"worker ids are str, got {short_repr(worker, 40)}")
            if worker not in self.known:
                raise self._violation(
                    "match", args, value,
                    f"names worker {worker!r}, which "
                    + ("was removed" if worker in self.ever else "never sent a batch")
                    + f" (known workers: {sorted(self.known)})")
            if type(blocks) is not int or not 0 <= blocks <= most:
                raise self._violation(
                    "match", args, value,
                    f"worker {worker!r}: matched blocks must be an int in [0, {most}] (the "
                    f"full blocks of {len(tokens)} tokens of {self.config.block_size}), got "
                    f"{short_repr(blocks, 40)}")
            out[worker] = blocks
        return out

