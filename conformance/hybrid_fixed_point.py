"""Scenarios whose hit length needs a second (or third) round over the groups (vLLM 0.33's
``HybridKVCacheCoordinator.find_longest_cache_hit`` iterates to a fixed point;
docs/semantics.md#hits-per-group-and-the-common-hit-length).

Each one is a shrunk random workload: with three or more attention kinds, the first round over
the groups agrees on a hit length that a later group then cuts; the earlier groups, searched
again at the shorter length, find no valid window there, and the common hit falls further
(in ``three_chunk_sizes`` and ``two_chunk_sizes_and_window`` it is cut again in the second
round, so only a third round finds the fixed point). ``one_round`` and ``two_rounds`` are what
a coordinator that stops after one or two rounds answers, ``hit_tokens`` what vLLM 0.33.0's
own ``KVCacheManager`` answers at the last op (replayed through the vLLM adapter:
``--kv-impl=vllm`` runs them against the reference).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcheck.conformance.ops import Op, add, free, schedule
from kvcheck.conformance.protocol import KVCacheGroupSpec

__all__ = ["FIXED_POINT_SCENARIOS", "FixedPointScenario"]


@dataclass(frozen=True)
class FixedPointScenario:
    """``ops`` on a pool of ``num_blocks`` blocks of 4 tokens in ``groups``; at the last op
    (a ``schedule``) the request hits ``hit_tokens`` tokens, where one round says
    ``one_round`` and two rounds ``two_rounds`` (``hit_tokens`` when two rounds suffice)."""

    name: str
    why: str
    groups: tuple[KVCacheGroupSpec, ...]
    num_blocks: int
    ops: tuple[Op, ...]
    one_round: int
    two_rounds: int
    hit_tokens: int


def _tokens(text: str) -> list[int]:
    return [int(t) for t in text.split()]


FIXED_POINT_SCENARIOS: tuple[FixedPointScenario, ...] = (
    FixedPointScenario(
        "chunked_local_then_window",
        "full attention, a chunked-local group (chunks of 16 tokens) and a 16-token "
        "window; r9 hits the running r0's prefix",
        (KVCacheGroupSpec("full_attention", 4),
         KVCacheGroupSpec("chunked_local_attention", 4, attention_chunk_size=16),
         KVCacheGroupSpec("sliding_window", 4, sliding_window=16)),
        35,
        (
            add('r0', _tokens(
                "10 11 12 12 13 10 13 10 12 10 10 12 12 11 11 13 10 11 10 10 12 11 13 11 12 "
                "10 13 10 13 10 11 13 10 11 11 10 12 10 12 12 13 12 12 10")),
            schedule('r0'),
            schedule('r0', 4),
            add('r7', _tokens(
                "11 12 13 10 10 13 10 10 12 10 12 13 11 13 11 13 10 11 12 10 10 11 10 13 10 "
                "10 11 12 10 10 10 11 13 10 13 12 10 12 10 12")),
            schedule('r7', 16),
            add('r9', _tokens(
                "10 11 12 12 13 10 13 10 12 10 10 12 12 11 11 13 10 11 10 10 12 11 13 11 12 "
                "10 13 10 13 10 11 13")),
            schedule('r9', 8),
        ),
        one_round=4, two_rounds=0, hit_tokens=0),
    FixedPointScenario(
        "three_windows",
        "full attention and windows of 24, 8 (blocks of 8) and 8 tokens",
        (KVCacheGroupSpec("full_attention", 4),
         KVCacheGroupSpec("sliding_window", 4, sliding_window=24),
         KVCacheGroupSpec("sliding_window", 8, sliding_window=8),
         KVCacheGroupSpec("sliding_window", 4, sliding_window=8)),
        55,
        (
            add('r2', _tokens(
                "13 12 13 12 10 12 13 11 13 11 10 10 12 12 12 10 10 11 10 11 12")),
            schedule('r2'),
            schedule('r2', 4),
            schedule('r2', 16),
            free('r2'),
            add('r7', _tokens(
                "10 10 13 13 13 10 13 10 13 10 12 12 13 169 107 169 151 138 158 126 196 150 "
                "126 142 180 177 181 183 104 190 153 104 193 122 190 123 152 173 195 124 166 "
                "189")),
            schedule('r7', 16),
            schedule('r7', 8),
            add('r9', _tokens(
                "13 12 13 12 10 12 13 11 13 11 10 10 12 12 12 10 10 11 10 11 12 12 10 10 12 "
                "10 10 13")),
            schedule('r9'),
        ),
        one_round=8, two_rounds=0, hit_tokens=0),
    FixedPointScenario(
        "three_windows_coarse_first",
        "full attention and windows of 24 (blocks of 8), 8 and 24 tokens",
        (KVCacheGroupSpec("full_attention", 4),
         KVCacheGroupSpec("sliding_window", 8, sliding_window=24),
         KVCacheGroupSpec("sliding_window", 4, sliding_window=8),
         KVCacheGroupSpec("sliding_window", 4, sliding_window=24)),
        58,
        (
            add('r4', _tokens(
                "11 11 11 13 173 165 178 149 101 191 131")),
            schedule('r4', 16),
            add('r5', _tokens(
                "12 10 11 13 10 13 12 11 13 10 10 13 13 12 13 12 13 10 10 13 13 11 11 10 13 "
                "11 10 13 10 13 13 11 13 10 11")),
            schedule('r5'),
            schedule('r4', 8),
            schedule('r5', 16),
            add('r13', _tokens(
                "12 10 11 13 10 13 12 11 13 10 10 13 13 12 13 12 13 10 10 13 13 11 11 10 13 "
                "11 10 13 10 13 13 11 13 10 11 10 10 11 12 13 13 13 10 10 13 12")),
            schedule('r13', 16),
        ),
        one_round=8, two_rounds=0, hit_tokens=0),
    FixedPointScenario(
        "three_chunk_sizes",
        "full attention and chunked-local groups of chunks of 12, 16 and 8 tokens; r7 hits "
        "the running r0's prefix, and the second round cuts the length again",
        (KVCacheGroupSpec("full_attention", 4),
         KVCacheGroupSpec("chunked_local_attention", 4, attention_chunk_size=12),
         KVCacheGroupSpec("chunked_local_attention", 4, attention_chunk_size=16),
         KVCacheGroupSpec("chunked_local_attention", 4, attention_chunk_size=8)),
        47,
        (
            add('r0', _tokens(
                "12 11 10 11 11 12 12 12 12 13 12 11 10 13 10 13 13 11 11 11 13 10 11 11 12 "
                "13 13 11 10 10 11 13 13 10 10 11 13 10 11 11")),
            schedule('r0'),
            schedule('r0'),
            add('r1', [12]),
            schedule('r1'),
            add('r2', _tokens(
                "12 11 10 11 11 12 12 12 12 13 12 11 10 13 10 13 13 11 11 11 13 10 11 11 12 "
                "13 13 11 10 10 11 11 13 10 11 11 12 10 112 105 122 166 169 142 11")),
            schedule('r2'),
            schedule('r2', 8),
            add('r7', _tokens(
                "12 11 10 11 11 12 12 12 12 13 12 11 10 13 10 13 13 11 11 11 13 10 11 11 12 "
                "13 13 11 10 10 11 13 13 10 10 11 13")),
            schedule('r7'),
        ),
        one_round=32, two_rounds=16, hit_tokens=0),
    FixedPointScenario(
        "two_chunk_sizes_and_window",
        "full attention, chunked-local groups of chunks of 12 and 8 tokens and a 12-token "
        "window; r5 hits the running r1's prefix, and the second round cuts the length again "
        "(the fixed point is not 0)",
        (KVCacheGroupSpec("full_attention", 4),
         KVCacheGroupSpec("chunked_local_attention", 4, attention_chunk_size=12),
         KVCacheGroupSpec("chunked_local_attention", 4, attention_chunk_size=8),
         KVCacheGroupSpec("sliding_window", 4, sliding_window=12)),
        59,
        (
            add('r1', _tokens(
                "11 13 11 12 11 11 10 11 12 13 11 11 13 11 11 10 11 12 10 10 13 12 10 13 13 "
                "10 10 10 11 10 11 11 10 12 13 10 10 180 192 174 107 149 165 172 128 163 199 "
                "196 153 132 132 167 153 148 149")),
            schedule('r1'),
            schedule('r1'),
            add('r2', _tokens(
                "11 11 12 13 12 13 11 11 12 11 13 12 10 11 12 10 12 12 12 10 12 11 10 12 11")),
            schedule('r2'),
            add('r5', _tokens(
                "11 13 11 12 11 11 10 11 12 13 11 11 13 11 11 10 11 12 10 10 13 12 10 13 13 "
                "10 10 10 11 10 11 11 10 12 13 10 10 180 192 174 107 149 165 172 128 163 199 "
                "196 153")),
            schedule('r5'),
        ),
        one_round=36, two_rounds=32, hit_tokens=24),
)
