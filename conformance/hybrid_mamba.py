"""Golden scenarios of Mamba (state-space) KV-cache groups (docs/semantics.md#mamba-groups).

A Mamba group holds a request's state after its last computed token, not one entry per token:

* vLLM 0.33, mode ``"align"`` (prefix caching on): the table has ``cdiv(computed + new,
  block_size) + num_speculative_blocks`` entries, all nulls but the block holding the state
  (and the speculative blocks after it, and the state of two allocations ago until the next
  step frees it); ``allocate_slots`` returns the table from its previous end on, null padding
  included, and a step that skips past a speculative block moves it to the table's end (its
  index becomes a null: the table is not append-only). A state ending a block is cached; a
  hit is ONE cached state padded with nulls, refused (None, while blocks are free) when that
  block was cached in the same scheduler step, accepted after ``new_step_starts``;
* vLLM 0.33, mode ``"none"`` (prefix caching off): ``num_tokens + block_size *
  num_speculative_blocks`` slots, the blocks of the ``n - 1`` skipped tokens nulled and freed;
* vLLM 0.10.2 (mode "none" only, prefix caching off): the same slots, nothing skipped.

``answers`` are what vLLM's own ``KVCacheManager`` answered to each op, replayed through
kvcheck's vLLM adapter (``Driver(load_impl("vllm"), spec)`` on vLLM 0.33.0 and 0.10.2: the
driver calls ``new_step_starts`` at each step's start, see ``kvcheck.conformance.driver``)
and copied here as literals: each op's ``StepResult`` (``hits`` and ``new`` block ids per
group; ``{}`` for an op that calls nothing); ``free_queue`` is the free queue after the last
op, head first. A scenario without a release's table was not recorded there, and says why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvcheck.conformance.ops import Op, StepResult, add, decode, free, schedule
from kvcheck.conformance.protocol import KVCacheGroupSpec

__all__ = ["MAMBA_SCENARIOS", "MambaScenario"]


@dataclass(frozen=True)
class MambaScenario:
    """``ops`` on a pool of ``num_blocks`` blocks (null block included) in ``groups`` (the
    spec's ``block_size`` is 4), prefix caching ``caching``; per vLLM profile each op's
    answer and the final free queue. ``missing``: why a profile has no table."""

    name: str
    why: str
    groups: tuple[KVCacheGroupSpec, ...]
    num_blocks: int
    caching: bool
    ops: tuple[Op, ...]
    answers: Mapping[str, tuple[StepResult, ...]]
    free_queue: Mapping[str, tuple[int, ...]]
    missing: Mapping[str, str]


_NO_ALIGN_010 = ("vLLM 0.10.2 has no Mamba prefix caching (its MambaSpec has no "
                 "mamba_cache_mode; Mamba models run with caching off there)")


def _align(block_size: int = 4, spec: int = 0) -> KVCacheGroupSpec:
    return KVCacheGroupSpec("mamba", block_size, mamba_cache_mode="align",
                            num_speculative_blocks=spec)


def _none(block_size: int = 4, spec: int = 0) -> KVCacheGroupSpec:
    return KVCacheGroupSpec("mamba", block_size, mamba_cache_mode="none",
                            num_speculative_blocks=spec)


_FULL = KVCacheGroupSpec("full_attention", 4)



def _r(first: int, n: int) -> range:
    """``n`` token ids from ``first``."""
    return range(first, first + n)


MAMBA_SCENARIOS: tuple[MambaScenario, ...] = (
    MambaScenario(
        "same_step_hit_is_refused",
        "a request hitting a Mamba state cached in this scheduler step is refused (None, "
        "with free blocks), and admitted at the next step with the hit: ONE cached state "
        "padded with nulls",
        (_align(),),
        12,
        True,
        (add("a", _r(100, 12)), schedule("a", 8), add("b", _r(100, 12)), schedule("b"),
         schedule("b"), schedule("a"), decode("b"), free("a"), free("b")),
        {"vllm-0.33": ({},
                       {"hits": ([[]], 0), "new": [[0, 1]]},
                       {},
                       {"hits": ([[0, 1]], 8), "new": None},
                       {"hits": ([[0, 1]], 8), "new": [[2]]},
                       {"new": [[3]]},
                       {"new": [[4]]},
                       {},
                       {})},
        {"vllm-0.33": (4, 5, 6, 7, 8, 9, 10, 11, 3, 1, 2)},
        {"vllm-0.10": _NO_ALIGN_010},
    ),
    MambaScenario(
        "speculative_block_relocates",
        "one speculative block: a step that skips past it moves it to the table's end and "
        "leaves a null at its index (the table is not append-only)",
        (_align(spec=1),),
        12,
        True,
        (add("a", _r(100, 20)), schedule("a", 4), schedule("a", 8), schedule("a", 8), decode("a"),
         free("a")),
        {"vllm-0.33": ({},
                       {"hits": ([[]], 0), "new": [[1, 2]]},
                       {"new": [[2, 3]]},
                       {"new": [[3, 4]]},
                       {"new": [[5]]},
                       {})},
        {"vllm-0.33": (5, 4, 6, 7, 8, 9, 10, 11, 1, 2, 3)},
        {"vllm-0.10": _NO_ALIGN_010},
    ),
    MambaScenario(
        "full_attention_and_mamba_hit",
        "full attention beside Mamba 'align': the common hit is where Mamba has a cached "
        "state (states cached at the ends of aligned steps, 8 and 12 tokens); freed group "
        "by group",
        (_FULL, _align()),
        24,
        True,
        (add("a", _r(100, 14)), schedule("a", 8), schedule("a", 4), schedule("a"), decode("a"),
         free("a"), add("b", [*_r(100, 14), 7, 7, 7]), schedule("b"), decode("b"), free("b")),
        {"vllm-0.33": ({},
                       {"hits": ([[], []], 0), "new": [[1, 2], [0, 3]]},
                       {"new": [[4], [5]]},
                       {"new": [[6], [7]]},
                       {"new": [[], []]},
                       {},
                       {},
                       {"hits": ([[1, 2, 4], [0, 0, 5]], 12), "new": [[7, 6], [0, 8]]},
                       {"new": [[], []]},
                       {})},
        {"vllm-0.33": (8, 6, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 3, 5, 7,
                       4, 2, 1)},
        {"vllm-0.10": _NO_ALIGN_010},
    ),
    MambaScenario(
        "new_request_takes_one_plus_speculative",
        "a pool of 4 blocks: two new requests take 1 + num_speculative_blocks blocks each "
        "however long their prompt; a decode then needs a block the pool lacks and is "
        "refused",
        (_align(spec=1),),
        5,
        True,
        (add("a", _r(100, 10)), schedule("a"), add("b", _r(200, 10)), schedule("b"),
         decode("a", 3), free("b"), decode("a", 3)),
        {"vllm-0.33": ({},
                       {"hits": ([[]], 0), "new": [[0, 0, 1, 2]]},
                       {},
                       {"hits": ([[]], 0), "new": [[0, 0, 3, 4]]},
                       {"new": None},
                       {},
                       {"new": [[4]]})},
        {"vllm-0.33": (3,)},
        {"vllm-0.10": _NO_ALIGN_010},
    ),
    MambaScenario(
        "mode_none_frees_skipped_blocks",
        "mode 'none' with one speculative block, caching off: num_tokens + block_size "
        "slots (lookahead included); 0.33 frees the blocks of the n - 1 skipped tokens, "
        "0.10.2 keeps them",
        (_none(spec=1),),
        12,
        False,
        (add("a", _r(100, 10)), schedule("a"), decode("a"), decode("a"), decode("a", 1, 2),
         decode("a", 1, 2), free("a")),
        {"vllm-0.33": ({},
                       {"hits": ([[]], 0), "new": [[1, 2, 3, 4]]},
                       {"new": [[]]},
                       {"new": [[]]},
                       {"new": [[2]]},
                       {"new": [[]]},
                       {}),
         "vllm-0.10": ({},
                       {"hits": ([[]], 0), "new": [[1, 2, 3, 4]]},
                       {"new": [[]]},
                       {"new": [[]]},
                       {"new": [[5]]},
                       {"new": [[]]},
                       {})},
        {"vllm-0.33": (2, 4, 3, 1, 5, 6, 7, 8, 9, 10, 11),
         "vllm-0.10": (6, 7, 8, 9, 10, 11, 5, 4, 3, 2, 1)},
        {},
    ),
    MambaScenario(
        "full_attention_and_mamba_caching_off",
        "full attention (block 4) beside Mamba 'none' (block 8, one speculative block), "
        "caching off: the Mamba table sized by num_tokens + 8 slots",
        (_FULL, _none(8, 1)),
        20,
        False,
        (add("a", _r(100, 14)), schedule("a"), decode("a"), decode("a", 1, 2), decode("a"),
         free("a")),
        {"vllm-0.33": ({},
                       {"hits": ([[], []], 0), "new": [[1, 2, 3, 4], [5, 6, 7]]},
                       {"new": [[], []]},
                       {"new": [[5], [8]]},
                       {"new": [[], []]},
                       {}),
         "vllm-0.10": ({},
                       {"hits": ([[], []], 0), "new": [[1, 2, 3, 4], [5, 6, 7]]},
                       {"new": [[], []]},
                       {"new": [[8], [9]]},
                       {"new": [[], []]},
                       {})},
        {"vllm-0.33": (8, 7, 6, 5, 4, 3, 2, 1, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19),
         "vllm-0.10": (10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 8, 4, 3, 2, 1, 9, 7, 6, 5)},
        {},
    ),
)

