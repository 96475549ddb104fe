"""Eviction order: the golden free-queue traces per profile, LRU refresh on a hit,
lazy eviction and tail-first order within a request.

Expected orders are the literal tables of docs/semantics.md#golden-traces (vLLM 0.33.0, 0.10.2).
They are observed without any capability by draining the pool: ``allocate_slots`` must return
block ids in free-queue order. With ``free_queue_order`` the queue is also compared
directly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from kvcheck.conformance.groups import one_group
from kvcheck.conformance.ops import add, free, schedule
from kvcheck.conformance.protocol import VLLM_PROFILES
from kvcheck.conformance.sizes import tokens

if TYPE_CHECKING:
    from kvcheck.conformance.differential import Pair, PairFactory

# test_evict (T6): r0 = 5 full + partial block, r1 = 3 full, freed in that order.
GOLDEN_T6 = {
    "vllm-0.33": {"after_r0": [6, 10, 5, 4, 3, 2, 1],
                  "after_r1": [6, 10, 5, 4, 3, 2, 1, 9, 8, 7], "r2_new": [6]},
    "vllm-0.10": {"after_r0": [10, 6, 5, 4, 3, 2, 1],
                  "after_r1": [10, 6, 5, 4, 3, 2, 1, 9, 8, 7], "r2_new": [10]},
}
# test_prefill: shared 3-block prefix, both requests freed, then the whole pool reallocated.
GOLDEN_PREFILL = {
    "vllm-0.33": [5, 4, 6, 7, 8, 9, 10, 3, 2, 1],
    "vllm-0.10": [6, 7, 8, 9, 10, 4, 5, 3, 2, 1],
}
# T7: caching off, 40 tokens on 3 blocks of 16, then free.
GOLDEN_T7 = {"vllm-0.33": [3, 2, 1, 4, 5], "vllm-0.10": [4, 5, 3, 2, 1]}


def drain_order(pair: Pair) -> list[int]:
    """Allocate every free block to one fresh request; the ids come back in queue order."""
    n = pair.impl.manager.num_free_blocks()
    rid = f"drain{len(pair.ops)}"
    pair.run([add(rid, [900_000 + i for i in range(n * pair.spec.block_size)]), schedule(rid)])
    return pair.impl.tables()[rid][0]


def check_queue(pair: Pair, expected: list[int], when: str) -> None:
    if "free_queue_order" in pair.impl.impl.info.capabilities:
        got = list(pair.impl.manager.free_block_ids())
        assert got == expected, (
            f"free queue {when}: got {got}, vLLM gives {expected}\n" + pair.impl.snippet())


@pytest.mark.kv_profiles(*VLLM_PROFILES)
def test_free_order_golden_test_evict(kv_pair: PairFactory, kv_profile: str) -> None:
    """T6 / vLLM test_evict: hashed blocks go to the tail chain-tail first; the partial block
    goes to the head (0.33) or the tail (0.10); a 35-token request then hits 2 blocks."""
    golden = GOLDEN_T6[kv_profile]
    pair = kv_pair(num_blocks=11, block_size=16)
    last = 5 * 16 + 7
    pair.run([add("0", range(last)), schedule("0"),
              add("1", range(last, last + 48)), schedule("1"), free("0")])
    check_queue(pair, golden["after_r0"], "after freeing r0")
    pair.apply(free("1"))
    check_queue(pair, golden["after_r1"], "after freeing r1")
    pair.apply(add("2", range(35)))
    got = one_group(pair.apply(schedule("2")))
    assert got["hits"] == ([1, 2], 32), f"r2 should hit [1, 2] (32 tokens), got {got['hits']}"
    assert got["new"] == golden["r2_new"], (
        f"r2's new block: got {got['new']}, vLLM gives {golden['r2_new']}\n" + pair.impl.snippet())


@pytest.mark.kv_profiles(*VLLM_PROFILES)
def test_free_order_golden_test_prefill(kv_pair: PairFactory, kv_profile: str) -> None:
    """vLLM test_prefill: after two requests sharing a prefix are freed, the pool is
    reallocated in the golden order."""
    pair = kv_pair(num_blocks=11, block_size=16)
    common = list(range(48))
    pair.run([add("0", common + [1000 + i for i in range(7)]), schedule("0"),
              add("1", common + [2000 + i for i in range(5)]), schedule("1"),
              free("0"), free("1")])
    check_queue(pair, GOLDEN_PREFILL[kv_profile], "after freeing both requests")
    order = drain_order(pair)
    assert order == GOLDEN_PREFILL[kv_profile], (
        f"reallocation order {order}, vLLM gives {GOLDEN_PREFILL[kv_profile]}\n"
        + pair.impl.snippet())


@pytest.mark.kv_profiles(*VLLM_PROFILES)
def test_free_order_golden_caching_off(kv_pair: PairFactory, kv_profile: str) -> None:
    """T7: with caching off, freed blocks go to the head (0.33, LIFO) or tail (0.10)."""
    pair = kv_pair(num_blocks=6, block_size=16, enable_caching=False)
    pair.run([add("r", range(40)), schedule("r"), free("r")])
    check_queue(pair, GOLDEN_T7[kv_profile], "after free")
    assert drain_order(pair) == GOLDEN_T7[kv_profile]


def test_lru_refresh_on_hit(kv_pair: PairFactory) -> None:
    """A hit on a free cached block takes it out of the queue; freed again, it goes to the
    tail (evicted last)."""
    pair = kv_pair(num_blocks=10, block_size=4)
    pair.run([add("a", range(9)), schedule("a"), add("b", range(100, 109)), schedule("b"),
              free("a"), free("b"),
              add("c", list(range(4)) + [55]), schedule("c"), free("c")])
    order = drain_order(pair)
    assert order[-1] == 1, (
        f"block 1 (hit by c, then freed) must be evicted last; drain order {order}\n"
        + pair.impl.snippet())


@pytest.mark.kv_generic
@pytest.mark.kv_capability("prefix_caching")
def test_lazy_eviction_freed_block_still_hits(kv_pair: PairFactory) -> None:
    """A freed cached block keeps its hash and still hits until it is reused."""
    pair = kv_pair(num_blocks=10, block_size=4)
    bs = pair.spec.block_size
    pair.run([add("a", range(tokens(3, bs))), schedule("a"), free("a"),
              add("b", range(tokens(3, bs, 1)))])
    got = one_group(pair.apply(schedule("b")))
    assert got["hits"][1] == tokens(3, bs), (
        f"lazy eviction (hit correctness): b should hit a's 3 freed blocks, got {got['hits']}: "
        "a finished request's full computed blocks stay cached until the pool needs them, "
        "and nothing needed evicting here (a block left uncached, or evicted early)")


def test_eviction_is_tail_first_within_a_request(kv_pair: PairFactory) -> None:
    """Under pressure the deepest block of a freed chain is evicted first, so the chain never
    gets a hole: a later lookup still hits a prefix."""
    pair = kv_pair(num_blocks=6, block_size=4)  # 5 usable blocks
    pair.run([add("a", range(17)), schedule("a"), free("a"),     # a: 4 full + 1 partial
              add("x", range(500, 506)), schedule("x")])         # takes 2 blocks
    pair.apply(add("b", range(17)))
    got = one_group(pair.apply(schedule("b")))
    assert got["hits"][1] >= 8, (
        f"after evicting 2 blocks of a's chain, b should still hit its first blocks; "
        f"got {got['hits']}\n" + pair.impl.snippet())


@pytest.mark.kv_profiles(*VLLM_PROFILES)
def test_unhashed_blocks_reused_before_cached_ones(kv_pair: PairFactory, kv_profile: str) -> None:
    """0.33: a request's unhashed tail block is reused first (LIFO head) and cached blocks
    stay; 0.10: everything is appended, so the never-used blocks go first."""
    pair = kv_pair(num_blocks=8, block_size=4)
    pair.run([add("a", range(10)), schedule("a"), free("a"), add("n", [7, 7, 7]),
              schedule("n")])
    new = pair.impl.tables()["n"][0]
    expected = {"vllm-0.33": [3], "vllm-0.10": [4]}[kv_profile]
    assert new == expected, f"next single block: got {new}, vLLM gives {expected}"
