"""Golden scenarios of hash lookahead (capability ``hash_lookahead``,
``KVCacheSpec.num_hash_lookahead_tokens``; docs/semantics.md#request-block-hashes).

vLLM 0.33 hashes blocks with lookahead ``L`` by default for EAGLE-family speculative decoding
with prefix caching (``VllmConfig.num_hash_lookahead_tokens``: 1 for EAGLE, the speculative
token count for multi-module MTP): the request hasher (``get_request_block_hasher(...,
L)``) hashes a block only once the ``L`` tokens after it exist, with extra keys ``(E, *those
tokens)`` (``E`` over the block and them), so a block is cached, and hit, only then; the
manager (``KVCacheManager(num_hash_lookahead_tokens=L)``) puts those tokens on each
``BlockStored`` (``lookahead_token_ids``, one list per block) and moves a Mamba group's prompt
boundary down to ``num_prompt_tokens - max(1, L)`` rounded to the hash block. The scheduler
then passes ``use_eagle=False`` (no hit drop).

``recorded`` holds what vLLM 0.33.0's own ``KVCacheManager`` and request hasher answered,
replayed through kvcheck's vLLM adapter (``Driver(load_impl("vllm"), spec)``, the spec's
``block_size`` 4, sha256, ``PYTHONHASHSEED=0``, KV events on) and copied here as literals:
each op's ``StepResult`` (hits and new block ids per group, 0 the null block; ``{}`` for an op
that calls nothing), every ``BlockStored`` in order as ``(group, number of blocks,
token_ids, lookahead_token_ids)``, the free queue after the last op, head first, and the
copies drained (a Mamba hit ending inside a block is copied on write). vLLM
0.10.2 has no hash lookahead (the spec is declined there).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcheck.conformance.ops import Op, StepResult, add, decode, free, schedule
from kvcheck.conformance.protocol import KVCacheGroupSpec
from kvcheck.conformance.schedule_step import output_token

__all__ = ["LOOKAHEAD_SCENARIOS", "LookaheadScenario", "Recorded", "StoredEvent"]

#: One ``BlockStored``: ``(group_idx, len(block_hashes), token_ids, lookahead_token_ids)``.
StoredEvent = tuple[int, int, tuple[int, ...], tuple[tuple[int, ...], ...] | None]


@dataclass(frozen=True)
class Recorded:
    """vLLM 0.33.0's answers to a scenario's ops, its ``BlockStored`` events, the final free
    queue (head first) and the copies drained (``take_kv_cache_block_copies``), in order."""

    answers: tuple[StepResult, ...]
    stored: tuple[StoredEvent, ...]
    free_queue: tuple[int, ...]
    copies: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class LookaheadScenario:
    """``ops`` on a pool of ``num_blocks`` blocks (null block included), spec ``block_size``
    4, prefix caching and KV events on, ``num_hash_lookahead_tokens=lookahead``; ``groups``
    the ``kv_cache_groups`` (``()``: a single-group spec); ``needs`` the capabilities the
    layout or requests need beyond ``hash_lookahead``."""

    name: str
    why: str
    lookahead: int
    groups: tuple[KVCacheGroupSpec, ...]
    num_blocks: int
    ops: tuple[Op, ...]
    recorded: Recorded
    needs: tuple[str, ...] = ()


_P8 = tuple(range(100, 108))
_P12 = tuple(range(100, 112))
_P13 = tuple(range(100, 113))
_P17 = tuple(range(100, 117))
#: The token request "a" samples first (the driver's deterministic sampler).
_A0 = output_token("a", 0)
_FULL = KVCacheGroupSpec("full_attention", 4)
_SWA = KVCacheGroupSpec("sliding_window", 4, sliding_window=8)
_MAMBA8 = KVCacheGroupSpec("mamba", 8, mamba_cache_mode="align")

#: Every scenario, with what vLLM 0.33.0 answered.
LOOKAHEAD_SCENARIOS: tuple[LookaheadScenario, ...] = (
    LookaheadScenario(
        "full_attention_l1_block_waits_for_next_token",
        "L=1, one group: an 8-token prompt caches only block 0 (block 1's lookahead token 8 "
        "does not exist yet), so a longer request hits 4 tokens, not 8; once 'a' samples a "
        "token, block 1 is hashed and cached with it, and a request continuing with that "
        "token hits 8 while one continuing with another token hits 4",
        1, (), 24,
        (add("a", _P8), schedule("a"), add("b", (*_P8, 7, 7)), schedule("b"), decode("a"),
         add("c", (*_P8, _A0, 5)), schedule("c"), add("d", (*_P8, 9, 5)), schedule("d"),
         free("a"), free("b"), free("c"), free("d")),
        Recorded(
            ({},
             {"hits": ([[]], 0), "new": [[1, 2]]},
             {},
             {"hits": ([[1]], 4), "new": [[3, 4]]},
             {"new": [[5]]},
             {},
             {"hits": ([[1, 2]], 8), "new": [[6]]},
             {},
             {"hits": ([[1]], 4), "new": [[7, 8]]},
             {},
             {},
             {},
             {}),
            ((0, 1, (100, 101, 102, 103), ((104,),)),
             (0, 1, (104, 105, 106, 107), ((7,),)),
             (0, 1, (104, 105, 106, 107), ((52707,),)),
             (0, 1, (104, 105, 106, 107), ((9,),))),
            (8, 6, 4, 5, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 3, 2, 7, 1),
            ())),
    LookaheadScenario(
        "full_attention_l3_three_tokens_per_hash",
        "L=3, one group: a 13-token prompt hashes blocks ending at 4 and 8 only (12 + 3 > "
        "13); two sampled tokens complete block 2's lookahead; a resend of the prompt hits "
        "8 tokens, and a request of the prompt plus the sampled tokens and one more hits 12",
        3, (), 24,
        (add("a", _P13), schedule("a"), add("b", _P13), schedule("b"), decode("a"),
         decode("a"), add("c", (*_P13, _A0, output_token("a", 1), 3, 3)), schedule("c"),
         free("a"), free("b"), free("c")),
        Recorded(
            ({},
             {"hits": ([[]], 0), "new": [[1, 2, 3, 4]]},
             {},
             {"hits": ([[1, 2]], 8), "new": [[5, 6]]},
             {"new": [[]]},
             {"new": [[]]},
             {},
             {"hits": ([[1, 2, 3]], 12), "new": [[7, 8]]},
             {},
             {},
             {}),
            ((0, 2, (100, 101, 102, 103, 104, 105, 106, 107), ((104, 105, 106), (108, 109, 110))),
             (0, 1, (108, 109, 110, 111), ((112, 52707, 52714),))),
            (8, 7, 6, 5, 4, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 3, 2, 1),
            ())),
    LookaheadScenario(
        "multimodal_item_in_lookahead_tokens",
        "L=1: an image starting at token 8 is in block 1's key (its lookahead token 8 is in "
        "the image), so a request with another image there hits block 0 only, one with the "
        "same image 8 tokens",
        1, (), 24,
        (add("a", _P12, mm=[("img-a", 8, 4)]), schedule("a"),
         add("b", _P12, mm=[("img-b", 8, 4)]), schedule("b"),
         add("c", _P12, mm=[("img-a", 8, 4)]), schedule("c"),
         free("a"), free("b"), free("c")),
        Recorded(
            ({},
             {"hits": ([[]], 0), "new": [[1, 2, 3]]},
             {},
             {"hits": ([[1]], 4), "new": [[4, 5]]},
             {},
             {"hits": ([[1, 2]], 8), "new": [[6]]},
             {},
             {},
             {}),
            ((0, 2, (100, 101, 102, 103, 104, 105, 106, 107), ((104,), (108,))),
             (0, 1, (104, 105, 106, 107), ((108,),))),
            (6, 5, 3, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 4, 2, 1),
            ()), needs=("multimodal",)),
    LookaheadScenario(
        "full_and_sliding_window_l2",
        "L=2, full attention and a sliding window (8 tokens), both at block 4: every group "
        "caches and hits only hashed blocks; each group's BlockStored lists the lookahead "
        "tokens",
        2, (_FULL, _SWA), 40,
        (add("a", _P13), schedule("a"), add("b", (*_P13, 1, 2, 3)), schedule("b"),
         decode("a"), decode("a"), free("a"), add("c", (*_P13, _A0, output_token("a", 1), 4)),
         schedule("c"), free("b"), free("c")),
        Recorded(
            ({},
             {"hits": ([[], []], 0), "new": [[1, 2, 3, 4], [5, 6, 7, 8]]},
             {},
             {"hits": ([[1, 2], [5, 6]], 8), "new": [[9, 10], [11, 12]]},
             {"new": [[], []]},
             {"new": [[], []]},
             {},
             {},
             {"hits": ([[1, 2, 3], [0, 6, 7]], 12), "new": [[8], [4]]},
             {},
             {}),
            ((0, 2, (100, 101, 102, 103, 104, 105, 106, 107), ((104, 105), (108, 109))),
             (1, 2, (100, 101, 102, 103, 104, 105, 106, 107), ((104, 105), (108, 109))),
             (0, 1, (108, 109, 110, 111), ((112, 1),)),
             (1, 1, (108, 109, 110, 111), ((112, 1),)),
             (0, 1, (108, 109, 110, 111), ((112, 52707),)),
             (1, 1, (108, 109, 110, 111), ((112, 52707),))),
            (4, 8, 12, 10, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30,
             31, 32, 33, 34, 35, 36, 37, 38, 39, 9, 11, 5, 3, 2, 1, 7, 6),
            ()), needs=("kv_cache_groups", "sliding_window")),
    LookaheadScenario(
        "mamba_tail_leaves_lookahead_tokens",
        "L=2, full attention at block 4 and a Mamba 'align' group at block 8 (fine-grained "
        "hits at the 4-token hash block): a 17-token prompt computed as 12 then 5 keys its "
        "Mamba state at 12 (17 - max(1, L) = 15, down to the hash block; 16 without "
        "lookahead), so a longer request hits 12 tokens, ending inside Mamba block 1 (copied "
        "on write)",
        2, (_FULL, _MAMBA8), 40,
        (add("a", _P17), schedule("a", 12), schedule("a"), decode("a"),
         add("b", (*_P17, 7, 7, 7)), schedule("b"), decode("b"), free("a"), free("b")),
        Recorded(
            ({},
             {"hits": ([[], []], 0), "new": [[1, 2, 3], [0, 4]]},
             {"new": [[5, 6], [8]]},
             {"new": [[], []]},
             {},
             {"hits": ([[1, 2, 3], [0, 7]], 12), "new": [[4, 9], [10, 11]]},
             {"new": [[12], []]},
             {},
             {}),
            ((0, 3, (100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111), ((104, 105),
             (108, 109), (112, 113))),
             (1, 0, (100, 101, 102, 103, 104, 105, 106, 107), ()),
             (1, 1, (108, 109, 110, 111), ((112, 113),)),
             (0, 1, (112, 113, 114, 115), ((116, 52707),)),
             (1, 0, (108, 109, 110, 111, 112, 113, 114, 115), ()),
             (0, 1, (112, 113, 114, 115), ((116, 7),)),
             (1, 1, (108, 109, 110, 111, 112, 113, 114, 115), ((116, 7),))),
            (11, 12, 9, 8, 6, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29,
             30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 7, 10, 5, 4, 3, 2, 1),
            ((4, 7), (7, 10))), needs=("kv_cache_groups", "mamba", "fine_grained_hits")),
)
