"""Random KV event batches from the reference manager, one per scheduler step.

A seeded random workload (new requests sharing prefixes, decode steps, frees, prefix-cache
resets) drives ``kvcheck.reference_impl.KVCacheManager`` with events on; every step that
emits events gives one batch, as vLLM's scheduler publishes them. Layouts per release: one
full-attention group of several block sizes, and for 0.33 full attention beside sliding
windows (null blocks, ``group_idx`` > 0, spec metadata). 0.10.2 runs one group only: it turns
the hybrid KV-cache manager off when KV events are configured.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from kvcheck.reference_impl.events import KVCacheEvent
from kvcheck.reference_impl.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheSpec,
    SlidingWindowSpec,
)
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager
from kvcheck.reference_impl.profiles import get_profile
from kvcheck.reference_impl.request import LoRARequest, MultiModalFeature, Request

__all__ = ["LAYOUTS", "StepBatch", "manager_streams", "random_batches"]

LAYOUTS: Final[dict[str, tuple[tuple[KVCacheSpec, ...], ...]]] = {
    "vllm-0.33": (
        (FullAttentionSpec(4),),
        (FullAttentionSpec(16),),
        (FullAttentionSpec(4), SlidingWindowSpec(4, sliding_window=6)),
        (FullAttentionSpec(8), SlidingWindowSpec(8, sliding_window=12),
         SlidingWindowSpec(8, sliding_window=30)),
    ),
    "vllm-0.10": ((FullAttentionSpec(4),), (FullAttentionSpec(16),)),
}
_LORA: Final = LoRARequest("adapter-a", 3, "/loras/a")


@dataclass(frozen=True, slots=True)
class StepBatch:
    """One step's events and the manager's per-group ``(kind, sliding_window)``."""

    events: tuple[KVCacheEvent, ...]
    group_metadata: tuple[tuple[str, int | None], ...]


def _new_request(rng: random.Random, mgr: KVCacheManager, prefixes: list[list[int]],
                 number: int, tagged: bool) -> Request:
    prompt = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(1, 40))]
    options: dict[str, object] = {}
    if rng.random() < 0.2:
        options["lora_request"] = _LORA
    if rng.random() < 0.15:
        options["cache_salt"] = rng.choice(["salt-1", "salt-2"])
    if tagged and rng.random() < 0.15 and len(prompt) > 6:
        options["mm_features"] = [MultiModalFeature("img-" + str(rng.randrange(3)), 2, 4)]
    return mgr.make_request(f"r{number}", prompt, **options)  # type: ignore[arg-type]


def _schedule(mgr: KVCacheManager, req: Request) -> bool:
    hits, num_hit = (None, 0)
    if not any(mgr.get_blocks(req.request_id)):
        hits, num_hit = mgr.get_computed_blocks(req)
    num_new = req.num_tokens - req.num_computed_tokens - num_hit
    if mgr.allocate_slots(req, num_new, num_hit, hits) is None:
        return False
    req.num_computed_tokens += num_hit + num_new
    return True


def random_batches(release: str, seed: int, count: int) -> Iterator[StepBatch]:
    """``count`` batches of release ``release``'s reference events, reproducible by ``seed``
    (managers of random layouts and pool sizes, one after another, 60 steps each)."""
    made = 0
    for stream in manager_streams(release, seed):
        for batch in stream:
            yield batch
            made += 1
            if made == count:
                return


def manager_streams(release: str, seed: int,
                    steps: int | None = 60) -> Iterator[Iterator[StepBatch]]:
    """Endless, reproducible by ``seed``: per fresh manager of a random layout and pool size,
    the batches of its ``steps`` random scheduler steps (None: endless), in order: each one
    complete stream of one engine (from an empty cache), as a subscriber from sequence 0
    sees it. Consume each stream before asking for the next (they share one random
    generator)."""
    rng = random.Random(seed)
    profile = get_profile(release)
    number = 0
    while True:
        layout = rng.choice(LAYOUTS[release])
        # 0.33's retention interval masks blocks out of a window's cache: sparse stores.
        retention = (layout[0].block_size * rng.choice((0, 1, 2))
                     if any(isinstance(s, SlidingWindowSpec) for s in layout) else None)
        mgr = KVCacheManager(
            rng.randrange(12, 48), kv_cache_specs=layout, profile=release,
            enable_kv_cache_events=True, hash_algo=rng.choice(profile.hash_algos),
            pythonhashseed=str(rng.randrange(9)), prefix_cache_retention_interval=retention)
        prefixes = [[rng.randrange(50) for _ in range(rng.randrange(0, 40))] for _ in range(3)]
        stream = _steps(rng, mgr, prefixes, number, profile.extra_key_format == "tagged",
                        steps)
        yield stream
        for _ in stream:  # drain what the caller left, so the generator stays reproducible
            pass
        number += 1000


def _steps(rng: random.Random, mgr: KVCacheManager, prefixes: list[list[int]], number: int,
           tagged: bool, steps: int | None) -> Iterator[StepBatch]:
    running: list[Request] = []
    for _ in itertools.count() if steps is None else range(steps):
        roll = rng.random()
        if roll < 0.35 or not running:
            number += 1
            req = _new_request(rng, mgr, prefixes, number, tagged)
            if _schedule(mgr, req):
                running.append(req)
        elif roll < 0.75:
            req = rng.choice(running)
            req.append_output_token_ids([rng.randrange(50)
                                         for _ in range(rng.randrange(1, 9))])
            if not _schedule(mgr, req):
                running.remove(req)
                mgr.free(req)
        elif roll < 0.97:
            mgr.free(running.pop(rng.randrange(len(running))))
        else:  # finish everything, then reset: AllBlocksCleared
            for req in running:
                mgr.free(req)
            running.clear()
            mgr.reset_prefix_cache()
        events = mgr.take_events()
        if events:
            yield StepBatch(tuple(events), mgr.kv_cache_event_metadata)
