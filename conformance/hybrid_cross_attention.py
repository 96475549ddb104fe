"""Golden scenarios of an encoder-decoder model's KV cache: decoder self-attention beside a
cross-attention group (docs/semantics.md#cross-attention-groups).

A cross-attention group holds the encoder's output for the request: ``allocate_slots(...,
num_encoder_tokens=E)`` in the step that admits the request sizes its table to
``cdiv(E, block_size)`` blocks, apart from the decoder's tokens, and later steps pass 0 and
leave it alone; nothing is cached (prefix caching is off for encoder-decoder models) and the
blocks go back with the request, group by group, each table reversed.

``answers`` are what vLLM's own ``KVCacheManager`` answered to each op, replayed through
kvcheck's vLLM adapter (``--kv-impl=vllm``) on vLLM 0.33.0 and 0.10.2 and copied here as
literals: ``allocate_slots``' new block ids per group, None for a refusal, ``NO_CALL`` for an
op that makes no allocation; ``free_queue`` is the free queue after the last op, head first.
A scenario without a release's table was not recorded there, and says why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvcheck.conformance.ops import Op, add, decode, free, schedule
from kvcheck.conformance.protocol import KVCacheGroupSpec

__all__ = ["CROSS_ATTENTION_SCENARIOS", "NO_CALL", "CrossAttentionScenario"]

#: An op that makes no ``allocate_slots`` call (``add``, ``free``).
NO_CALL = "-"

#: ``allocate_slots``' answer: new block ids per group, or None (refused).
Answer = list[list[int]] | None


@dataclass(frozen=True)
class CrossAttentionScenario:
    """``ops`` on a pool of ``num_blocks`` blocks (null block included), prefix caching off,
    ``groups`` at their block sizes; per vLLM profile, each op's answer and the final free
    queue. ``missing``: why a profile has no table (a scenario that release cannot run)."""

    name: str
    why: str
    groups: tuple[KVCacheGroupSpec, ...]
    num_blocks: int
    ops: tuple[Op, ...]
    answers: Mapping[str, tuple[Answer | str, ...]]
    free_queue: Mapping[str, tuple[int, ...]]
    missing: Mapping[str, str]


_FULL_CROSS = (KVCacheGroupSpec("full_attention", 2), KVCacheGroupSpec("cross_attention", 2))

CROSS_ATTENTION_SCENARIOS: tuple[CrossAttentionScenario, ...] = (
    CrossAttentionScenario(
        "encoder_tokens_size_cross_attention",
        "full attention and cross attention, block size 2: a 5-token prompt with 6 encoder "
        "tokens takes 3 + 3 blocks; decode steps grow only the decoder's table; a second "
        "request waits for the first one's blocks",
        _FULL_CROSS,
        9,
        (add("a", range(100, 105), encoder=6), schedule("a"), decode("a"), decode("a"),
         add("b", range(200, 203), encoder=6), schedule("b"), free("a"), schedule("b")),
        {"vllm-0.33": (NO_CALL, [[1, 2, 3], [4, 5, 6]], [[], []], [[7], []], NO_CALL, None,
                       NO_CALL, [[6, 5], [4, 7, 3]]),
         "vllm-0.10": (NO_CALL, [[1, 2, 3], [4, 5, 6]], [[], []], [[7], []], NO_CALL, None,
                       NO_CALL, [[8, 7], [3, 2, 1]])},
        {"vllm-0.33": (2, 1, 8), "vllm-0.10": (6, 5, 4)},
        {},
    ),
    CrossAttentionScenario(
        "cross_attention_first_with_larger_blocks",
        "cross attention (block size 4) as group 0 before full attention (block size 2): "
        "5 encoder tokens take 2 blocks from the queue head first, then the 7-token prompt "
        "takes 4; freed group by group, each table reversed",
        (KVCacheGroupSpec("cross_attention", 4), KVCacheGroupSpec("full_attention", 2)),
        10,
        (add("a", range(100, 107), encoder=5), schedule("a"), decode("a"),
         add("b", range(200, 203), encoder=5), schedule("b"), free("a"), schedule("b")),
        {"vllm-0.33": (NO_CALL, [[1, 2], [3, 4, 5, 6]], [[], []], NO_CALL, None, NO_CALL,
                       [[6, 5], [4, 3]]),
         "vllm-0.10": (NO_CALL, [[1, 2], [3, 4, 5, 6]], [[], []], NO_CALL, None, NO_CALL,
                       [[7, 8], [9, 2]])},
        {"vllm-0.33": (2, 1, 7, 8, 9), "vllm-0.10": (1, 6, 5, 4, 3)},
        {},
    ),
    CrossAttentionScenario(
        "decode_at_a_full_pool_is_refused",
        "full attention and cross attention fill the pool at admission; the decode step that "
        "needs a fourth decoder block is refused (None), the tables unchanged",
        _FULL_CROSS,
        7,
        (add("a", range(100, 105), encoder=6), schedule("a"), decode("a"), decode("a")),
        {"vllm-0.33": (NO_CALL, [[1, 2, 3], [4, 5, 6]], [[], []], None)},
        {"vllm-0.33": ()},
        {"vllm-0.10": "vLLM 0.10.2 raises ValueError('Cannot get 1 free blocks from the pool') "
                      "at the last decode instead of refusing it: its capacity check counts "
                      "the cross-attention blocks a running request holds as a negative need "
                      "(a real bug, not reproduced; docs/semantics.md#cross-attention-groups)"},
    ),
)
