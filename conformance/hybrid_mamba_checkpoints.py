"""Golden scenarios of Mamba prefill checkpoint blocks and sparse Mamba retention (capability
``mamba_checkpoints``, vLLM 0.33; docs/semantics.md#mamba-prefill-checkpoints).

A Mamba "align" group with ``num_prefill_checkpoint_blocks`` and a
``prefill_checkpoint_alignment`` exports, with a prefill chunk ``[start, end)``, the state at
the chunk's checkpoint position (``end - 1`` rounded down to the hit alignment) into one more
block, at index ``cdiv(end, block_size) - 2`` of the request's table, and keys it there: a
later request sharing the prompt hits that state where the chunk's own states (one at its end)
would give it nothing (``kvcheck.conformance.mamba_checkpoints``). With the hit alignment
coarser than the Mamba block (the scheduler block) the checkpoint block holds a state that
ends one block before its index; with fine-grained hits (a Mamba block larger than the hash
block) a state inside a block, hit and copied on write. Under
``prefix_cache_retention_interval == 0`` only the chunk that reaches the prefill end takes one;
a checkpoint neither at the prompt's boundary nor at a retained one is transient (its keys are
dropped). Sparse retention keeps one Mamba state per retention interval, plus the prompt's.

``answers`` are what vLLM's own ``KVCacheManager`` answered to each op, replayed through
kvcheck's vLLM adapter (``Driver(load_impl("vllm"), spec)`` on vLLM 0.33.0; the spec's
``block_size`` is 4, prefix caching on) and copied here as literals: each op's ``StepResult``
(hits and new block ids per group, 0 the null block; ``{}`` for an op that calls nothing);
``copies`` every ``(src, dst)`` pair drained, in order; ``free_queue`` the free queue after the
last op, head first. vLLM 0.10.2 has no Mamba prefix caching: no table there.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcheck.conformance.ops import Op, StepResult, add, decode, free, schedule
from kvcheck.conformance.protocol import KVCacheGroupSpec

__all__ = ["CHECKPOINT_SCENARIOS", "MISSING_010", "CheckpointScenario"]

#: Why vLLM 0.10.2 has no table.
MISSING_010 = ("vLLM 0.10.2 has no Mamba prefix caching (its MambaSpec has no "
               "num_prefill_checkpoint_blocks, its KVCacheConfig no retention interval)")


@dataclass(frozen=True)
class CheckpointScenario:
    """``ops`` on a pool of ``num_blocks`` blocks (null block included) in ``groups`` with
    ``retention`` as ``prefix_cache_retention_interval``; vLLM 0.33's answer to each op, the
    copies drained and the final free queue."""

    name: str
    why: str
    groups: tuple[KVCacheGroupSpec, ...]
    retention: int | None
    num_blocks: int
    ops: tuple[Op, ...]
    answers: tuple[StepResult, ...]
    copies: tuple[tuple[int, int], ...]
    free_queue: tuple[int, ...]


def _mamba(block_size: int, checkpoints: int = 1, alignment: int | None = 1,
           speculative: int = 0) -> KVCacheGroupSpec:
    return KVCacheGroupSpec("mamba", block_size, mamba_cache_mode="align",
                            num_speculative_blocks=speculative,
                            num_prefill_checkpoint_blocks=checkpoints,
                            prefill_checkpoint_alignment=alignment)


_F4 = KVCacheGroupSpec("full_attention", 4)
_F8 = KVCacheGroupSpec("full_attention", 8)
#: A 22-token prompt, and a request sharing its first 21 tokens.
_PROMPT = tuple(range(100, 122))
_SHARED = (*_PROMPT[:21], 7, 7, 7)
#: A 30-token prompt.
_LONG = tuple(range(200, 230))

CHECKPOINT_SCENARIOS: tuple[CheckpointScenario, ...] = (
    CheckpointScenario(
        "checkpoint_at_the_prompt_boundary",
        "a 22-token prompt computed in one chunk exports the state at 20 into the block "
        "before its last state block (index 4): a request sharing 21 tokens hits 20 tokens",
        (_F4, _mamba(4)), None, 24,
        (add("a", _PROMPT), schedule("a"), decode("a"), add("c", _SHARED), schedule("c"),
         free("a"), free("c")),
        ({},
         {"hits": ([[], []], 0), "new": [[1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 7, 8]]},
         {"new": [[], []]},
         {},
         {"hits": ([[1, 2, 3, 4, 5], [0, 0, 0, 0, 7]], 20), "new": [[9], [10]]},
         {},
         {}),
        (),
        (8, 6, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 9, 5, 4, 3, 2, 1, 10, 7)),
    CheckpointScenario(
        "no_checkpoint_blocks_no_hit",
        "the same without prefill checkpoint blocks: the chunk keeps only its last state "
        "(20..22, not a full block), so the request sharing 21 tokens hits nothing",
        (_F4, _mamba(4, 0, None)), None, 24,
        (add("a", _PROMPT), schedule("a"), decode("a"), add("c", _SHARED), schedule("c"),
         free("a"), free("c")),
        ({},
         {"hits": ([[], []], 0), "new": [[1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 0, 7]]},
         {"new": [[], []]},
         {},
         {"hits": ([[], []], 0), "new": [[8, 9, 10, 11, 12, 13], [0, 0, 0, 0, 0, 14]]},
         {},
         {}),
        (),
        (7, 6, 15, 16, 17, 18, 19, 20, 21, 22, 23, 5, 4, 3, 2, 1, 13, 12, 11, 10, 9, 8, 14)),
    CheckpointScenario(
        "checkpoint_behind_a_coarser_alignment",
        "full attention at 8 makes the hit alignment 8: the checkpoint is the state at 16, in "
        "the block at index 4 (which would end at 20), keyed at 16; the sharing request hits "
        "16 tokens with that block at Mamba index 3",
        (_F8, _mamba(4)), None, 24,
        (add("a", _PROMPT), schedule("a"), decode("a"), add("c", _SHARED), schedule("c"),
         free("a"), free("c")),
        ({},
         {"hits": ([[], []], 0), "new": [[1, 2, 3], [0, 0, 0, 0, 4, 5]]},
         {"new": [[], []]},
         {},
         {"hits": ([[1, 2], [0, 0, 0, 4]], 16), "new": [[6], [0, 7]]},
         {},
         {}),
        (),
        (5, 3, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 6, 2, 1, 7, 4)),
    CheckpointScenario(
        "checkpoint_inside_a_block",
        "Mamba at 8 beside full attention at 4 (fine-grained hits, alignment 4): the "
        "checkpoint at 20 lands in the block at index 1 under a partial-block key; the "
        "sharing request hits 20 tokens and copies that block on write",
        (_F4, _mamba(8)), None, 24,
        (add("a", _PROMPT), schedule("a"), decode("a"), add("c", _SHARED), schedule("c"),
         decode("c"), free("a"), free("c")),
        ({},
         {"hits": ([[], []], 0), "new": [[1, 2, 3, 4, 5, 6], [0, 7, 8]]},
         {"new": [[], []]},
         {},
         {"hits": ([[1, 2, 3, 4, 5], [0, 0, 7]], 20), "new": [[9], [10]]},
         {"new": [[11], [12]]},
         {},
         {}),
        ((7, 10),),
        (12, 11, 8, 6, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 7, 9, 5, 4, 3, 2, 1, 10)),
    CheckpointScenario(
        "retention_zero_checkpoints_the_last_chunk_only",
        "prefix_cache_retention_interval=0: the first chunk (12 of 30 tokens) reserves no "
        "checkpoint and its state at 12 is not kept; the last chunk's checkpoint at 28 is: a "
        "request sharing 13 tokens hits nothing, one sharing 29 hits 28",
        (_F4, _mamba(4)), 0, 32,
        (add("a", _LONG), schedule("a", 12), schedule("a", 18), decode("a"),
         add("b", (*_LONG[:13], 1, 2)), schedule("b"), add("c", (*_LONG[:29], 3)), schedule("c"),
         free("a"), free("b"), free("c")),
        ({},
         {"hits": ([[], []], 0), "new": [[1, 2, 3], [0, 0, 4]]},
         {"new": [[5, 6, 7, 8, 9], [0, 0, 0, 10, 11]]},
         {"new": [[], []]},
         {},
         {"hits": ([[], []], 0), "new": [[4, 12, 13, 14], [0, 0, 15, 16]]},
         {},
         {"hits": ([[1, 2, 3, 5, 6, 7, 8], [0, 0, 0, 0, 0, 0, 10]], 28), "new": [[17], [18]]},
         {},
         {},
         {}),
        (),
        (18, 17, 16, 14, 11, 9, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 13, 12, 4, 15,
         8, 7, 6, 5, 3, 2, 1, 10)),
    CheckpointScenario(
        "transient_checkpoint_dropped",
        "retention 12: the first chunk's checkpoint at 8 is neither the prompt's (28) nor on "
        "a retention boundary, so its keys are removed again; its state at 12 (a segment end) "
        "is kept: a request sharing 10 tokens hits nothing, one sharing 13 hits 12",
        (_F4, _mamba(4)), 12, 32,
        (add("a", _LONG), schedule("a", 12), schedule("a", 18), add("b", (*_LONG[:10], 1)),
         schedule("b"), add("c", (*_LONG[:13], 3)), schedule("c"), free("a"), free("b"),
         free("c")),
        ({},
         {"hits": ([[], []], 0), "new": [[1, 2, 3], [0, 4, 5]]},
         {"new": [[4, 6, 7, 8, 9], [0, 0, 0, 10, 11]]},
         {},
         {"hits": ([[], []], 0), "new": [[12, 13, 14], [0, 15, 16]]},
         {},
         {"hits": ([[1, 2, 3], [0, 0, 5]], 12), "new": [[17], [18]]},
         {},
         {},
         {}),
        (),
        (18, 17, 16, 14, 11, 9, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 8, 7, 6, 4, 10,
         13, 12, 15, 3, 2, 1, 5)),
    CheckpointScenario(
        "checkpoint_in_a_speculative_block",
        "one speculative block: a running request's chunk [8, 16) keeps its speculative block "
        "at index 2 in place for the checkpoint at 12 (not relocated); a request sharing 13 "
        "tokens hits 12 there",
        (_F4, _mamba(4, speculative=1)), None, 32,
        (add("a", _PROMPT), schedule("a", 8), schedule("a", 8), schedule("a", 6),
         add("c", (*_PROMPT[:13], 3)), schedule("c"), free("a"), free("c")),
        ({},
         {"hits": ([[], []], 0), "new": [[1, 2], [3, 4, 5]]},
         {"new": [[6, 7], [8, 9]]},
         {"new": [[10, 11], [12, 13]]},
         {},
         {"hits": ([[1, 2, 6], [0, 0, 5]], 12), "new": [[14], [15, 16]]},
         {},
         {}),
        (),
        (16, 15, 14, 13, 12, 11, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 3, 4,
         10, 7, 9, 8, 6, 2, 1, 5)),
    CheckpointScenario(
        "sparse_retention_keeps_segment_states",
        "no checkpoint blocks, retention 8, the prompt computed 4 tokens at a time: only the "
        "states at 8 and 16 (segment ends) and at 20 (the prompt's) stay cached; a request "
        "sharing 15 tokens hits 8, not 12",
        (_F4, _mamba(4, 0, None)), 8, 32,
        (add("a", _PROMPT), schedule("a", 4), schedule("a", 4), schedule("a", 4), schedule("a", 4),
         schedule("a", 4), schedule("a", 2), add("b", (*_PROMPT[:15], 1)), schedule("b"),
         free("a"), free("b")),
        ({},
         {"hits": ([[], []], 0), "new": [[1], [2]]},
         {"new": [[3], [4]]},
         {"new": [[2], [5]]},
         {"new": [[6], [7]]},
         {"new": [[5], [8]]},
         {"new": [[9], [10]]},
         {},
         {"hits": ([[1, 3], [0, 4]], 8), "new": [[11, 12], [0, 13]]},
         {},
         {}),
        (),
        (10, 9, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 7, 5, 6, 2,
         8, 12, 11, 3, 1, 13, 4)),
)

