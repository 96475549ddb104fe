"""Golden scenarios of fine-grained partial hash hits (capability ``fine_grained_hits``, vLLM
0.33; docs/semantics.md#fine-grained-partial-hits).

Beside a Mamba "align" group larger than the hash block (the gcd of the groups' block sizes)
vLLM 0.33 lets hits end on any hash-block boundary (``kvcheck.conformance.fine_grained``): a
full-attention or Mamba block a hit ends inside is copied on write (CoW) into a private block,
the first of ``allocate_slots``' new ids, which takes the hit block's index in the table (one
block more is reserved for it: a pool one block short refuses); a Mamba group also copies a
running request's own partial tail state into a new block before overwriting it. The copies
are drained by ``take_kv_cache_block_copies()`` at the end of the scheduler step, which frees
the blocks they retained in vLLM's order (``[src, dst, ...]``: a hit block nobody else holds
goes back to the free queue then). A sliding window whose block is not the hash block keeps
the feature off: hits stay on scheduler-block boundaries and nothing is copied.

``answers`` are what vLLM's own ``KVCacheManager`` answered to each op, replayed through
kvcheck's vLLM adapter (``Driver(load_impl("vllm"), spec)`` on vLLM 0.33.0: the driver marks
the scheduler steps and drains the copies where vLLM's scheduler does, see
``kvcheck.conformance.driver``) and copied here as literals: each op's ``StepResult`` (hits
and new block ids per group, 0 the null block; ``{}`` for an op that calls nothing);
``copies`` every ``(src, dst)`` pair drained, in order; ``free_queue`` the free queue after the
last op, head first. vLLM 0.10.2 has no Mamba prefix caching: no table there.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcheck.conformance.ops import Op, StepResult, add, decode, free, schedule
from kvcheck.conformance.protocol import KVCacheGroupSpec

__all__ = ["FINE_GRAINED_SCENARIOS", "MISSING_010", "FineGrainedScenario"]

#: Why vLLM 0.10.2 has no table.
MISSING_010 = ("vLLM 0.10.2 has no Mamba prefix caching (no mamba_cache_mode 'align'), so no "
               "fine-grained partial hits")


@dataclass(frozen=True)
class FineGrainedScenario:
    """``ops`` on a pool of ``num_blocks`` blocks (null block included) in ``groups`` (the
    spec's ``block_size`` is 4, prefix caching on); vLLM 0.33's answer to each op, the
    copies drained and the final free queue."""

    name: str
    why: str
    groups: tuple[KVCacheGroupSpec, ...]
    num_blocks: int
    ops: tuple[Op, ...]
    answers: tuple[StepResult, ...]
    copies: tuple[tuple[int, int], ...]
    free_queue: tuple[int, ...]


def _align(block_size: int) -> KVCacheGroupSpec:
    return KVCacheGroupSpec("mamba", block_size, mamba_cache_mode="align")


#: Full attention at 8 tokens beside Mamba at 12: the hash block is 4 (gcd), so a hit may end
#: inside a block of either group.
_FULL8_MAMBA12 = (KVCacheGroupSpec("full_attention", 8), _align(12))
#: Full attention at the hash block (4) beside Mamba at 8: only Mamba's hits end inside blocks.
_FULL4_MAMBA8 = (KVCacheGroupSpec("full_attention", 4), _align(8))
#: A sliding window at 8 (not the hash block, 4): fine-grained hits stay off.
_SWA8 = (KVCacheGroupSpec("full_attention", 4),
         KVCacheGroupSpec("sliding_window", 8, sliding_window=4), _align(8))

#: The producer: 22 prompt tokens computed as 20 then 2 (its last prompt hash boundary, 20,
#: ends a step inside a block: cached there), then one decode step.
_PROMPT = tuple(range(100, 122))
_PRODUCE: tuple[Op, ...] = (add("a", _PROMPT), schedule("a", 20), schedule("a", 2),
                            decode("a"))
#: A request sharing the producer's first 21 tokens.
_SHARED = (*_PROMPT[:21], 7, 7, 7)


FINE_GRAINED_SCENARIOS: tuple[FineGrainedScenario, ...] = (
    FineGrainedScenario(
        "partial_hit_copies_on_write",
        "a hit ending inside a full-attention block and a Mamba block (20 tokens: blocks of 8 "
        "and 12) replaces each by a private copy-on-write block, the first new id of its "
        "group; the producer's own partial Mamba state was copied before it went on",
        _FULL8_MAMBA12, 24,
        (*_PRODUCE, add("c", _SHARED), schedule("c"), decode("c"), free("a"), free("c")),
        ({},
         {"hits": ([[], []], 0), "new": [[1, 2, 3], [0, 4]]},
         {"new": [[], []]},
         {"new": [[], []]},
         {},
         {"hits": ([[1, 2, 3], [0, 5]], 20), "new": [[6], [7]]},
         {"new": [[8], [9]]},
         {},
         {}),
        ((4, 5), (3, 6), (5, 7)),
        (9, 8, 4, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 5, 3, 6, 2, 1, 7)),
    FineGrainedScenario(
        "mamba_only_partial_hit",
        "full attention at the hash block beside Mamba at 8: the full-attention hit is whole "
        "blocks, Mamba's ends inside its block and is copied on write",
        _FULL4_MAMBA8, 24,
        (*_PRODUCE, add("c", _SHARED), schedule("c"), decode("c"), free("a"), free("c")),
        ({},
         {"hits": ([[], []], 0), "new": [[1, 2, 3, 4, 5], [0, 0, 6]]},
         {"new": [[7], []]},
         {"new": [[], []]},
         {},
         {"hits": ([[1, 2, 3, 4, 5], [0, 0, 8]], 20), "new": [[9], [10]]},
         {"new": [[11], [12]]},
         {},
         {}),
        ((6, 8), (8, 10)),
        (12, 11, 6, 7, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 8, 9, 5, 4, 3, 2, 1, 10)),
    FineGrainedScenario(
        "reservation_refuses_one_block_short",
        "the copy-on-write block is reserved with the others: a pool one block short of the "
        "hit's new blocks plus one per copy refuses the admission (None), which succeeds "
        "once the producer is freed",
        _FULL8_MAMBA12, 7,
        (*_PRODUCE, add("c", _SHARED), schedule("c"), free("a"), schedule("c"), free("c")),
        ({},
         {"hits": ([[], []], 0), "new": [[1, 2, 3], [0, 4]]},
         {"new": [[], []]},
         {"new": [[], []]},
         {},
         {"hits": ([[1, 2, 3], [0, 5]], 20), "new": None},
         {},
         {"hits": ([[1, 2, 3], [0, 5]], 20), "new": [[4], [6]]},
         {}),
        ((4, 5), (3, 4), (5, 6)),
        (3, 5, 4, 2, 1, 6)),
    FineGrainedScenario(
        "retained_blocks_released_in_order",
        "a hit on a freed producer's blocks: the copies retain the hit block and the copy "
        "until the step's copies are drained, then free them in vLLM's order, [src, dst] per "
        "copy (the hit blocks nobody holds go back to the free queue's tail)",
        _FULL8_MAMBA12, 24,
        (*_PRODUCE, free("a"), add("c", _SHARED), schedule("c"), add("z", (1, 2, 3))),
        ({},
         {"hits": ([[], []], 0), "new": [[1, 2, 3], [0, 4]]},
         {"new": [[], []]},
         {"new": [[], []]},
         {},
         {},
         {"hits": ([[1, 2, 3], [0, 5]], 20), "new": [[4], [6]]},
         {}),
        ((4, 5), (3, 4), (5, 6)),
        (7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 3, 5)),
    FineGrainedScenario(
        "copy_on_write_block_cached_when_full",
        "the copy-on-write block, filled by its request, is cached as a full block: a later "
        "request hits it as a whole block",
        _FULL8_MAMBA12, 24,
        (*_PRODUCE, add("c", _SHARED), schedule("c"), decode("c"),
         add("e", (*_SHARED, 5, 6)), schedule("e"), free("a"), free("c"), free("e")),
        ({},
         {"hits": ([[], []], 0), "new": [[1, 2, 3], [0, 4]]},
         {"new": [[], []]},
         {"new": [[], []]},
         {},
         {"hits": ([[1, 2, 3], [0, 5]], 20), "new": [[6], [7]]},
         {"new": [[8], [9]]},
         {},
         {"hits": ([[1, 2, 6], [0, 7]], 24), "new": [[10], [11]]},
         {},
         {},
         {}),
        ((4, 5), (3, 6), (5, 7)),
        (11, 10, 9, 8, 4, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 5, 3, 6, 2, 1, 7)),
    FineGrainedScenario(
        "sliding_window_keeps_it_off",
        "a sliding window at 8 tokens (not the hash block, 4) keeps fine-grained hits off: "
        "the hit stays on the scheduler block (16 tokens), nothing is copied",
        _SWA8, 32,
        (add("a", _PROMPT), schedule("a", 16), schedule("a", 6), decode("a"), add("c", _SHARED),
         schedule("c"), decode("c"), free("a"), free("c")),
        ({},
         {"hits": ([[], [], []], 0), "new": [[1, 2, 3, 4], [5, 6], [0, 7]]},
         {"new": [[8, 9], [10], [11]]},
         {"new": [[], [], []]},
         {},
         {"hits": ([[1, 2, 3, 4], [0, 6], [0, 7]], 16), "new": [[12, 13], [14], [15]]},
         {"new": [[16], [17], [18]]},
         {},
         {}),
        (),
        (18, 17, 16, 11, 10, 9, 8, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 5, 6, 7,
         13, 12, 4, 3, 2, 1, 14, 15)),
)
