"""Golden scenarios of EAGLE / MTP speculative decoding (capability ``eagle``,
``KVCacheSpec.use_eagle``; docs/semantics.md#prefix-cache-hits).

With EAGLE vLLM's ``KVCacheManager(use_eagle=True)`` drops the last block a prefix-cache hit
matched, so the drafting head's hidden state at the hit's end is recomputed: a full-attention
hit loses its last block (vLLM 0.33: one hit alignment unit, the scheduler block, or one hash
block with fine-grained hits); a sliding window first needs ``cdiv(w - 1, bs) + 1``
contiguous cached blocks, then pops the last one. With several groups vLLM 0.33 widens each
group's search by the dropped unit (``eagle_proof_margin``) so the drop lands back on the
candidate length, drops at most once per candidate in its fixed point, and caches one block
past the aligned boundary (the block a later hit matches and drops); vLLM 0.10.2 drops in
both of its searches (full attention, then the other group within it), so a hybrid hit loses
two blocks there. A Mamba group's search never drops, but its partial-tail key moves to
EAGLE's replay boundary (``num_prompt_tokens // H * H - H``), and under sparse retention
(``prefix_cache_retention_interval``) a window keeps the tails ending one block past EAGLE's
replay boundaries (``replay_boundaries``). A chunked local attention group whose hits drop
(flagged, of a flagged group's spec, or every group when none is flagged: always under vLLM
0.10.2) is refused with caching on (vLLM asserts it on the first lookup); an unflagged one
beside a flagged group of another spec runs in vLLM 0.33 and hits as without EAGLE.

``answers`` are what vLLM's own ``KVCacheManager`` answered to each op, replayed through
kvcheck's vLLM adapter (``Driver(load_impl("vllm"), spec)`` with ``use_eagle=True``, the
spec's ``block_size`` 4, sha256 and ``PYTHONHASHSEED=0``, on vLLM 0.33.0 and 0.10.2: the driver
marks the scheduler steps and drains the copies where vLLM's scheduler does) and copied here as
literals: each op's ``StepResult`` (hits and new block ids per group, 0 the null block; ``{}``
for an op that calls nothing), ``copies`` every ``(src, dst)`` pair drained
(``take_kv_cache_block_copies``), in order, and ``free_queue`` the free queue after the last
op, head first. A layout vLLM 0.10.2 refuses (one block size with caching, no Mamba prefix
caching) has no 0.10 table, nor do the scenarios flagging groups ``is_eagle_group`` (vLLM
0.33's per-group flag, capability ``eagle_groups``: only flagged groups drop, a spec group
drops when any member is flagged), which vLLM 0.10.2 has no field for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvcheck.conformance.ops import Op, StepResult, add, decode, free, schedule
from kvcheck.conformance.protocol import KVCacheGroupSpec

__all__ = ["EAGLE_SCENARIOS", "EagleScenario", "Recorded"]


@dataclass(frozen=True)
class Recorded:
    """One release's answers to a scenario's ops, the copies drained and the final free
    queue (head first)."""

    answers: tuple[StepResult, ...]
    copies: tuple[tuple[int, int], ...]
    free_queue: tuple[int, ...]


@dataclass(frozen=True)
class EagleScenario:
    """``ops`` on a pool of ``num_blocks`` blocks (null block included), spec ``block_size``
    4, prefix caching on, ``use_eagle=True``; ``groups`` the ``kv_cache_groups`` (``()``: a
    single-group spec); ``recorded`` per profile (a profile missing: its vLLM refuses the
    layout); ``retention`` the spec's ``prefix_cache_retention_interval``."""

    name: str
    why: str
    groups: tuple[KVCacheGroupSpec, ...]
    num_blocks: int
    ops: tuple[Op, ...]
    recorded: dict[str, Recorded] = field(default_factory=dict)
    retention: int | None = None


_FULL = KVCacheGroupSpec("full_attention", 4)
_P13 = tuple(range(100, 113))
_P19 = tuple(range(100, 119))
_P21 = tuple(range(100, 121))
_MAMBA8 = KVCacheGroupSpec("mamba", 8, mamba_cache_mode="align")
_FULL_EAGLE = KVCacheGroupSpec("full_attention", 4, is_eagle_group=True)
_P24 = tuple(range(100, 124))
_CHUNK12 = KVCacheGroupSpec("chunked_local_attention", 4, attention_chunk_size=12)
_CHUNK24 = KVCacheGroupSpec("chunked_local_attention", 4, attention_chunk_size=24)


def _flag_ops(n: int) -> tuple[Op, ...]:
    """The per-group flag scenarios' ops: an ``n``-token prompt computed and decoded once, a
    sibling extending it by 5 tokens, a resend of it, all freed."""
    prompt = _P24[:n]
    return (add("a", prompt), schedule("a"), decode("a"), add("b", (*prompt, 7, 7, 7, 7, 7)),
            schedule("b"), add("c", prompt), schedule("c"), free("a"), free("b"), free("c"))


#: Two windows (4 tokens at block 4, 12 at block 8): no full attention.
_WINDOWS = (KVCacheGroupSpec("sliding_window", 4, sliding_window=4),
            KVCacheGroupSpec("sliding_window", 8, sliding_window=12))


#: Every scenario, with what vLLM 0.33.0 and 0.10.2 answered.
EAGLE_SCENARIOS: tuple[EagleScenario, ...] = (
    EagleScenario(
        "full_attention_drops_last_block",
        "one full-attention group: a 13-token prompt caches 3 blocks; a longer request "
        "sharing it and a resend of it both hit 2 blocks (8 tokens), not 3: the last "
        "matched block is dropped",
        (), 16,
        (add("a", _P13), schedule("a"), decode("a"), add("b", (*_P13, 7, 7, 7)), schedule("b"),
         add("c", _P13), schedule("c"), free("a"), free("b"), free("c")),
        {
            "vllm-0.33": Recorded(
                ({},
                 {"hits": ([[]], 0), "new": [[1, 2, 3, 4]]},
                 {"new": [[]]},
                 {},
                 {"hits": ([[1, 2]], 8), "new": [[5, 6]]},
                 {},
                 {"hits": ([[1, 2]], 8), "new": [[7, 8]]},
                 {},
                 {},
                 {}),
                (),
                (8, 4, 9, 10, 11, 12, 13, 14, 15, 3, 6, 5, 7, 2, 1)),
            "vllm-0.10": Recorded(
                ({},
                 {"hits": ([[]], 0), "new": [[1, 2, 3, 4]]},
                 {"new": [[]]},
                 {},
                 {"hits": ([[1, 2]], 8), "new": [[5, 6]]},
                 {},
                 {"hits": ([[1, 2]], 8), "new": [[7, 8]]},
                 {},
                 {},
                 {}),
                (),
                (9, 10, 11, 12, 13, 14, 15, 4, 3, 6, 5, 8, 7, 2, 1)),
        }),
    EagleScenario(
        "full_attention_short_hit_drops_to_nothing",
        "a hit of one block drops to no hit at all (0 tokens, no hit blocks)",
        (), 16,
        (add("a", _P13[:5]), schedule("a"), add("b", (*_P13[:5], 9, 9)), schedule("b"), free("a"),
         free("b")),
        {
            "vllm-0.33": Recorded(
                ({},
                 {"hits": ([[]], 0), "new": [[1, 2]]},
                 {},
                 {"hits": ([[]], 0), "new": [[3, 4]]},
                 {},
                 {}),
                (),
                (4, 2, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 1, 3)),
            "vllm-0.10": Recorded(
                ({},
                 {"hits": ([[]], 0), "new": [[1, 2]]},
                 {},
                 {"hits": ([[]], 0), "new": [[3, 4]]},
                 {},
                 {}),
                (),
                (5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 2, 1, 4, 3)),
        }),
    EagleScenario(
        "window_needs_one_more_block",
        "one sliding-window group (w 4, block 4: one contiguous block needed without "
        "EAGLE): the run needs 2 blocks, the last is popped: the hit is [null, 2] (8 "
        "tokens), not [null, null, 3]",
        (KVCacheGroupSpec("sliding_window", 4, sliding_window=4),), 16,
        (add("a", _P13), schedule("a"), add("b", (*_P13, 7, 7, 7)), schedule("b"), free("a"),
         free("b")),
        {
            "vllm-0.33": Recorded(
                ({},
                 {"hits": ([[]], 0), "new": [[1, 2, 3, 4]]},
                 {},
                 {"hits": ([[0, 2]], 8), "new": [[5, 6]]},
                 {},
                 {}),
                (),
                (4, 7, 8, 9, 10, 11, 12, 13, 14, 15, 3, 1, 6, 5, 2)),
            "vllm-0.10": Recorded(
                ({},
                 {"hits": ([[]], 0), "new": [[1, 2, 3, 4]]},
                 {},
                 {"hits": ([[0, 2]], 8), "new": [[5, 6]]},
                 {},
                 {}),
                (),
                (7, 8, 9, 10, 11, 12, 13, 14, 15, 4, 3, 1, 6, 5, 2)),
        }),
    EagleScenario(
        "full_and_window_shared_hit",
        "full attention beside a window of 8: 0.33 widens each search by one block and "
        "drops once (16 tokens of 20 cached); 0.10.2 drops in both searches (12 tokens)",
        (_FULL, KVCacheGroupSpec("sliding_window", 4, sliding_window=8)), 32,
        (add("a", _P21), schedule("a"), add("b", (*_P21, 7, 7, 7)), schedule("b"), free("a"),
         free("b")),
        {
            "vllm-0.33": Recorded(
                ({},
                 {"hits": ([[], []], 0), "new": [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]]},
                 {},
                 {"hits": ([[1, 2, 3, 4], [0, 0, 9, 10]], 16), "new": [[13, 14], [15, 16]]},
                 {},
                 {}),
                (),
                (12, 6, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 5, 11, 8, 7,
                 14, 13, 4, 3, 2, 1, 16, 15, 10, 9)),
            "vllm-0.10": Recorded(
                ({},
                 {"hits": ([[], []], 0), "new": [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]]},
                 {},
                 {"hits": ([[1, 2, 3], [0, 8, 9]], 12), "new": [[13, 14, 15], [16, 17, 18]]},
                 {},
                 {}),
                (),
                (19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 6, 5, 4, 12, 11, 10, 7, 15,
                 14, 13, 3, 2, 1, 18, 17, 16, 9, 8)),
        }),
    EagleScenario(
        "full_and_window_of_8_cache_one_block_more",
        "0.33, full attention at 4 beside a window at 8 (scheduler block 8): full "
        "attention caches one block past the aligned boundary (5 blocks of a 21-token "
        "prompt); the window's run ends at 16, is popped to 8, and the fixed point "
        "settles at 8",
        (_FULL, KVCacheGroupSpec("sliding_window", 8, sliding_window=8)), 32,
        (add("a", _P21), schedule("a"), add("b", (*_P21, 7, 7, 7)), schedule("b"), free("a"),
         free("b")),
        {
            "vllm-0.33": Recorded(
                ({},
                 {"hits": ([[], []], 0), "new": [[1, 2, 3, 4, 5, 6], [7, 8, 9]]},
                 {},
                 {"hits": ([[1, 2], [7]], 8), "new": [[10, 11, 12, 13], [14, 15]]},
                 {},
                 {}),
                (),
                (9, 6, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 5, 4, 3, 8,
                 13, 12, 11, 10, 2, 1, 15, 14, 7)),
        }),
    EagleScenario(
        "full_and_mamba_partial_hit",
        "0.33, full attention beside Mamba 'align' at 8 (fine-grained hits, hash block "
        "4): the producer's state at 16 is keyed, and the hit (20 found in full "
        "attention, one hash block dropped) settles on Mamba's 16",
        (_FULL, _MAMBA8), 32,
        (add("a", _P21), schedule("a", 16), schedule("a"), decode("a"), add("b", (*_P21, 7, 7, 7)),
         schedule("b"), decode("b"), free("a"), free("b")),
        {
            "vllm-0.33": Recorded(
                ({},
                 {"hits": ([[], []], 0), "new": [[1, 2, 3, 4], [0, 5]]},
                 {"new": [[6, 7], [8]]},
                 {"new": [[], []]},
                 {},
                 {"hits": ([[1, 2, 3, 4], [0, 5]], 16), "new": [[9, 10], [11]]},
                 {"new": [[12], [13]]},
                 {},
                 {}),
                (),
                (13, 12, 8, 7, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30,
                 31, 5, 6, 10, 9, 4, 3, 2, 1, 11)),
        }),
    EagleScenario(
        "full_and_mamba_eagle_boundary",
        "0.33, a 19-token prompt computed as 12 then 7: with EAGLE the Mamba partial-tail "
        "key sits at 19 // 4 * 4 - 4 = 12 (not at 16): the hit is 12 tokens ending inside "
        "Mamba block 1, copied on write",
        (_FULL, _MAMBA8), 32,
        (add("a", _P19), schedule("a", 12), schedule("a"), decode("a"), add("b", (*_P19, 7, 7, 7)),
         schedule("b"), decode("b"), free("a"), free("b")),
        {
            "vllm-0.33": Recorded(
                ({},
                 {"hits": ([[], []], 0), "new": [[1, 2, 3], [0, 4]]},
                 {"new": [[5, 6], [8]]},
                 {"new": [[], []]},
                 {},
                 {"hits": ([[1, 2, 3], [0, 7]], 12), "new": [[9, 10, 11], [12, 13]]},
                 {"new": [[], []]},
                 {},
                 {}),
                ((4, 7), (7, 12)),
                (13, 11, 8, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31,
                 4, 7, 12, 6, 5, 10, 9, 3, 2, 1)),
        }),
    EagleScenario(
        "windows_sparse_retention",
        "0.33, two windows with prefix_cache_retention_interval 0: only the tails ending one "
        "block past EAGLE's replay boundaries (and the shared prefix's) are cached: block 1 "
        "is never keyed and is handed out again at once; resends and extensions hit 8 "
        "tokens, a request diverging at 13 hits nothing",
        _WINDOWS, 40,
        (add("a", _P21), schedule("a", 8), schedule("a"), decode("a"), add("b", _P21),
         schedule("b"), add("c", (*_P21, 5)), schedule("c"), add("e", (*_P21[:17], 9, 9, 9)),
         schedule("e"), free("a"), free("b"), free("c"), free("e"),
         add("f", (*_P21[:13], 1, 1)), schedule("f"), add("g", (*_P21, 5, 5, 5, 5)),
         schedule("g")),
        {
            "vllm-0.33": Recorded(
                ({},
                 {"hits": ([[], []], 0), "new": [[1, 2], [3]]},
                 {"new": [[1, 4, 5, 6], [7, 8]]},
                 {"new": [[], []]},
                 {},
                 {"hits": ([[0, 2], [3]], 8), "new": [[4, 9, 10, 11], [12, 13]]},
                 {},
                 {"hits": ([[0, 2], [3]], 8), "new": [[14, 15, 16, 17], [18, 19]]},
                 {},
                 {"hits": ([[0, 2], [3]], 8), "new": [[20, 21, 22], [23, 24]]},
                 {},
                 {},
                 {},
                 {},
                 {},
                 {"hits": ([[], []], 0), "new": [[24, 22, 21, 19], [17, 16]]},
                 {},
                 {"hits": ([[0, 2], [3]], 8), "new": [[15, 13, 11, 10, 9], [8, 6, 5]]}),
                (),
                (25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 1, 7, 4, 12, 14,
                 18, 20, 23)),
        },
        retention=0),
    # Per-group flags (vLLM 0.33's KVCacheGroupSpec.is_eagle_group, capability eagle_groups;
    # vLLM 0.10.2 has no flag and refuses them): only the flagged groups drop.
    EagleScenario(
        "eagle_group_full_flagged_window_keeps_its_block",
        "full attention (block 4) flagged, a window of 8 (block 8) not: a 21-token prompt's "
        "sibling hits 16 tokens, the window's last block kept (every group dropping, as "
        "without flags, it hits 8)",
        (_FULL_EAGLE, KVCacheGroupSpec("sliding_window", 8, sliding_window=8)), 24,
        _flag_ops(21),
        {
            "vllm-0.33": Recorded(
                ({},
                 {"hits": ([[], []], 0), "new": [[1, 2, 3, 4, 5, 6], [7, 8, 9]]},
                 {"new": [[], []]},
                 {},
                 {"hits": ([[1, 2, 3, 4], [0, 8]], 16), "new": [[10, 11, 12], [13, 14]]},
                 {},
                 {"hits": ([[1, 2, 3, 4], [0, 8]], 16), "new": [[15, 16], [17]]},
                 {},
                 {},
                 {}),
                (),
                (17, 16, 14, 12, 9, 6, 18, 19, 20, 21, 22, 23, 7, 5, 11, 10, 13, 15, 4, 3, 2,
                 1, 8)),
        }),
    EagleScenario(
        "eagle_group_window_flagged_full_keeps_its_block",
        "full attention (block 8) not flagged, a window of 4 (block 4) flagged: the sibling "
        "and the resend hit 16 tokens, full attention's last block kept (every group "
        "dropping, they hit 8)",
        (KVCacheGroupSpec("full_attention", 8),
         KVCacheGroupSpec("sliding_window", 4, sliding_window=4, is_eagle_group=True)), 24,
        _flag_ops(21),
        {
            "vllm-0.33": Recorded(
                ({},
                 {"hits": ([[], []], 0), "new": [[1, 2, 3], [4, 5, 6, 7, 8, 9]]},
                 {"new": [[], []]},
                 {},
                 {"hits": ([[1, 2], [0, 0, 0, 7]], 16), "new": [[10, 11], [12, 13, 14]]},
                 {},
                 {"hits": ([[1, 2], [0, 0, 0, 7]], 16), "new": [[15], [16, 17]]},
                 {},
                 {},
                 {}),
                (),
                (17, 15, 14, 11, 9, 3, 18, 19, 20, 21, 22, 23, 6, 5, 4, 8, 10, 13, 12, 2, 1,
                 16, 7)),
        }),
    EagleScenario(
        "eagle_group_only_mamba_flagged_nothing_drops",
        "full attention not flagged beside a flagged Mamba 'align' group (block 4): Mamba's "
        "search never drops, so the sibling of a 24-token prompt hits all 24 tokens (every "
        "group dropping, it hits none)",
        (_FULL, KVCacheGroupSpec("mamba", 4, mamba_cache_mode="align", is_eagle_group=True)),
        24, _flag_ops(24),
        {
            "vllm-0.33": Recorded(
                ({},
                 {"hits": ([[], []], 0), "new": [[1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 0, 7]]},
                 {"new": [[8], [9]]},
                 {},
                 {"hits": ([[1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 0, 7]], 24),
                  "new": [[10, 11], [0, 12]]},
                 {},
                 {"hits": ([[], []], 0),
                  "new": [[13, 14, 15, 16, 17, 18], [0, 0, 0, 0, 0, 19]]},
                 {},
                 {},
                 {}),
                (),
                (12, 11, 9, 8, 20, 21, 22, 23, 10, 6, 5, 4, 3, 2, 1, 7, 18, 17, 16, 15, 14, 13,
                 19)),
        }),
    EagleScenario(
        "eagle_group_unflagged_window_keeps_eagle_replay_tails",
        "sparse retention (interval 0), full attention flagged, a window of 4 not: the window "
        "still keeps the tails at EAGLE's replay boundaries (vLLM computes them once for "
        "every group from use_eagle), so a resend hits 8 tokens with the window's block 4",
        (_FULL_EAGLE, KVCacheGroupSpec("sliding_window", 4, sliding_window=4)), 40,
        (add("a", _P13), schedule("a", 8), schedule("a"), decode("a"), add("b", _P13),
         schedule("b"), add("c", (*_P13, 5)), schedule("c"), add("e", (*_P13[:9], 9, 9, 9)),
         schedule("e"), free("a"), free("b"), free("c"), free("e"),
         add("g", (*_P13, 5, 5, 5, 5)), schedule("g")),
        {
            "vllm-0.33": Recorded(
                ({},
                 {"hits": ([[], []], 0), "new": [[1, 2], [3, 4]]},
                 {"new": [[3, 5], [6, 7]]},
                 {"new": [[], []]},
                 {},
                 {"hits": ([[1, 2], [0, 4]], 8), "new": [[8, 9], [10, 11]]},
                 {},
                 {"hits": ([[1, 2], [0, 4]], 8), "new": [[12, 13], [14, 15]]},
                 {},
                 {"hits": ([[], []], 0), "new": [[16, 17, 18], [19, 20, 21]]},
                 {},
                 {},
                 {},
                 {},
                 {},
                 {"hits": ([[1, 2], [0, 4]], 8), "new": [[21, 15, 14], [13, 11, 10]]}),
                (),
                (9, 7, 6, 5, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38,
                 39, 3, 8, 12, 18, 17, 16, 20, 19)),
        },
        retention=0),
    # An unflagged chunked local attention group beside a flagged group of another spec
    # never drops, so vLLM 0.33's assertion against EAGLE + chunked local attention (reached
    # only with drop_eagle_block) never fires: it hits as without EAGLE.
    EagleScenario(
        "eagle_group_full_flagged_chunked_local_keeps_its_block",
        "full attention flagged, chunked local attention (chunks of 24) not: the sibling and "
        "the resend of a 21-token prompt hit 16 tokens, the chunked group its 4 blocks of the "
        "current chunk (dropping too, it would hit 12)",
        (_FULL_EAGLE, _CHUNK24), 24, _flag_ops(21),
        {
            "vllm-0.33": Recorded(
                ({},
                 {"hits": ([[], []], 0), "new": [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]]},
                 {"new": [[], []]},
                 {},
                 {"hits": ([[1, 2, 3, 4], [7, 8, 9, 10]], 16), "new": [[13, 14, 15], [16, 17, 18]]},
                 {},
                 {"hits": ([[1, 2, 3, 4], [7, 8, 9, 10]], 16), "new": [[19, 20], [21, 22]]},
                 {},
                 {},
                 {}),
                (),
                (22, 20, 18, 15, 12, 6, 23, 5, 11, 14, 13, 17, 16, 19, 4, 3, 2, 1, 21, 10, 9, 8,
                 7)),
        }),
    EagleScenario(
        "eagle_group_chunked_local_first_unflagged",
        "chunked local attention (chunks of 12) first and not flagged, full attention "
        "flagged: the hit of 16 tokens is [null, null, null, 4] in the chunked group (the "
        "blocks of the finished chunk null), full attention's 4 blocks",
        (_CHUNK12, _FULL_EAGLE), 24, _flag_ops(21),
        {
            "vllm-0.33": Recorded(
                ({},
                 {"hits": ([[], []], 0), "new": [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]]},
                 {"new": [[], []]},
                 {},
                 {"hits": ([[0, 0, 0, 4], [7, 8, 9, 10]], 16), "new": [[13, 14, 15], [16, 17, 18]]},
                 {},
                 {"hits": ([[0, 0, 0, 4], [7, 8, 9, 10]], 16), "new": [[19, 20], [21, 22]]},
                 {},
                 {},
                 {}),
                (),
                (22, 20, 18, 15, 12, 6, 23, 3, 2, 1, 5, 11, 14, 13, 17, 16, 19, 4, 21, 10, 9, 8,
                 7)),
        }),
    EagleScenario(
        "eagle_group_window_flagged_full_and_chunked_local_not",
        "full attention and chunked local attention (chunks of 24) not flagged, a window of "
        "8 flagged: three spec groups, the fixed point settles at 16 (the window's run found "
        "to 20 and dropped), the chunked group's 4 blocks kept",
        (_FULL, KVCacheGroupSpec("sliding_window", 4, sliding_window=8, is_eagle_group=True),
         _CHUNK24), 40, _flag_ops(21),
        {
            "vllm-0.33": Recorded(
                ({},
                 {"hits": ([[], [], []], 0),
                  "new": [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12], [13, 14, 15, 16, 17, 18]]},
                 {"new": [[], [], []]},
                 {},
                 {"hits": ([[1, 2, 3, 4], [0, 0, 9, 10], [13, 14, 15, 16]], 16),
                  "new": [[19, 20, 21], [22, 23, 24], [25, 26, 27]]},
                 {},
                 {"hits": ([[1, 2, 3, 4], [0, 0, 9, 10], [13, 14, 15, 16]], 16),
                  "new": [[28, 29], [30, 31], [32, 33]]},
                 {},
                 {},
                 {}),
                (),
                (33, 31, 29, 27, 24, 21, 18, 12, 6, 34, 35, 36, 37, 38, 39, 8, 7, 5, 11, 17, 20,
                 19, 23, 22, 26, 25, 28, 4, 3, 2, 1, 30, 10, 9, 32, 16, 15, 14, 13)),
        }),
    EagleScenario(
        "nothing_cached_below_the_scheduler_block",
        "full attention at 4 beside a window of 8 at 8 (scheduler block 8): a 6-token prompt, "
        "computed and decoded once, aligns to 0 cacheable tokens, so no group caches a block, "
        "not even EAGLE's one block past the boundary (its blocks go to the free queue's head "
        "when freed); a 12-token sibling caches up to 8 and the full-attention block past it",
        (_FULL, KVCacheGroupSpec("sliding_window", 8, sliding_window=8)), 24,
        (add("a", _P24[:6]), schedule("a"), decode("a"), add("b", (*_P24[:6], 7, 7, 7, 7, 7, 7)),
         schedule("b"), free("a"), free("b")),
        {
            "vllm-0.33": Recorded(
                ({},
                 {"hits": ([[], []], 0), "new": [[1, 2], [3]]},
                 {"new": [[], []]},
                 {},
                 {"hits": ([[], []], 0), "new": [[4, 5, 6], [7, 8]]},
                 {},
                 {}),
                (),
                (8, 3, 2, 1, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 6, 5, 4,
                 7)),
        }),
)
