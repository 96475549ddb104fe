"""Golden scenarios of vLLM 0.33's Mamba shared-prefix checkpoint (capability
``mamba_shared_prefix_checkpoint``, ``KVCacheSpec.mamba_shared_prefix_checkpoint``;
docs/semantics.md#the-shared-prefix-checkpoint).

vLLM 0.33's ``CacheConfig.enable_mamba_shared_prefix_checkpoint`` reaches its
``KVCacheManager``, which keeps it only with an EAGLE group (its coordinator's
``eagle_group_ids``: the groups flagged ``is_eagle_group``, every group under ``use_eagle``
when none is), fine-grained partial hits on and no re-prefillable tail
(``num_prefill_lookahead`` <= 1), and otherwise drops it without an error. Kept, a Mamba
"align" group's ``_cache_partial_tail_block`` also keys the state at the request's
``shared_prefix_boundary`` (its lookup's "junction": where the common hit stops plus what one
group alone would have hit more) when an allocation's chunk ends exactly there, inside the
prompt: a sibling sharing the prefix then hits it, inside a Mamba block, copied on write.

Every scenario runs on full attention of block 4 beside a Mamba "align" group of block 8
(hash block 4, scheduler block 8), 48 blocks: request ``a`` (24 tokens, 100..123) is admitted
whole and freed (Mamba keys only its prompt checkpoint); ``b`` shares ``a``'s first
``share`` tokens then diverges, so its lookup finds a longer full-attention hit than Mamba's:
its junction; ``b`` is prefilled a hash block (4 tokens) a step, so one chunk ends at the
junction (vLLM's scheduler ends one there itself, ``request.shared_prefix_boundary``); then
``c`` shares the same ``share`` tokens and is admitted whole.

``answers`` are what vLLM 0.33.0's own ``KVCacheManager`` answered to each op, replayed
through kvcheck's vLLM adapter (``Driver(load_impl("vllm"), spec)``, sha256 and
``PYTHONHASHSEED=0``) and copied here as literals: each op's ``StepResult`` (hits and new block
ids per group, 0 the null block; ``{}`` for an op that calls nothing), ``num_free`` the
``num_free_blocks()`` after each op, and ``free_queue`` the free queue after the last op, head
first. vLLM 0.10.2 has no such flag (its ``KVCacheManager`` takes no
``enable_mamba_shared_prefix_checkpoint``): there is no 0.10 table, the spec is declined.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcheck.conformance.ops import Op, StepResult, add, free, schedule
from kvcheck.conformance.protocol import KVCacheGroupSpec

__all__ = ["SCENARIOS", "SharedPrefixRecorded", "SharedPrefixScenario"]


@dataclass(frozen=True)
class SharedPrefixRecorded:
    """vLLM 0.33.0's answers to a scenario's ops, the free count after each op and the final
    free queue (head first)."""

    answers: tuple[StepResult, ...]
    num_free: tuple[int, ...]
    free_queue: tuple[int, ...]


@dataclass(frozen=True)
class SharedPrefixScenario:
    """``ops`` on ``num_blocks`` blocks (null block included), spec ``block_size`` 4, prefix
    caching on, ``groups`` the ``kv_cache_groups``, with ``use_eagle``,
    ``num_prefill_lookahead`` ``prefill_lookahead`` and ``mamba_shared_prefix_checkpoint``
    ``flag``; ``keyed``: whether vLLM keyed b's junction state (c's hit reaches it)."""

    name: str
    why: str
    groups: tuple[KVCacheGroupSpec, ...]
    use_eagle: bool
    prefill_lookahead: int
    flag: bool
    keyed: bool
    ops: tuple[Op, ...]
    recorded: SharedPrefixRecorded
    num_blocks: int = 48


_FULL = KVCacheGroupSpec("full_attention", 4)
_FULL_EAGLE = KVCacheGroupSpec("full_attention", 4, is_eagle_group=True)
_MAMBA = KVCacheGroupSpec("mamba", 8, mamba_cache_mode="align")
_A = tuple(range(100, 124))
_HASH_BLOCK = 4


def _ops(share: int) -> tuple[Op, ...]:
    """The scenario's script: ``a`` whole and freed, ``b`` (``a``'s first ``share`` tokens
    then 10 of its own) a hash block a step, ``c`` (the same ``share`` then 6 of its own)
    whole, then ``b`` and ``c`` freed."""
    b = (*_A[:share], *range(900, 910))
    c = (*_A[:share], *range(800, 806))
    steps = [schedule("b", _HASH_BLOCK) for _ in range(len(b) // _HASH_BLOCK)]
    return (add("a", _A), schedule("a"), free("a"), add("b", b), *steps,
            add("c", c), schedule("c"), free("b"), free("c"))


#: Every scenario, with what vLLM 0.33.0 answered.
SCENARIOS: tuple[SharedPrefixScenario, ...] = (
    SharedPrefixScenario(
        "junction_keyed_and_hit",
        "use_eagle, flag on, share 18: b's lookup hits nothing in Mamba (a keyed only its "
        "checkpoint at 20) and 12 tokens in full attention (16 less EAGLE's dropped block), "
        "its junction; b's chunk ending at 12, inside Mamba block 1, keys that state, so c "
        "hits 12 tokens, Mamba's through a copy-on-write block",
        (_FULL, _MAMBA), True, 0, True, True, _ops(18), SharedPrefixRecorded(
            ({},
             {"hits": ([[], []], 0), "new": [[1, 2, 3, 4, 5, 6], [0, 0, 7]]},
             {},
             {},
             {"hits": ([[], []], 0), "new": [[8], [9]]},
             {"new": [[10], []]},
             {"new": [[11], [12]]},
             {"new": [[13], []]},
             {"new": [[15], [16]]},
             {"new": [[17], []]},
             {"new": [[18], [19]]},
             {},
             {"hits": ([[1, 2, 3], [0, 14]], 12), "new": [[20, 21, 22], [23, 24]]},
             {},
             {}),
            (47, 40, 47, 47, 45, 44, 42, 41, 40, 40, 38, 38, 29, 39, 47),
            (19, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44,
             45, 46, 47, 6, 5, 4, 7, 9, 12, 14, 18, 17, 15, 13, 11, 10, 8, 16, 22, 21, 20, 3, 2,
             1, 24, 23))),
    SharedPrefixScenario(
        "junction_not_keyed_without_the_flag",
        "the same with the flag off: b's chunk ending at its junction keys nothing, so c hits "
        "only the block boundary b's Mamba state reached: 8 tokens",
        (_FULL, _MAMBA), True, 0, False, False, _ops(18), SharedPrefixRecorded(
            ({},
             {"hits": ([[], []], 0), "new": [[1, 2, 3, 4, 5, 6], [0, 0, 7]]},
             {},
             {},
             {"hits": ([[], []], 0), "new": [[8], [9]]},
             {"new": [[10], []]},
             {"new": [[11], [12]]},
             {"new": [[13], []]},
             {"new": [[14], [15]]},
             {"new": [[16], []]},
             {"new": [[17], [18]]},
             {},
             {"hits": ([[1, 2], [9]], 8), "new": [[19, 20, 21, 22], [0, 23]]},
             {},
             {}),
            (47, 40, 47, 47, 45, 44, 42, 42, 40, 40, 38, 38, 30, 39, 47),
            (18, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43,
             44, 45, 46, 47, 6, 5, 4, 3, 7, 12, 17, 16, 14, 13, 11, 10, 8, 15, 22, 21, 20, 19, 2,
             1, 23, 9))),
    SharedPrefixScenario(
        "flagged_group_without_use_eagle",
        "no use_eagle, full attention flagged is_eagle_group (the coordinator's "
        "eagle_group_ids is not empty: kept, and no hit drops a block), share 14: b's "
        "junction is 12, keyed, so c hits 12",
        (_FULL_EAGLE, _MAMBA), False, 0, True, True, _ops(14), SharedPrefixRecorded(
            ({},
             {"hits": ([[], []], 0), "new": [[1, 2, 3, 4, 5, 6], [0, 0, 7]]},
             {},
             {},
             {"hits": ([[], []], 0), "new": [[8], [9]]},
             {"new": [[10], []]},
             {"new": [[11], [12]]},
             {"new": [[13], []]},
             {"new": [[15], [16]]},
             {"new": [[17], []]},
             {},
             {"hits": ([[1, 2, 3], [0, 14]], 12), "new": [[19, 20], [21, 22]]},
             {},
             {}),
            (47, 40, 47, 47, 45, 44, 42, 41, 40, 39, 40, 32, 40, 47),
            (22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42,
             43, 44, 45, 46, 47, 6, 5, 4, 7, 9, 12, 18, 14, 17, 15, 13, 11, 10, 8, 16, 20, 19, 3,
             2, 1, 21))),
    SharedPrefixScenario(
        "narrowed_off_without_an_eagle_group",
        "no use_eagle and no flagged group, flag on, share 14: vLLM drops the flag without an "
        "error, b's junction at 12 is not keyed and c hits 8",
        (_FULL, _MAMBA), False, 0, True, False, _ops(14), SharedPrefixRecorded(
            ({},
             {"hits": ([[], []], 0), "new": [[1, 2, 3, 4, 5, 6], [0, 0, 7]]},
             {},
             {},
             {"hits": ([[], []], 0), "new": [[8], [9]]},
             {"new": [[10], []]},
             {"new": [[11], [12]]},
             {"new": [[13], []]},
             {"new": [[14], [15]]},
             {"new": [[16], []]},
             {},
             {"hits": ([[1, 2], [9]], 8), "new": [[18, 19, 20], [0, 21]]},
             {},
             {}),
            (47, 40, 47, 47, 45, 44, 42, 42, 40, 39, 40, 33, 40, 47),
            (21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41,
             42, 43, 44, 45, 46, 47, 6, 5, 4, 3, 7, 12, 17, 16, 14, 13, 11, 10, 8, 15, 20, 19, 18,
             2, 1, 9))),
    SharedPrefixScenario(
        "narrowed_off_by_multi_module_mtp",
        "as flagged_group_without_use_eagle with num_prefill_lookahead 2 (a re-prefillable "
        "tail: cache_blocks is not handed the chunk end): dropped, c hits 8",
        (_FULL_EAGLE, _MAMBA), False, 2, True, False, _ops(14), SharedPrefixRecorded(
            ({},
             {"hits": ([[], []], 0), "new": [[1, 2, 3, 4, 5, 6], [0, 0, 7]]},
             {},
             {},
             {"hits": ([[], []], 0), "new": [[8], [9]]},
             {"new": [[10], []]},
             {"new": [[11], [12]]},
             {"new": [[13], []]},
             {"new": [[14], [15]]},
             {"new": [[16], []]},
             {},
             {"hits": ([[1, 2], [9]], 8), "new": [[18, 19, 20], [0, 21]]},
             {},
             {}),
            (47, 40, 47, 47, 45, 44, 42, 42, 40, 39, 40, 33, 40, 47),
            (21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41,
             42, 43, 44, 45, 46, 47, 6, 5, 4, 3, 7, 12, 17, 16, 14, 13, 11, 10, 8, 15, 20, 19, 18,
             2, 1, 9))),
)
