"""Golden scenarios of vLLM 0.33's multi-module MTP (capability ``prefill_lookahead``,
``KVCacheSpec.num_prefill_lookahead``; docs/semantics.md#multi-module-mtp).

With ``num_speculative_tokens`` K > 1 MTP modules, vLLM 0.33 builds its ``KVCacheManager``
with ``num_prefill_lookahead=K``: the last ``K - 1`` computed tokens may be re-prefilled, so
they are not cached yet (the coordinator's ``num_reprefillable_tokens``): one group caches up
to ``num_computed - (K - 1)`` (any ``use_eagle``), several groups do so only in EAGLE's groups
(``use_eagle``: then the aligned boundary and the block past it are taken from the finalized
tokens), and without EAGLE vLLM 0.33's hybrid coordinator caches up to the aligned boundary as
before. Every sliding-window group keeps ``K - 1`` more tokens' blocks below its window
(``SlidingWindowSpec.extra_retained_tokens``, set by vLLM's KV-cache planning): they are freed
``K - 1`` tokens later, while a hit still needs only the window's own blocks. With EAGLE and
caching on, ``K`` above the scheduler block size is refused (vLLM raises ValueError).

``answers`` are what vLLM 0.33.0's own ``KVCacheManager`` answered to each op, replayed
through kvcheck's vLLM adapter (``Driver(load_impl("vllm"), spec)`` with the scenario's
``use_eagle`` and ``num_prefill_lookahead``, the spec's ``block_size`` 4, sha256 and
``PYTHONHASHSEED=0``) and copied here as literals: each op's ``StepResult`` (hits and new block
ids per group, 0 the null block; ``{}`` for an op that calls nothing), ``num_free`` the
``num_free_blocks()`` after each op, and ``free_queue`` the free queue after the last op, head
first. vLLM 0.10.2 has no ``num_prefill_lookahead``: there is no 0.10 table.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcheck.conformance.ops import Op, StepResult, add, decode, free, schedule
from kvcheck.conformance.protocol import KVCacheGroupSpec

__all__ = ["MTP_REFUSALS", "MTP_SCENARIOS", "MTPRecorded", "MTPRefusal", "MTPScenario"]


@dataclass(frozen=True)
class MTPRecorded:
    """vLLM 0.33.0's answers to a scenario's ops, the free count after each op and the final
    free queue (head first)."""

    answers: tuple[StepResult, ...]
    num_free: tuple[int, ...]
    free_queue: tuple[int, ...]


@dataclass(frozen=True)
class MTPScenario:
    """``ops`` on a pool of ``num_blocks`` blocks (null block included), spec ``block_size``
    4, prefix caching on, ``num_prefill_lookahead`` ``lookahead`` and ``use_eagle``;
    ``groups`` the ``kv_cache_groups`` (``()``: a single-group spec)."""

    name: str
    why: str
    groups: tuple[KVCacheGroupSpec, ...]
    num_blocks: int
    use_eagle: bool
    lookahead: int
    ops: tuple[Op, ...]
    recorded: MTPRecorded


@dataclass(frozen=True)
class MTPRefusal:
    """A layout vLLM 0.33.0's ``KVCacheManager`` refuses with ``message`` (its ValueError),
    ``use_eagle`` and caching on, spec ``block_size`` 4."""

    groups: tuple[KVCacheGroupSpec, ...]
    lookahead: int
    message: str


_FULL = KVCacheGroupSpec("full_attention", 4)
_SW4 = KVCacheGroupSpec("sliding_window", 4, sliding_window=4)
_SW8 = KVCacheGroupSpec("sliding_window", 4, sliding_window=8)
_MAMBA4 = KVCacheGroupSpec("mamba", 4, mamba_cache_mode="align")
_P12 = tuple(range(100, 112))
_P13 = tuple(range(100, 113))
_P17 = tuple(range(100, 117))

#: What vLLM 0.33.0 raised (ValueError), word for word.
MTP_REFUSALS: tuple[MTPRefusal, ...] = (
    MTPRefusal((), 5, "Multi-module MTP with prefix caching requires scheduler_block_size "
               "(=4) >= num_speculative_tokens (=5)."),
    MTPRefusal((_FULL, KVCacheGroupSpec("sliding_window", 8, sliding_window=8)), 9,
               "Multi-module MTP with prefix caching requires scheduler_block_size (=8) >= "
               "num_speculative_tokens (=9)."),
)

#: Every scenario, with what vLLM 0.33.0 answered.
MTP_SCENARIOS: tuple[MTPScenario, ...] = (
    MTPScenario(
        "full_attention_tail_cached_later",
        "one full-attention group, K 3: a 12-token prompt caches 2 blocks, not 3 (its last 2 "
        "tokens may be re-prefilled): a request sharing it hits 8 tokens; two decode steps "
        "later (14 tokens, 12 of them final) the third block is cached and the next hits 12",
        (), 16, False, 3,
        (add("a", _P12), schedule("a"), add("b", (*_P12, 7, 7, 7)), schedule("b"), decode("a"),
         decode("a"), add("c", (*_P12, 9, 9, 9)), schedule("c"), free("a"), free("b"),
         free("c")),
        MTPRecorded(
            ({},
             {"hits": ([[]], 0), "new": [[1, 2, 3]]},
             {},
             {"hits": ([[1, 2]], 8), "new": [[4, 5]]},
             {"new": [[6]]},
             {"new": [[]]},
             {},
             {"hits": ([[1, 2, 4]], 12), "new": [[7]]},
             {},
             {},
             {}),
            (15, 12, 12, 10, 9, 9, 9, 8, 10, 11, 15),
            (7, 5, 6, 8, 9, 10, 11, 12, 13, 14, 15, 3, 4, 2, 1))),
    MTPScenario(
        "full_attention_eagle_lag_and_drop",
        "one group with EAGLE, K 3: a 17-token prompt caches 3 blocks (15 final tokens), the "
        "hit drops its last: 8 tokens; two decode steps later 4 blocks are cached and the "
        "hit is 12",
        (), 16, True, 3,
        (add("a", _P17), schedule("a"), add("b", (*_P17, 7, 7, 7)), schedule("b"), decode("a"),
         decode("a"), add("c", (*_P17, 9, 9, 9)), schedule("c"), free("a"), free("b"),
         free("c")),
        MTPRecorded(
            ({},
             {"hits": ([[]], 0), "new": [[1, 2, 3, 4, 5]]},
             {},
             {"hits": ([[1, 2]], 8), "new": [[6, 7, 8]]},
             {"new": [[]]},
             {"new": [[]]},
             {},
             {"hits": ([[1, 2, 3]], 12), "new": [[9, 10]]},
             {},
             {},
             {}),
            (15, 10, 10, 7, 7, 7, 7, 5, 7, 10, 15),
            (10, 8, 5, 11, 12, 13, 14, 15, 4, 7, 6, 9, 3, 2, 1))),
    MTPScenario(
        "window_frees_later",
        "one sliding-window group (w 4, block 4), K 3: the window keeps 2 more tokens below "
        "it, so at 15 computed tokens block 2 is still held (13 free, not 14); a later hit "
        "still needs only the window's own block: [null, null, 3]",
        (_SW4,), 16, False, 3,
        (add("a", _P13), schedule("a"), decode("a"), decode("a"), decode("a"), decode("a"),
         add("b", (*_P13, 7, 7)), schedule("b"), free("a"), free("b")),
        MTPRecorded(
            ({},
             {"hits": ([[]], 0), "new": [[1, 2, 3, 4]]},
             {"new": [[]]},
             {"new": [[]]},
             {"new": [[]]},
             {"new": [[5]]},
             {},
             {"hits": ([[0, 0, 3]], 12), "new": [[6]]},
             {},
             {}),
            (15, 11, 13, 13, 13, 12, 12, 11, 13, 15),
            (6, 5, 4, 7, 8, 9, 10, 11, 12, 13, 14, 15, 2, 1, 3))),
    MTPScenario(
        "full_and_window_without_eagle",
        "full attention beside a window of 8, K 3, no EAGLE: vLLM 0.33's hybrid coordinator "
        "caches up to the aligned boundary whatever K (a 17-token prompt's 4 blocks: the "
        "next request hits 16), while the window still frees 2 tokens later (at 19 computed "
        "tokens its block 2 is held)",
        (_FULL, _SW8), 40, False, 3,
        (add("a", _P17), schedule("a"), add("b", (*_P17, 7, 7, 7)), schedule("b"), decode("a"),
         decode("a"), decode("a"), free("a"), free("b")),
        MTPRecorded(
            ({},
             {"hits": ([[], []], 0), "new": [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]},
             {},
             {"hits": ([[1, 2, 3, 4], [0, 0, 8, 9]], 16), "new": [[11], [12]]},
             {"new": [[], []]},
             {"new": [[], []]},
             {"new": [[], []]},
             {},
             {}),
            (39, 29, 29, 27, 29, 29, 29, 31, 39),
            (13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33,
             34, 35, 36, 37, 38, 39, 7, 6, 5, 10, 11, 4, 3, 2, 1, 12, 9, 8))),
    MTPScenario(
        "full_and_window_with_eagle",
        "full attention beside a window of 8, K 3, EAGLE: each group caches up to the aligned "
        "boundary of the 15 final tokens of 17 plus one block, capped at 15 (3 blocks): the "
        "EAGLE hit is 8 tokens; two decode steps later 4 blocks are cached and it is 12",
        (_FULL, _SW8), 40, True, 3,
        (add("a", _P17), schedule("a"), add("b", (*_P17, 7, 7, 7)), schedule("b"), decode("a"),
         decode("a"), add("c", (*_P17, 1, 1, 1, 1, 1)), schedule("c"), free("a"), free("b"),
         free("c")),
        MTPRecorded(
            ({},
             {"hits": ([[], []], 0), "new": [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]},
             {},
             {"hits": ([[1, 2], [6, 7]], 8), "new": [[11, 12, 13], [14, 15, 16]]},
             {"new": [[], []]},
             {"new": [[], []]},
             {},
             {"hits": ([[1, 2, 3], [0, 7, 8]], 12), "new": [[17, 18, 19], [20, 21, 22]]},
             {},
             {},
             {}),
            (39, 29, 29, 23, 23, 23, 23, 17, 21, 28, 39),
            (22, 19, 16, 13, 10, 5, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37,
             38, 39, 4, 9, 12, 11, 15, 14, 6, 18, 17, 3, 2, 1, 21, 20, 8, 7))),
    # One Mamba "align" group alone (its unitary coordinator lags it too): it keys only whole
    # blocks, each holding the state after its last token, so the lag delays or loses keys
    # but never keys a stale state (replayed with kvcheck's laws on vLLM 0.33.0).
    MTPScenario(
        "mamba_align_alone_loses_the_lagged_state",
        "one Mamba 'align' group (block 4), K 3: a 12-token prompt's state block is not keyed "
        "(10 final tokens), so a sibling hits nothing; a's second decode step would key it "
        "(12 final tokens), but the same allocation frees it first (Mamba keeps only its "
        "last state), so it is never keyed and a later sibling hits nothing either, taking "
        "it from the queue head",
        (_MAMBA4,), 16, False, 3,
        (add("a", _P12), schedule("a"), add("b", (*_P12, 7, 7, 7)), schedule("b"), decode("a"),
         decode("a"), add("c", (*_P12, 9, 9, 9)), schedule("c"), free("a"), free("b"),
         free("c")),
        MTPRecorded(
            ({},
             {"hits": ([[]], 0), "new": [[0, 0, 1]]},
             {},
             {"hits": ([[]], 0), "new": [[0, 0, 0, 2]]},
             {"new": [[3]]},
             {"new": [[]]},
             {},
             {"hits": ([[]], 0), "new": [[0, 0, 0, 1]]},
             {},
             {},
             {}),
            (15, 14, 14, 13, 12, 13, 13, 12, 13, 14, 15),
            (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15))),
    MTPScenario(
        "mamba_align_alone_eagle_keys_a_finished_chunk",
        "one Mamba 'align' group (block 4) with EAGLE, K 2: a 17-token prompt computed as 8 "
        "then 9 keys the state at 8 (block 1) when its second chunk is scheduled (16 final "
        "tokens); a sibling in that step is refused (a Mamba block keyed this step), one in "
        "the next step hits 8 tokens (Mamba's search never drops)",
        (_MAMBA4,), 16, True, 2,
        (add("a", _P17), schedule("a", 8), schedule("a"), add("b", (*_P17, 7, 7, 7)),
         schedule("b"), decode("a"), add("c", (*_P17, 9, 9, 9)), schedule("c"), free("a"),
         free("b"), free("c")),
        MTPRecorded(
            ({},
             {"hits": ([[]], 0), "new": [[0, 1]]},
             {"new": [[0, 0, 2]]},
             {},
             {"hits": ([[0, 1]], 8), "new": None},
             {"new": [[]]},
             {},
             {"hits": ([[0, 1]], 8), "new": [[0, 0, 3]]},
             {},
             {},
             {}),
            (15, 14, 13, 13, 13, 14, 14, 12, 13, 13, 15),
            (3, 2, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 1))),
)
