"""Prefix caching: the hit cap, whole blocks only, shared prefixes, own hits not evicted,
the prompt-logprobs skip flag, caching off, reset and duplicate keys.

Workloads are stated in blocks (``kvcheck.conformance.sizes.tokens``) and run at the block
size the implementation declares (``kv_sizes``). A test that looks up the blocks of a request
still running needs ``caches_running_requests`` (implied by the vLLM profiles); without it the
same lookup is checked once that request finished (``cached_at_finish``), when a design that
caches at finish has cached its blocks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from kvcheck.conformance.groups import one_group, one_group_tables
from kvcheck.conformance.ops import Op, add, decode, free, one_token_decodes, reset, schedule
from kvcheck.conformance.sizes import tokens

if TYPE_CHECKING:
    from kvcheck.conformance.differential import Pair, PairFactory
    from kvcheck.conformance.sizes import DeclaredSizes


def cached_at_finish(pair: Pair, rid: str, prompt: list[int]) -> list[Op]:
    """For a design without ``caches_running_requests``: ``rid`` runs ``prompt`` and finishes,
    so its blocks are cached before the test's requests look them up (none with it)."""
    if "caches_running_requests" in pair.impl.capabilities:
        return []
    return [add(rid, prompt), schedule(rid), free(rid)]


def finish_unless_running_cached(pair: Pair, rid: str) -> list[Op]:
    """``free(rid)`` for a design without ``caches_running_requests`` (its blocks are cached
    when it finishes), nothing with it (they are cached while it runs)."""
    return [] if "caches_running_requests" in pair.impl.capabilities else [free(rid)]


@pytest.mark.kv_generic
@pytest.mark.kv_capability("prefix_caching")
@pytest.mark.parametrize("num_tokens", [47, 48, 49])
def test_hit_cap_is_num_tokens_minus_one(kv_pair: PairFactory, kv_sizes: DeclaredSizes,
                                         num_tokens: int) -> None:
    """The last token is always recomputed: with 48 cached tokens (3 blocks of 16), a 48-token
    prompt hits 32 tokens, 47 hits 32, 49 hits 48. ``num_tokens`` is the length at 16-token
    blocks (3 blocks and -1, 0, +1 tokens); at the declared block sizes the same in blocks."""
    offset = num_tokens - 48
    for bs in kv_sizes.block_sizes_for(16):
        pair = kv_pair(num_blocks=12, block_size=bs)
        n = tokens(3, bs, offset)
        pair.run([add("a", range(tokens(3, bs))), schedule("a"),
                  *finish_unless_running_cached(pair, "a"), add("b", range(n))])
        got = one_group(pair.apply(schedule("b")))
        _, num = got["hits"]
        assert num <= n - 1 and num % bs == 0, f"block size {bs}: hit {num} tokens of {n}"
        if pair.spec.profile != "generic":
            expected = {47: 32, 48: 32, 49: 48}[num_tokens]
            assert num == expected, f"{num_tokens}-token prompt: hit {num}, vLLM hits {expected}"


@pytest.mark.kv_generic
@pytest.mark.kv_capability("prefix_caching")
def test_partial_block_never_hits(kv_pair: PairFactory, kv_sizes: DeclaredSizes) -> None:
    """Only full blocks are cached: a prompt sharing 2 full blocks and a partial third hits 2
    (at the declared block size and a larger one)."""
    for bs in kv_sizes.block_sizes_for(4):
        pair = kv_pair(num_blocks=12, block_size=bs)
        prompt = list(range(tokens(2, bs, 3)))
        pair.run([add("a", prompt), schedule("a"), *finish_unless_running_cached(pair, "a"),
                  add("b", prompt + [5, 5, 5])])
        _, num = one_group(pair.apply(schedule("b")))["hits"]
        assert num == tokens(2, bs), (
            f"a cached 2 full blocks ({tokens(2, bs)} tokens) and a partial one; b hit {num} "
            "tokens")


@pytest.mark.kv_generic
@pytest.mark.kv_capability("prefix_caching")
def test_shared_prefix_is_shared(kv_pair: PairFactory) -> None:
    """A second request with the same prefix reuses the same physical blocks (without
    caches_running_requests: both reuse those a finished request cached)."""
    pair = kv_pair(num_blocks=12, block_size=4)
    bs = pair.spec.block_size
    prompt = list(range(tokens(3, bs, 2)))
    pair.run([*cached_at_finish(pair, "w", prompt), add("a", prompt), schedule("a"),
              add("b", prompt[:tokens(3, bs)] + [9])])
    free_before = pair.impl.manager.num_free_blocks()
    got = one_group(pair.apply(schedule("b")))
    tables = one_group_tables(pair.impl.tables())
    assert tables["b"][:3] == tables["a"][:3], f"b should share a's first 3 blocks: {tables}"
    assert got["hits"] == (tables["a"][:3], tokens(3, bs))
    assert pair.impl.manager.num_free_blocks() == free_before - 1


@pytest.mark.kv_generic
@pytest.mark.kv_capability("prefix_caching")
def test_hits_hold_the_requested_prefix(kv_pair: PairFactory) -> None:
    """A hit is a block holding the request's whole prefix through that block, whatever the
    hashing scheme (the hit-correctness law judges every hit of every test; these cases aim
    at it): the same tokens at another position, the same tokens after another prefix, and
    a cached block handed out again to other tokens never hit."""
    pair = kv_pair(num_blocks=12, block_size=4)
    bs = pair.spec.block_size
    block = list(range(1, bs + 1))  # [1, 2, 3, 4] at 4
    # The same block of tokens twice in one sequence: only the first block holds them at
    # index 0.
    pair.run([add("rep", block + block + [9]), schedule("rep")])
    rep = pair.impl.tables()["rep"][0]
    pair.run([*finish_unless_running_cached(pair, "rep"), add("a", block + [5])])
    got = one_group(pair.apply(schedule("a")))
    assert got["hits"] == (rep[:1], bs), (
        f"a must hit rep's first block only, got {got['hits']}\n" + pair.impl.snippet())
    # The same tokens after another prefix (written last): still only rep's first block.
    pair.run([add("shift", [5] * bs + block + [9]), schedule("shift"),
              *finish_unless_running_cached(pair, "shift"), add("b", block + [7])])
    got = one_group(pair.apply(schedule("b")))
    assert got["hits"] == (rep[:1], bs), (
        f"b must hit rep's first block only, got {got['hits']}\n" + pair.impl.snippet())

    # Cached blocks handed out again (evicted) hold other tokens: no hit on them.
    pair = kv_pair(num_blocks=8, block_size=4)
    every_block = tokens(pair.impl.initial_free, bs)
    pair.run([add("old", range(1, 1 + tokens(2, bs))), schedule("old"), free("old"),
              add("fill", range(100, 100 + every_block)), schedule("fill"),
              add("new", range(1, 1 + tokens(2, bs, 1)))])
    got = one_group(pair.apply(schedule("new")))
    assert got["hits"] == ([], 0), (
        f"old's blocks were all handed out to fill: new must not hit them, got {got['hits']}"
        "\n" + pair.impl.snippet())
    pair.run([free("fill"), schedule("new")])


def test_own_hits_not_evicted_by_own_allocation(kv_pair: PairFactory) -> None:
    """test_computed_blocks_not_evicted: hits are touched before new blocks are popped, so a
    request never evicts its own prefix (vllm#37076 class of bug)."""
    pair = kv_pair(num_blocks=3, block_size=16)
    pair.run([add("0", range(16)), schedule("0"), add("1", range(16, 32)), schedule("1"),
              free("0"), free("1"), add("2", range(32))])
    got = one_group(pair.apply(schedule("2")))
    assert got["hits"] == ([1], 16) and got["new"] == [2], (
        f"expected hit [1] and new [2], got {got}\n" + pair.impl.snippet())


@pytest.mark.kv_generic
@pytest.mark.kv_capability("prefix_caching", "skip_reading_prefix_cache")
def test_skip_reading_prefix_cache_still_writes(kv_pair: PairFactory) -> None:
    """A prompt-logprobs request gets no hit but caches its blocks (duplicates under the same
    keys); later lookups still find blocks."""
    pair = kv_pair(num_blocks=16, block_size=4)
    bs = pair.spec.block_size
    prompt = range(tokens(3, bs))
    pair.run([*cached_at_finish(pair, "w", list(prompt)), add("a", prompt), schedule("a"),
              add("p", prompt, skip_read=True)])
    got = one_group(pair.apply(schedule("p")))
    assert got["hits"] == ([], 0), f"skip_reading_prefix_cache must not hit, got {got['hits']}"
    pair.run([free("a"), free("p"), add("c", range(tokens(3, bs, 1)))])
    assert one_group(pair.apply(schedule("c")))["hits"][1] == tokens(3, bs)


@pytest.mark.kv_generic
@pytest.mark.kv_capability("caching_off")
def test_caching_disabled_never_hits(kv_pair: PairFactory) -> None:
    pair = kv_pair(num_blocks=12, block_size=4, enable_caching=False)
    prompt = range(tokens(3, pair.spec.block_size))
    pair.run([add("a", prompt), schedule("a"), *finish_unless_running_cached(pair, "a"),
              add("b", prompt)])
    assert one_group(pair.apply(schedule("b")))["hits"] == ([], 0)


@pytest.mark.kv_generic
@pytest.mark.kv_capability("prefix_caching", "reset_prefix_cache")
def test_reset_prefix_cache(kv_pair: PairFactory) -> None:
    """reset fails while any block is in use (cache intact); once all is free it succeeds and
    nothing hits afterwards."""
    pair = kv_pair(num_blocks=12, block_size=4)
    bs = pair.spec.block_size
    prompt = list(range(tokens(3, bs)))
    pair.run([*cached_at_finish(pair, "w", prompt), add("a", prompt), schedule("a")])
    assert pair.apply(reset()) == {"reset": False}
    pair.run([add("b", range(tokens(3, bs, 1)))])
    assert one_group(pair.apply(schedule("b")))["hits"][1] == tokens(3, bs), (
        "a failed reset must keep the cache")
    pair.run([free("a"), free("b")])
    assert pair.apply(reset()) == {"reset": True}
    pair.run([add("c", range(tokens(3, bs, 1)))])
    assert one_group(pair.apply(schedule("c")))["hits"] == ([], 0), "nothing may hit after a reset"


def test_duplicates_first_inserted_wins(kv_pair: PairFactory) -> None:
    """A block-aligned prompt recomputes and re-caches its last block; lookups keep returning
    the first block cached under that key."""
    pair = kv_pair(num_blocks=16, block_size=4)
    pair.run([add("a", range(8)), schedule("a"), add("b", range(8)), schedule("b"),
              add("c", range(9))])
    got = one_group(pair.apply(schedule("c")))
    a = pair.impl.tables()["a"][0]
    assert got["hits"] == (a[:2], 8), f"c must hit a's blocks {a[:2]}, got {got['hits']}"


@pytest.mark.kv_generic
@pytest.mark.kv_capability("prefix_caching")
def test_decode_blocks_become_hits(kv_pair: PairFactory) -> None:
    """A block filled during decode is cached and hits for a request with the same tokens
    (while the request runs; without caches_running_requests once it finished)."""
    pair = kv_pair(num_blocks=16, block_size=4)
    bs = pair.spec.block_size
    # The second block lacks 2 tokens: 2 decodes fill it, the third starts block 3.
    pair.run([add("a", range(tokens(2, bs, -2))), schedule("a"), decode("a"), decode("a"),
              decode("a")])
    written = pair.impl.views["a"].token_ids
    pair.run([*finish_unless_running_cached(pair, "a"), add("b", written + (1,))])
    got = one_group(pair.apply(schedule("b")))
    assert got["hits"][1] == tokens(2, bs), (
        f"a's 2 full blocks (one filled by decode) should hit: {got}")


@pytest.mark.kv_generic
@pytest.mark.kv_capability("prefix_caching")
def test_preempted_request_readmitted_from_cache(kv_pair: PairFactory) -> None:
    """A request freed mid-decode (preemption) hits its own cached blocks when re-admitted."""
    pair = kv_pair(num_blocks=16, block_size=4)
    bs = pair.spec.block_size
    # 3 decodes complete the third block.
    pair.run(one_token_decodes([add("a", range(tokens(3, bs, -2))), schedule("a"),
                                decode("a", 3), free("a")],
                               "multi_token_decode" in pair.impl.capabilities))
    got = one_group(pair.apply(schedule("a")))
    assert got["hits"][1] == tokens(3, bs), (
        f"re-admitted request should hit {tokens(3, bs)} tokens, got {got}")
