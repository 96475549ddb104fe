"""A hybrid allocator benchmark: continuous batching on a grouped spec (1 full-attention group
and 5 sliding-window groups), through the per-group protocol (``SupportsKVCacheGroups``).

``make_hybrid_workload(scenario, seed, scale)`` returns a ``HybridWorkload``: a seeded trace
(a ``workloads.Workload``, drawn as ``workloads.py`` draws: raw PCG64, integers only) plus the
KV-cache groups it is replayed on. ``HybridBench`` is a ``RoundBench`` like
``allocator.SchedulerBench``: each round replays the trace on a fresh manager through the
scheduler loop (``scheduler.run_workload``, observing the grouped spec's tables) and reports
the scheduler figures (``allocator.scheduler_metrics``); ``info()["produced"]`` adds what the
replay produced per group (live and null block-steps, peak live blocks, blocks freed by the
window).

Scenarios (lengths in tokens, block size 16, token budget 2048 per step, ``U[a, b]`` uniform
integers, ``B{...}`` buckets ``[lo, hi]: weight``), both on the layout
``HYBRID_GROUPS`` = full, SWA 1024, SWA 4096, SWA 1024, SWA 4096, SWA 1024:

* ``hybrid_shared_prompt``: 3 system prompts of 2048 tokens (weights 3:2:1) followed by a
  document B{[256,1023]:3, [1024,4095]:5, [4096,6143]:2}; output B{[16,63]:3, [64,255]:1};
  48 requests, inter-arrival U[0, 3] steps, up to 16 running; pool at 30 % of the working set
  (preemptions, cached prefixes evicted).
* ``hybrid_long_context``: 8 prompts U[8192, 16384] that share their first 4096 tokens in
  pairs, output U[32, 128], inter-arrival U[0, 8], up to 4 running; pool at 40 %.

``scale`` multiplies the request counts (``workloads.scaled_count``). Working set: the
full-attention group's distinct blocks (``workloads.working_set_blocks``) plus, per sliding
group, each request's steady-state window (``cdiv(w - 1, bs) + 1`` blocks, or its whole length
when shorter). The pool is never smaller than the largest request's peak
(``request_peak_blocks``), so every trace can finish.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

from kvcheck.bench.measure.allocator import SchedulerBench
from kvcheck.bench.replay.scheduler import SchedulerManager, SchedulerRun, run_workload
from kvcheck.bench.workload.scenarios import (
    DEFAULT_BLOCK_SIZE,
    Draws,
    RequestSpec,
    Workload,
    scaled_count,
    working_set_blocks,
)
from kvcheck.conformance.loader import ImplHandle
from kvcheck.conformance.pinning import declares_pinning
from kvcheck.conformance.protocol import KVCacheGroupSpec, KVCacheSpec
from kvcheck.errors import KVCheckInputError

__all__ = [
    "HYBRID_GROUPS",
    "HYBRID_SCENARIOS",
    "HybridBench",
    "HybridWorkload",
    "describe_groups",
    "hybrid_spec",
    "make_hybrid_workload",
    "request_peak_blocks",
]

_FULL = KVCacheGroupSpec("full_attention")
_SWA_1K = KVCacheGroupSpec("sliding_window", sliding_window=1024)
_SWA_4K = KVCacheGroupSpec("sliding_window", sliding_window=4096)

#: 1 full-attention group to 5 sliding-window groups, windows 1024 and 4096 mixed.
HYBRID_GROUPS: tuple[KVCacheGroupSpec, ...] = (_FULL, _SWA_1K, _SWA_4K, _SWA_1K, _SWA_4K,
                                               _SWA_1K)

_BUDGET = 2048  # max_num_batched_tokens


@dataclass(frozen=True)
class HybridWorkload:
    """A trace (``workload``) and the KV-cache groups it is replayed on."""

    workload: Workload
    groups: tuple[KVCacheGroupSpec, ...]

    @property
    def scenario(self) -> str:
        return self.workload.scenario


@dataclass(frozen=True)
class _HybridShape:
    requests: list[RequestSpec]
    distributions: dict[str, str]
    max_num_seqs: int
    pool_fraction: float


def _shared_prompt(d: Draws, scale: float) -> _HybridShape:
    document = ((256, 1023, 3), (1024, 4095, 5), (4096, 6143, 2))
    output = ((16, 63, 3), (64, 255, 1))
    systems = [d.tokens(2048) for _ in range(3)]
    requests, step = [], 0
    for i in range(scaled_count(48, scale)):
        prompt = systems[d.weighted([3, 2, 1])] + d.tokens(d.bucketed(document))
        requests.append(RequestSpec(f"hssp-{i:05d}", step, prompt,
                                    d.tokens(d.bucketed(output))))
        step += d.int(0, 3)
    return _HybridShape(requests, {
        "system_prompts": "3 x 2048, weights 3:2:1",
        "document": "B{[256,1023]:3, [1024,4095]:5, [4096,6143]:2}",
        "output": "B{[16,63]:3, [64,255]:1}", "inter_arrival_steps": "U[0,3]",
        "requests": "48 x scale", "pool": "30% of the working set"},
        max_num_seqs=16, pool_fraction=0.3)


def _long_context(d: Draws, scale: float) -> _HybridShape:
    requests, step = [], 0
    shared: tuple[int, ...] = ()
    for i in range(scaled_count(8, scale)):
        if i % 2 == 0:
            shared = d.tokens(4096)
        prompt = shared + d.tokens(d.int(8192, 16384) - 4096)
        requests.append(RequestSpec(f"hlong-{i:04d}", step, prompt,
                                    d.tokens(d.int(32, 128))))
        step += d.int(0, 8)
    return _HybridShape(requests, {
        "prompt": "U[8192,16384], first 4096 shared in pairs", "output": "U[32,128]",
        "inter_arrival_steps": "U[0,8]", "requests": "8 x scale",
        "pool": "40% of the working set"}, max_num_seqs=4, pool_fraction=0.4)


#: Scenario name -> generator. Names are the benchmark parameter ids.
HYBRID_SCENARIOS: dict[str, Callable[[Draws, float], _HybridShape]] = {
    "hybrid_shared_prompt": _shared_prompt,
    "hybrid_long_context": _long_context,
}


def _window_blocks(group: KVCacheGroupSpec, block_size: int) -> int | None:
    """Blocks a sliding-window group keeps per request in steady state (None: all)."""
    if group.kind != "sliding_window" or group.sliding_window is None:
        return None
    return math.ceil((group.sliding_window - 1) / block_size) + 1


def request_peak_blocks(num_tokens: int, groups: tuple[KVCacheGroupSpec, ...],
                        block_size: int, budget: int) -> int:
    """An upper bound on the blocks one request of ``num_tokens`` holds at once: every block in
    a full group; in a sliding group its window plus one step's chunk (and a block of
    rounding on each side), at most its whole length."""
    blocks = math.ceil(num_tokens / block_size)
    total = 0
    for group in groups:
        window = _window_blocks(group, block_size)
        total += blocks if window is None else min(
            blocks, window + math.ceil(budget / block_size) + 2)
    return total


def _working_set(requests: list[RequestSpec], groups: tuple[KVCacheGroupSpec, ...],
                 block_size: int) -> int:
    full = working_set_blocks(requests, block_size)
    total = 0
    for group in groups:
        window = _window_blocks(group, block_size)
        if window is None:
            total += full
        else:
            total += sum(min(math.ceil(r.num_tokens / block_size), window) for r in requests)
    return total


@functools.lru_cache(maxsize=8)
def make_hybrid_workload(scenario: str, seed: int = 0, scale: float = 1.0) -> HybridWorkload:
    """The trace of ``scenario`` on ``HYBRID_GROUPS`` (cached: the same arguments give the
    same object).

    Raises:
        KVCheckInputError: unknown scenario (the message lists them), ``scale <= 0``,
            ``seed < 0``.
    """
    if scenario not in HYBRID_SCENARIOS:
        raise KVCheckInputError(f"unknown hybrid scenario {scenario!r}; known: "
                                f"{', '.join(HYBRID_SCENARIOS)}")
    bs = DEFAULT_BLOCK_SIZE
    shape = HYBRID_SCENARIOS[scenario](Draws(seed, scenario), scale)
    working_set = _working_set(shape.requests, HYBRID_GROUPS, bs)
    largest = max(request_peak_blocks(r.num_tokens, HYBRID_GROUPS, bs, _BUDGET)
                  for r in shape.requests)
    num_blocks = 1 + max(largest, math.ceil(shape.pool_fraction * working_set))
    workload = Workload(
        scenario=scenario, seed=seed, scale=float(scale), block_size=bs,
        requests=tuple(shape.requests), num_blocks=num_blocks,
        max_num_seqs=shape.max_num_seqs, max_num_batched_tokens=_BUDGET,
        working_set_blocks=working_set, pool_fraction=shape.pool_fraction,
        distributions=shape.distributions)
    return HybridWorkload(workload, HYBRID_GROUPS)


def hybrid_spec(hybrid: HybridWorkload, hash_algo: str = "sha256") -> KVCacheSpec:
    """The grouped pool a hybrid workload is replayed on (profile ``vllm-0.33``: 0.10.2
    accepts only one full-attention spec and one other, and these windows are two)."""
    w = hybrid.workload
    return KVCacheSpec(num_blocks=w.num_blocks, block_size=w.block_size, hash_algo=hash_algo,
                       kv_cache_groups=hybrid.groups)


def describe_groups(groups: tuple[KVCacheGroupSpec, ...]) -> list[str]:
    """``full``, ``swa1024`` ... one short name per group, in group order."""
    return ["full" if g.kind == "full_attention" else
            f"swa{g.sliding_window}" if g.kind == "sliding_window" else
            f"chunk{g.attention_chunk_size}" for g in groups]


class HybridBench(SchedulerBench):
    """One hybrid workload per round through ``run_workload`` on a fresh manager of the
    grouped spec (``SchedulerBench`` with another pool, its tables observed per group).

    ``setup`` raises ``UnsupportedSpec`` when the implementation declines the grouped spec.
    """

    native_level = False  # the manager-level hook covers single-group pools only

    def __init__(self, impl: ImplHandle, hybrid: HybridWorkload) -> None:
        super().__init__(impl, hybrid.workload)
        self.hybrid = hybrid

    def spec(self) -> KVCacheSpec:
        return hybrid_spec(self.hybrid)

    def replay(self, manager: SchedulerManager) -> SchedulerRun:
        return run_workload(manager, self.workload, pinning=declares_pinning(self.impl),
                            observe=self.spec())

    def info(self) -> dict[str, object]:
        return {**super().info(), "kv_cache_groups": describe_groups(self.hybrid.groups)}

    def produced(self) -> dict[str, object]:
        """What the first measured round produced (replays are deterministic): hit rate,
        preemptions, peak usage, steps, and per group (lists in group order) live and null
        block-steps, null fraction, peak live blocks, blocks freed by the window and hit
        padding nulls. Empty before any round."""
        if not self.results:
            return {}
        run: SchedulerRun = self.results[0]
        return {"prefix_hit_rate": run.prefix_hit_rate, "preemptions": float(run.preemptions),
                "peak_usage": run.peak_usage, "steps": float(run.steps),
                "live_block_steps": list(run.live_block_steps),
                "null_block_steps": list(run.null_block_steps),
                "null_fraction": list(run.null_fractions),
                "peak_live_blocks": list(run.peak_live_blocks),
                "window_freed_blocks": list(run.window_freed_blocks),
                "hit_null_blocks": list(run.hit_null_blocks)}
