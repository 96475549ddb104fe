"""Cases found by mutation testing (docs/mutation.md): bugs the other areas' scripted tests
did not reach and the random workloads reached only rarely, each pinned by one scripted
scenario: a multimodal item that ends exactly on a block boundary, one of two blocks cached
under the same key evicted, and lookahead slots during a chunked prefill.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from kvcheck.conformance.ops import add, decode, free, one_token_decodes, schedule
from kvcheck.conformance.protocol import VLLM_PROFILES

if TYPE_CHECKING:
    from kvcheck.conformance.differential import PairFactory


@pytest.mark.kv_capability("block_hashes", "extra_keys")
@pytest.mark.kv_profiles(*VLLM_PROFILES)
@pytest.mark.parametrize("block_size", [4, 1])
def test_mm_item_ending_on_a_block_boundary(kv_pair: PairFactory, block_size: int) -> None:
    """Images whose token range ends exactly where a block starts: each block carries the
    keys vLLM gives it, through prefill and decode. 0.33 overlaps half-open ranges, so the
    block starting at an item's end has no key for it, also the first block completed by
    decode, whose scan restarts at the first item; 0.10.2's scan keeps the last item there
    (docs/semantics.md#extra-keys)."""
    pair = kv_pair(num_blocks=64, block_size=block_size)
    # img0 covers [2, 8) and ends where block 2 starts (block_size 4); img1 covers [12, 16)
    # and ends with the prompt, where the first decode block starts.
    mm = [("img0", 2, 6), ("img1", 12, 4)]
    pair.run(one_token_decodes(
        [add("x", range(1, 17), mm=mm), schedule("x", 9), schedule("x"), decode("x", 4)],
        "multi_token_decode" in pair.impl.capabilities))
    assert pair.oracle is not None
    mine = [bytes(h).hex() for h in pair.impl.manager.block_hashes("x")]
    theirs = [bytes(h).hex() for h in pair.oracle.manager.block_hashes("x")]
    assert mine == theirs and len(mine) == 20 // block_size, (
        f"block_hashes {mine}, reference {theirs}\n" + pair.impl.snippet())


@pytest.mark.kv_capability("prefix_caching")
@pytest.mark.kv_profiles(*VLLM_PROFILES)
def test_evicting_one_of_two_duplicate_blocks_keeps_the_other(kv_pair: PairFactory) -> None:
    """A block-aligned prompt run twice caches its last block twice under one key (vLLM does
    not deduplicate). Evicting the first copy must leave the second findable: a later prompt
    still hits the whole prefix, through the surviving copy."""
    pair = kv_pair(num_blocks=10, block_size=4)
    pair.run([add("a", range(8)), schedule("a"), add("b", range(8)), schedule("b")])
    a, b = pair.impl.tables()["a"], pair.impl.tables()["b"]
    assert a[0] == b[0] and a[1] != b[1], (
        f"b should hit a's first block and recompute its second: tables a={a}, b={b}\n"
        + pair.impl.snippet())
    # Freed last-block-first, a's copy of block 1 is queued before b's: after the blocks
    # never used, it is the first cached block a full pool hands out again.
    pair.run([free("a"), free("b")])
    keep = 2  # b's copy of block 1 and the shared block 0 stay in the queue
    fill = pair.impl.manager.num_free_blocks() - keep
    pair.run([add("fill", range(1000, 1000 + 4 * fill)), schedule("fill")])
    assert a[1] in pair.impl.tables()["fill"], (
        f"filling {fill} blocks should evict a's copy {a[1]}: {pair.impl.tables()}\n"
        + pair.impl.snippet())
    pair.apply(add("c", list(range(8)) + [99]))
    got = pair.apply(schedule("c"))
    assert got["hits"] == ([a[0], b[1]], 8), (
        f"c must hit block {a[0]} and the surviving copy {b[1]} (8 tokens), got "
        f"{got['hits']}\n" + pair.impl.snippet())


@pytest.mark.kv_generic
@pytest.mark.kv_capability("prefix_caching", "lookahead")
def test_lookahead_slots_in_a_chunked_prefill_are_not_cached(kv_pair: PairFactory) -> None:
    """Lookahead slots of a prefill chunk cover prompt tokens of the *next* chunk, whose KV is
    not computed yet: the block holding them must not be cached (so never hit) until a later
    chunk computes it. (A one-shot prefill hides this: its lookahead lies past the prompt.)"""
    pair = kv_pair(num_blocks=16, block_size=4)
    # 5 tokens computed, 4 lookahead slots: tokens 5..8 are in blocks 1 and 2, not computed.
    pair.run([add("a", range(20)), schedule("a", 5, lookahead=4), add("b", range(20))])
    got = pair.apply(schedule("b"))
    assert got["hits"][1] <= 4, (
        f"only a's first block is computed; b hit {got['hits']}\n" + pair.impl.snippet())
    if pair.spec.profile != "generic":
        assert got["hits"] == (pair.impl.tables()["a"][:1], 4), (
            f"b must hit a's first block only, got {got['hits']}\n" + pair.impl.snippet())
