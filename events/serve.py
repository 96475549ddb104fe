"""``kvcheck events serve``: the reference engine's KV events, published as vLLM publishes
them, with the faults a router's consumer must survive.

The batches come from a source (``kvcheck.events.sources``): by default the reference
manager's seeded random scheduler workload (``workload.manager_streams``: shared prefixes,
decode steps, frees, LoRA, salts, prefix-cache resets) on one engine, or any implementation's
events over a scenario, a request trace or a recorded trace; one batch per scheduler step with
events, in the release's exact bytes, sent by ``EventPublisher`` (vLLM's framing and replay).

Faults, each named by the batch number it hits (0 = the first batch published):

* ``drop``: the batch is buffered for replay but never sent live, as PUB drops past its
  high-water mark: a live subscriber sees a sequence gap;
* ``duplicate``: the batch is sent twice (an at-least-once transport redelivering);
* ``restart_at``: from this batch on, a new engine process: a fresh manager (an empty cache),
  sequence numbers from 0 again and an empty replay buffer;
* ``flood_from``: from this batch on, no pause between batches (``interval_s`` no longer
  applies): a subscriber slower than the flood fills its queue past the high-water mark
  (the publisher's ``hwm`` plus its own receive HWM and the transport's buffers) and ZMQ drops
  batches for it, silently, as a slow consumer of a busy engine loses them: gaps it must
  detect and fill by replay. Unlike ``drop``, which batches are lost depends on the
  subscriber's speed.

A replay start older than the buffer comes from a small ``buffer_steps``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from kvcheck.errors import KVCheckInputError
from kvcheck.events.codec import Release
from kvcheck.events.publisher import EventPublisher
from kvcheck.events.sources import BatchSource, reference_source

__all__ = ["Faults", "ServeSummary", "serve"]


@dataclass(frozen=True)
class Faults:
    """Batch numbers (from 0, in publishing order) each fault hits."""

    drop: frozenset[int] = frozenset()
    duplicate: frozenset[int] = frozenset()
    restart_at: int | None = None
    flood_from: int | None = None

    def named(self) -> set[int]:
        """Every batch number a fault names."""
        starts = {n for n in (self.restart_at, self.flood_from) if n is not None}
        return {*self.drop, *self.duplicate, *starts}

    def describe(self) -> str:
        parts = [f"{name} batch(es) {sorted(numbers)}" for name, numbers in
                 (("dropped", self.drop), ("duplicated", self.duplicate)) if numbers]
        if self.restart_at is not None:
            parts.append(f"restart at batch {self.restart_at}")
        if self.flood_from is not None:
            parts.append(f"flood from batch {self.flood_from}")
        return "; ".join(parts) or "none"


@dataclass(frozen=True)
class ServeSummary:
    batches: int
    events: int
    sent: int


def serve(publisher: EventPublisher, *, release: Release, batches: int | None, seed: int = 0,
          int_hashes: bool = True, data_parallel_rank: int | None = 0,
          interval_s: float = 0.0, faults: Faults = Faults(),
          on_batch: Callable[[int, int], None] | None = None,
          source: BatchSource | None = None) -> ServeSummary:
    """Publish ``batches`` batches (None: every batch ``source`` has) on ``publisher``.

    ``source``: where the batches come from (``kvcheck.events.sources``); None: the
    reference's seeded random engine (``seed``, ``int_hashes``), endless. ``on_batch(number,
    seq)`` is called after each batch is published. A finite source may end before
    ``batches``: the summary counts what was published.
    """
    if source is None:
        if batches is None:
            raise KVCheckInputError("the reference's random engine is endless: give batches")
        source = reference_source(release, seed, int_hashes=int_hashes,
                                  data_parallel_rank=data_parallel_rank)
    events = sent = number = 0
    stream = source(0)
    while batches is None or number < batches:
        if number == faults.restart_at:
            publisher.restart()
            stream = source(1)
        batch = next(stream, None)
        if batch is None:
            break
        copies = 0 if number in faults.drop else 2 if number in faults.duplicate else 1
        seq = publisher.publish(batch.payload, copies=copies)
        events += batch.events
        sent += copies
        if on_batch is not None:
            on_batch(number, seq)
        number += 1
        if interval_s and (faults.flood_from is None or number < faults.flood_from):
            time.sleep(interval_s)
    return ServeSummary(batches=number, events=events, sent=sent)
