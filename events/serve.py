"""``kvcheck events serve``: the reference engine's KV events, published as vLLM publishes
them, with the faults a router's consumer must survive.

The workload is the reference manager's seeded random scheduler workload
(``workload.manager_streams``: shared prefixes, decode steps, frees, LoRA, salts, prefix-cache
resets) on one engine, one batch per scheduler step with events, encoded in the release's
exact bytes (``encode_batch``) and sent by ``EventPublisher`` (vLLM's framing and replay).

Faults, each named by the batch number it hits (0 = the first batch published):

* ``drop``: the batch is buffered for replay but never sent live, as PUB drops past its
  high-water mark: a live subscriber sees a sequence gap;
* ``duplicate``: the batch is sent twice (an at-least-once transport redelivering);
* ``restart_at``: from this batch on, a new engine process: a fresh manager (an empty cache),
  sequence numbers from 0 again and an empty replay buffer.

A replay start older than the buffer comes from a small ``buffer_steps``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from kvcheck.events.codec import Release, encode_batch
from kvcheck.events.publisher import EventPublisher
from kvcheck.events.workload import StepBatch, manager_streams

__all__ = ["Faults", "ServeSummary", "serve"]


@dataclass(frozen=True)
class Faults:
    """Batch numbers (from 0, in publishing order) each fault hits."""

    drop: frozenset[int] = frozenset()
    duplicate: frozenset[int] = frozenset()
    restart_at: int | None = None

    def describe(self) -> str:
        parts = [f"{name} batch(es) {sorted(numbers)}" for name, numbers in
                 (("dropped", self.drop), ("duplicated", self.duplicate)) if numbers]
        if self.restart_at is not None:
            parts.append(f"restart at batch {self.restart_at}")
        return "; ".join(parts) or "none"


@dataclass(frozen=True)
class ServeSummary:
    batches: int
    events: int
    sent: int


def _engine_batches(release: Release, seed: int, restart_at: int | None) -> Iterator[StepBatch]:
    """One engine's endless stream; from batch ``restart_at`` on, a fresh engine's."""
    first = next(manager_streams(release, seed, steps=None))
    if restart_at is None:
        yield from first
        return
    yield from itertools.islice(first, restart_at)
    yield from next(manager_streams(release, seed + 1, steps=None))


def serve(publisher: EventPublisher, *, release: Release, batches: int, seed: int = 0,
          int_hashes: bool = True, data_parallel_rank: int | None = 0,
          interval_s: float = 0.0, faults: Faults = Faults(),
          on_batch: Callable[[int, int], None] | None = None) -> ServeSummary:
    """Publish ``batches`` batches of the reference's events on ``publisher``.

    ``on_batch(number, seq)`` is called after each batch is published. The payload's ``ts``
    is the batch number (reproducible bytes for a given seed).
    """
    events = sent = 0
    source = _engine_batches(release, seed, faults.restart_at)
    for number in range(batches):
        batch = next(source)
        if number == faults.restart_at:
            publisher.restart()
        payload = encode_batch(
            batch.events, ts=float(number), data_parallel_rank=data_parallel_rank,
            release=release, int_hashes=int_hashes,
            group_metadata=batch.group_metadata if release == "vllm-0.33" else None)
        copies = 0 if number in faults.drop else 2 if number in faults.duplicate else 1
        seq = publisher.publish(payload, copies=copies)
        events += len(batch.events)
        sent += copies
        if on_batch is not None:
            on_batch(number, seq)
        if interval_s:
            time.sleep(interval_s)
    return ServeSummary(batches=batches, events=events, sent=sent)
