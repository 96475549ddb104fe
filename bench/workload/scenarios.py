"""Deterministic, seeded request traces for the allocator benchmarks, by scenario name.

``make_workload(scenario, seed=0, scale=1.0)`` returns a ``Workload``: the requests (prompt
tokens, the output tokens each will "sample", arrival step, an optional predecessor) and the
scheduler limits and pool size to replay them with. The same (scenario, seed, scale) gives the
same trace on every machine and in every process: draws are raw 64-bit outputs of numpy's
``PCG64`` bit generator (a fully specified algorithm whose stream numpy keeps stable), seeded
through ``SeedSequence([seed, crc32(scenario)])`` and mapped to integers with integer-only
arithmetic (no floating point, no ``hash()``). ``Workload.digest()`` is a SHA-256 over a
canonical byte encoding of the whole trace; tests pin known digests.

Scenarios (names are the benchmark ``param`` ids; lengths in tokens, ``U[a, b]`` uniform
integers, ``B{...}`` piecewise-uniform buckets ``[lo, hi]: weight``):

* ``shared_system_prompt``: one 1024-token system prompt shared by every request (high prefix
  reuse), user suffix B{[16,63]:3, [64,255]:5, [256,511]:2}, output B{[8,31]:3, [32,127]:5,
  [128,255]:2}; 128 requests, inter-arrival U[0, 2] steps.
* ``multi_turn_chat``: 24 conversations of U[3, 8] turns sharing a 256-token system prompt;
  turn k's prompt is turn k-1's prompt + its output + a new user message
  B{[8,31]:2, [32,127]:5, [128,511]:3} (growing prefixes); output B{[16,63]:3, [64,255]:5,
  [256,511]:2}; a turn arrives U[0, 4] steps after its predecessor finishes.
* ``uniform_random``: 160 independent random prompts U[64, 1024], output U[16, 256],
  inter-arrival U[0, 1]: no reuse beyond chance.
* ``long_context``: 6 prompts U[8192, 32768], output U[32, 128], inter-arrival U[0, 16];
  prefill is chunked by the 2048-token step budget.
* ``eviction_pressure``: 32 documents U[512, 2048], request i reads document d with weight
  ``1000 // (d + 1)`` (Zipf-like), plus a question B{[8,31]:1, [32,127]:2}; output
  B{[8,63]:3, [64,127]:1}; 192 requests, inter-arrival U[0, 1], up to 32 running; **pool at
  25 % of the working set** so cached prefixes are evicted and running requests are preempted
  (seed 0, scale 1: 31 preemptions with the reference; at 50 % and 16 running there were none).
* ``burst_short``: 384 short requests all arriving at step 0: prompt U[8, 64], output U[4, 32].

``scale`` multiplies the request (conversation) counts, rounded half up, at least 1; the
lengths are the scenario's own. The pool holds ``pool_fraction`` of the trace's working set
(distinct KV blocks it ever touches, prefixes shared), and never less than the largest single
request, so every trace can finish.
"""

from __future__ import annotations

import hashlib
import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvcheck.errors import KVCheckInputError

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "SCENARIOS",
    "VOCAB_SIZE",
    "Draws",
    "RequestSpec",
    "Workload",
    "make_workload",
    "scaled_count",
    "shared_prefix_blocks",
    "trace_profile",
    "working_set_blocks",
]

VOCAB_SIZE = 32_000  # token ids are drawn from [1, VOCAB_SIZE - 1]
DEFAULT_BLOCK_SIZE = 16

Buckets = Sequence[tuple[int, int, int]]  # (lo, hi, weight), both ends inclusive


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of a trace.

    Attributes:
        request_id: unique within the trace.
        arrival_step: scheduler step at which it arrives; relative to its predecessor's finish
            when ``after`` is set (a chat turn waits for the previous answer).
        prompt_token_ids: the prompt.
        output_token_ids: the tokens it samples, in order; ``len`` is its output length
            (it finishes after sampling the last one).
        after: request id it waits for, or None.
    """

    request_id: str
    arrival_step: int
    prompt_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...]
    after: str | None = None

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)


@dataclass(frozen=True)
class Workload:
    """A trace plus the scheduler limits and pool it is replayed with.

    Attributes:
        num_blocks: pool size in blocks, the null block included (``KVCacheSpec.num_blocks``).
        max_num_seqs: most requests running at once.
        max_num_batched_tokens: token budget of one scheduler step (chunked prefill).
        working_set_blocks: distinct blocks the trace touches (``working_set_blocks``).
        distributions: the stated length / arrival distributions, for the record.
    """

    scenario: str
    seed: int
    scale: float
    block_size: int
    requests: tuple[RequestSpec, ...]
    num_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    working_set_blocks: int
    pool_fraction: float
    distributions: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(r.prompt_token_ids) for r in self.requests)

    @property
    def num_output_tokens(self) -> int:
        return sum(len(r.output_token_ids) for r in self.requests)

    def digest(self) -> str:
        """SHA-256 (hex) of a canonical encoding of the whole trace and its limits.

        Token ids are little-endian int32; strings UTF-8 with a length prefix; ``scale`` by its
        ``repr``. Independent of ``PYTHONHASHSEED``, platform and process.
        """
        h = hashlib.sha256()

        def put_str(s: str) -> None:
            data = s.encode()
            h.update(len(data).to_bytes(4, "little"))
            h.update(data)

        def put_int(i: int) -> None:
            h.update(int(i).to_bytes(8, "little", signed=True))

        put_str(self.scenario)
        put_int(self.seed)
        put_str(repr(float(self.scale)))
        for value in (self.block_size, self.num_blocks, self.max_num_seqs,
                      self.max_num_batched_tokens, len(self.requests)):
            put_int(value)
        for req in self.requests:
            put_str(req.request_id)
            put_int(req.arrival_step)
            put_str(req.after or "")
            for tokens in (req.prompt_token_ids, req.output_token_ids):
                put_int(len(tokens))
                h.update(np.asarray(tokens, dtype="<i4").tobytes())
        return h.hexdigest()


class Draws:
    """Integer draws from raw PCG64 output (no floats, so identical on every platform).

    ``label`` separates independent streams under one seed (a scenario name, a kernel case).
    """

    def __init__(self, seed: int, label: str) -> None:
        if seed < 0:
            raise KVCheckInputError(f"seed must be >= 0, got {seed}")
        seq = np.random.SeedSequence([seed, zlib.crc32(label.encode())])
        self._rng = np.random.Generator(np.random.PCG64(seq))

    def _high32(self, n: int) -> np.ndarray:
        # The high 32 bits of each raw 64-bit output, as uint64 (room for a 32x32 product).
        high: np.ndarray = self._rng.bit_generator.random_raw(n) >> np.uint64(32)
        return high

    def ints(self, lo: int, hi: int, n: int) -> list[int]:
        """``n`` integers uniform in ``[lo, hi]`` (multiply-shift: ``lo + (r * span) >> 32``)."""
        span = hi - lo + 1
        if not 1 <= span <= 2**32:
            raise KVCheckInputError(f"need lo <= hi and a span <= 2**32, got [{lo}, {hi}]")
        if n == 0:
            return []
        scaled = (self._high32(n) * np.uint64(span)) >> np.uint64(32)
        return [lo + int(x) for x in scaled]

    def tokens(self, n: int) -> tuple[int, ...]:
        """``n`` token ids uniform in ``[1, VOCAB_SIZE - 1]``."""
        if n == 0:
            return ()
        scaled = (self._high32(n) * np.uint64(VOCAB_SIZE - 1)) >> np.uint64(32)
        return tuple((scaled + np.uint64(1)).tolist())

    def permutation(self, n: int) -> np.ndarray:
        """A permutation of ``range(n)`` (int64): a stable argsort of ``n`` raw draws."""
        return np.argsort(self._rng.bit_generator.random_raw(n), kind="stable").astype(np.int64)

    def weighted(self, weights: Sequence[int]) -> int:
        """Index ``i`` with probability ``weights[i] / sum(weights)`` (integer weights)."""
        u = self.int(0, sum(weights) - 1)
        for i, w in enumerate(weights):
            if u < w:
                return i
            u -= w
        raise AssertionError("unreachable: u < sum(weights)")

    def bucketed(self, buckets: Buckets) -> int:
        """A length from piecewise-uniform buckets ``(lo, hi, weight)``."""
        lo, hi, _ = buckets[self.weighted([w for _, _, w in buckets])]
        return self.int(lo, hi)

    # Last in the class: from here on, ``int`` in this class body names this method.
    def int(self, lo: int, hi: int) -> int:
        return self.ints(lo, hi, 1)[0]


def scaled_count(base: int, scale: float) -> int:
    """``base * scale`` rounded half up, at least 1."""
    if not scale > 0:
        raise KVCheckInputError(f"scale must be > 0, got {scale}")
    return max(1, math.floor(base * scale + 0.5))


def _fmt(buckets: Buckets) -> str:
    return "B{" + ", ".join(f"[{lo},{hi}]:{w}" for lo, hi, w in buckets) + "}"


# ------------------------------------------------------------------------------------ scenarios
@dataclass(frozen=True)
class _Shape:
    requests: list[RequestSpec]
    distributions: dict[str, str]
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    pool_fraction: float = 1.0


def _shared_system_prompt(d: Draws, scale: float) -> _Shape:
    suffix = ((16, 63, 3), (64, 255, 5), (256, 511, 2))
    output = ((8, 31, 3), (32, 127, 5), (128, 255, 2))
    system = d.tokens(1024)
    requests, step = [], 0
    for i in range(scaled_count(128, scale)):
        prompt = system + d.tokens(d.bucketed(suffix))
        requests.append(RequestSpec(f"ssp-{i:05d}", step, prompt, d.tokens(d.bucketed(output))))
        step += d.int(0, 2)
    return _Shape(requests, {"system_prompt": "1024", "user_suffix": _fmt(suffix),
                             "output": _fmt(output), "inter_arrival_steps": "U[0,2]",
                             "requests": "128 x scale"}, max_num_seqs=32)


def _multi_turn_chat(d: Draws, scale: float) -> _Shape:
    user = ((8, 31, 2), (32, 127, 5), (128, 511, 3))
    output = ((16, 63, 3), (64, 255, 5), (256, 511, 2))
    system = d.tokens(256)
    requests = []
    for conv in range(scaled_count(24, scale)):
        prompt: tuple[int, ...] = system
        previous: str | None = None
        for turn in range(d.int(3, 8)):
            prompt = prompt + d.tokens(d.bucketed(user))
            out = d.tokens(d.bucketed(output))
            rid = f"chat-{conv:04d}-t{turn}"
            arrival = 3 * conv if previous is None else d.int(0, 4)
            requests.append(RequestSpec(rid, arrival, prompt, out, after=previous))
            prompt, previous = prompt + out, rid
    return _Shape(requests, {"system_prompt": "256 (shared)", "turns": "U[3,8]",
                             "user_message": _fmt(user), "output": _fmt(output),
                             "first_turn_arrival": "3 * conversation",
                             "think_steps": "U[0,4] after the previous turn finishes",
                             "conversations": "24 x scale"}, max_num_seqs=32)


def _uniform_random(d: Draws, scale: float) -> _Shape:
    requests, step = [], 0
    for i in range(scaled_count(160, scale)):
        prompt = d.tokens(d.int(64, 1024))
        requests.append(RequestSpec(f"uni-{i:05d}", step, prompt, d.tokens(d.int(16, 256))))
        step += d.int(0, 1)
    return _Shape(requests, {"prompt": "U[64,1024]", "output": "U[16,256]",
                             "inter_arrival_steps": "U[0,1]", "requests": "160 x scale"})


def _long_context(d: Draws, scale: float) -> _Shape:
    requests, step = [], 0
    for i in range(scaled_count(6, scale)):
        prompt = d.tokens(d.int(8192, 32768))
        requests.append(RequestSpec(f"long-{i:04d}", step, prompt, d.tokens(d.int(32, 128))))
        step += d.int(0, 16)
    return _Shape(requests, {"prompt": "U[8192,32768]", "output": "U[32,128]",
                             "inter_arrival_steps": "U[0,16]", "requests": "6 x scale"},
                  max_num_seqs=8)


def _eviction_pressure(d: Draws, scale: float) -> _Shape:
    question = ((8, 31, 1), (32, 127, 2))
    output = ((8, 63, 3), (64, 127, 1))
    docs = [d.tokens(d.int(512, 2048)) for _ in range(32)]
    weights = [1000 // (i + 1) for i in range(len(docs))]
    requests, step = [], 0
    for i in range(scaled_count(192, scale)):
        prompt = docs[d.weighted(weights)] + d.tokens(d.bucketed(question))
        requests.append(RequestSpec(f"evict-{i:05d}", step, prompt,
                                    d.tokens(d.bucketed(output))))
        step += d.int(0, 1)
    return _Shape(requests, {"documents": "32 x U[512,2048]",
                             "document_weight": "1000 // (d + 1)", "question": _fmt(question),
                             "output": _fmt(output), "inter_arrival_steps": "U[0,1]",
                             "requests": "192 x scale", "pool": "25% of the working set",
                             "max_num_seqs": "32"},
                  max_num_seqs=32, pool_fraction=0.25)


def _burst_short(d: Draws, scale: float) -> _Shape:
    requests = [
        RequestSpec(f"burst-{i:05d}", 0, d.tokens(d.int(8, 64)), d.tokens(d.int(4, 32)))
        for i in range(scaled_count(384, scale))
    ]
    return _Shape(requests, {"prompt": "U[8,64]", "output": "U[4,32]",
                             "arrival": "all at step 0", "requests": "384 x scale"},
                  max_num_seqs=128)


#: Scenario name -> generator. Names are used verbatim as benchmark parameter ids.
SCENARIOS: dict[str, Callable[[Draws, float], _Shape]] = {
    "shared_system_prompt": _shared_system_prompt,
    "multi_turn_chat": _multi_turn_chat,
    "uniform_random": _uniform_random,
    "long_context": _long_context,
    "eviction_pressure": _eviction_pressure,
    "burst_short": _burst_short,
}


def working_set_blocks(requests: Sequence[RequestSpec], block_size: int) -> int:
    """Distinct KV blocks a trace ever holds, shared prefixes counted once.

    A request holds the KV of its prompt and of every output token but the last (which is
    sampled and never fed back). Full blocks are identified by their whole prefix (the same
    tokens after the same parent), so two requests with a common 1024-token prefix share 64
    blocks of 16; a trailing partial block is always private.
    """
    ids: dict[tuple[int, tuple[int, ...]], int] = {}
    partial = 0
    for req in requests:
        tokens = req.prompt_token_ids + req.output_token_ids[:-1]
        parent = -1
        num_full = len(tokens) // block_size
        for i in range(num_full):
            key = (parent, tokens[i * block_size:(i + 1) * block_size])
            parent = ids.setdefault(key, len(ids))
        if len(tokens) % block_size:
            partial += 1
    return len(ids) + partial


def shared_prefix_blocks(prompts: Sequence[Sequence[int]], block_size: int) -> tuple[int, int]:
    """``(full prompt blocks, blocks whose whole prefix appeared in an earlier prompt)``, in
    order: a full block is identified by its tokens after the same parent block."""
    seen: dict[tuple[int, tuple[int, ...]], int] = {}
    total = shared = 0
    for tokens in prompts:
        parent = -1
        for i in range(len(tokens) // block_size):
            key = (parent, tuple(tokens[i * block_size:(i + 1) * block_size]))
            total += 1
            if key in seen:
                shared += 1
            parent = seen.setdefault(key, len(seen))
    return total, shared


def trace_profile(requests: Sequence[RequestSpec], block_size: int) -> dict[str, float]:
    """What a trace actually contains, for the record beside the stated distributions.

    ``prompt_tokens_p10/p50/p90/max``: prompt lengths (tokens, nearest-rank percentiles);
    ``shared_prefix_fraction``: of all full prompt blocks, in trace order, the fraction whose
    whole prefix (same tokens after the same parent) already appeared in an earlier request,
    i.e. the best hit rate a pool with room for everything could reach on prompts.
    """
    lengths = sorted(len(r.prompt_token_ids) for r in requests)
    if not lengths:
        raise KVCheckInputError("trace_profile: no requests")

    def rank(q: int) -> float:
        return float(lengths[min(len(lengths) - 1, (len(lengths) * q) // 100)])

    total, shared = shared_prefix_blocks([r.prompt_token_ids for r in requests], block_size)
    return {"prompt_tokens_p10": rank(10), "prompt_tokens_p50": rank(50),
            "prompt_tokens_p90": rank(90), "prompt_tokens_max": float(lengths[-1]),
            "shared_prefix_fraction": shared / total if total else 0.0}


def make_workload(scenario: str, seed: int = 0, scale: float = 1.0,
                  block_size: int = DEFAULT_BLOCK_SIZE) -> Workload:
    """Build the trace of ``scenario`` (see the module docstring for every distribution).

    Raises:
        KVCheckInputError: unknown scenario (the message lists them), ``scale <= 0``, ``seed < 0``.
    """
    if scenario not in SCENARIOS:
        raise KVCheckInputError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
    if block_size < 1:
        raise KVCheckInputError(f"block_size must be >= 1, got {block_size}")
    shape = SCENARIOS[scenario](Draws(seed, scenario), scale)
    working_set = working_set_blocks(shape.requests, block_size)
    largest = max(math.ceil(r.num_tokens / block_size) for r in shape.requests)
    num_blocks = 1 + max(largest, math.ceil(shape.pool_fraction * working_set))
    return Workload(
        scenario=scenario, seed=seed, scale=float(scale), block_size=block_size,
        requests=tuple(shape.requests), num_blocks=num_blocks,
        max_num_seqs=shape.max_num_seqs, max_num_batched_tokens=shape.max_num_batched_tokens,
        working_set_blocks=working_set, pool_fraction=shape.pool_fraction,
        distributions=shape.distributions,
    )
