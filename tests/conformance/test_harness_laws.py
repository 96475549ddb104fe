"""The profile-independent laws (``kvcheck.conformance.laws``) on small fakes: the correct fake
breaks none of them over a workload that uses every op; each fake with one bug breaks exactly
the law meant to catch it, after the op that shows the bug, with a message naming the rule and
its terms. The fakes run through a real ``Driver`` and the answer guard, so a bug the guard
would stop first cannot pass for a law's catch."""

from __future__ import annotations

from typing import Any

import pytest
from harness_fakes import (
    ALL_CAPS,
    SPEC,
    ContentOnlyKey,
    FakeManager,
    FloorBlocks,
    FreesSharedBlocks,
    HitCapInTokens,
    HitsWholePrompt,
    LeakOnFree,
    PartialThenNone,
    RefCountIgnoresHits,
    StaleCache,
    handle,
)

from kvcheck.conformance.driver import Driver
from kvcheck.conformance.guard import ProtocolViolation
from kvcheck.conformance.laws import check_laws
from kvcheck.conformance.ops import add, decode, free, reset, schedule

Op = dict[str, Any]


def first_broken(cls: type[FakeManager], ops: list[Op],
                 caps: frozenset[str] = ALL_CAPS) -> tuple[int, list[str]]:
    """Drive ``cls`` through ``ops`` checking the laws after each; the 1-based number of the
    first op after which a law broke and the problems (0 and [] if none)."""
    driver = Driver(handle(cls, caps=caps), SPEC)
    for number, op in enumerate(ops, 1):
        driver.apply(op)
        problems = check_laws(driver)
        if problems:
            return number, problems
    return 0, []


PROMPT = list(range(1, 10))  # 9 tokens: blocks [1..4], [5..8] and a partial [9]


def test_correct_fake_keeps_every_law_over_every_op() -> None:
    driver = Driver(handle(FakeManager), SPEC)
    ops = [add("a", PROMPT), schedule("a", 6), schedule("a"), decode("a", 2),
           add("b", PROMPT), schedule("b"), free("a"), add("c", range(100, 120)),
           schedule("c"), free("b"), free("c"), reset(), add("a", PROMPT), schedule("a")]
    answers = []
    for number, op in enumerate(ops, 1):
        answers.append(driver.apply(op))
        assert check_laws(driver) == [], f"after op #{number} {op}"
    # The workload did what it is meant to exercise: a shared hit, eviction, a reset.
    assert answers[5] == {"hits": ([[0, 1]], 8), "new": [[3]]}
    assert answers[8] == {"hits": ([[]], 0), "new": [[4, 5, 6, 7, 2]]}
    assert answers[11] == {"reset": True}
    # Nothing cached after the reset; the free queue is b's blocks then c's, last first.
    assert answers[13] == {"hits": ([[]], 0), "new": [[3, 1, 0]]}


def test_leaked_block_breaks_conservation() -> None:
    number, problems = first_broken(LeakOnFree, [add("a", PROMPT), schedule("a"), free("a")])
    assert number == 3
    assert problems == [
        ("conservation: num_free_blocks() (7) + distinct blocks held by live requests (0) = 7 "
        "!= 8, the num_free_blocks() of the fresh pool (a block was lost)")]


def test_missing_block_for_computed_tokens_breaks_ownership() -> None:
    number, problems = first_broken(FloorBlocks, [add("a", PROMPT), schedule("a")])
    assert number == 2
    assert problems == ["request 'a' has 9 computed tokens but only 2 blocks of 4"]


def test_freeing_a_shared_block_makes_it_free_and_held() -> None:
    """b hits a's blocks 0 and 1; freeing b puts them in the free queue while a holds them."""
    number, problems = first_broken(FreesSharedBlocks, [
        add("a", PROMPT), schedule("a"), add("b", PROMPT), schedule("b"), free("b")])
    assert number == 5
    assert problems == [
        ("conservation: num_free_blocks() (7) + distinct blocks held by live requests (3) = 10 "
        "!= 8, the num_free_blocks() of the fresh pool (a block was counted twice)"),
        "blocks [0, 1] are both free and held by a request"]


def test_block_handed_to_two_requests_is_stopped_by_the_guard() -> None:
    """The same bug, laws not checked: the next allocation hands block 1 (still a's) to c;
    the answer guard rejects it before any law could see two owners."""
    driver = Driver(handle(FreesSharedBlocks), SPEC)
    driver.run([add("a", PROMPT), schedule("a"), add("b", PROMPT), schedule("b"), free("b"),
                add("c", range(100, 124))])
    with pytest.raises(ProtocolViolation) as info:
        driver.apply(schedule("c"))
    assert str(info.value) == (
        "fake.allocate_slots(RequestView('c', 24 tokens, num_computed_tokens=0), 24, 0, []) "
        "returned [4, 5, 6, 7, 3, 1]: block 1 is handed out anew but request(s) ['a'] still "
        "hold it (only cache hits passed back may be shared)")


def test_hit_not_counted_breaks_ref_counts() -> None:
    number, problems = first_broken(RefCountIgnoresHits, [
        add("a", PROMPT), schedule("a"), add("b", PROMPT), schedule("b")])
    assert number == 4
    assert problems == ["block 0: ref_cnt 1 but 2 request(s) hold it",
                        "block 1: ref_cnt 1 but 2 request(s) hold it"]


def test_partial_allocation_before_none_breaks_all_or_nothing() -> None:
    """allocate_slots takes the last 3 free blocks for b, then answers None: the blocks are
    neither free nor held (conservation) and their counts say someone holds them."""
    number, problems = first_broken(PartialThenNone, [
        add("a", range(1, 21)), schedule("a"), add("b", range(100, 116)), schedule("b")])
    assert number == 4
    assert problems == [
        ("conservation: num_free_blocks() (0) + distinct blocks held by live requests (5) = 5 "
        "!= 8, the num_free_blocks() of the fresh pool (a block was lost)"),
        "block 5: ref_cnt 1 but 0 request(s) hold it",
        "block 6: ref_cnt 1 but 0 request(s) hold it",
        "block 7: ref_cnt 1 but 0 request(s) hold it"]


def test_partial_allocation_without_ref_counts_is_still_caught() -> None:
    _, problems = first_broken(PartialThenNone, [
        add("a", range(1, 21)), schedule("a"), add("b", range(100, 116)), schedule("b")],
        caps=ALL_CAPS - {"ref_counts"})
    assert len(problems) == 1 and problems[0].startswith("conservation: ")


def test_partial_allocation_for_a_running_request_is_stopped_by_the_guard() -> None:
    """b's decode needs 2 more blocks, 1 is free: the fake puts it in b's table and answers
    None; the table no longer matches the answers, which the guard says when it is read."""
    driver = Driver(handle(PartialThenNone), SPEC)
    driver.run([add("a", range(1, 21)), schedule("a"), add("b", range(100, 108)),
                schedule("b")])
    assert driver.apply(decode("b", 5)) == {"new": None}
    with pytest.raises(ProtocolViolation) as info:
        check_laws(driver)
    assert str(info.value).startswith(
        "fake.get_block_ids('b') returned [5, 6, 7]: the block table must be [5, 6] (the "
        "previous table + the hits passed to allocate_slots + the new ids it returned")


def test_hit_of_every_token_breaks_the_hit_cap() -> None:
    number, problems = first_broken(HitsWholePrompt, [
        add("a", range(1, 9)), schedule("a"), add("b", range(1, 9)), schedule("b")])
    assert number == 4
    assert problems == [
        ("hit cap: get_computed_blocks('b') hit 8 tokens of a 8-token request; at most "
        "num_tokens - 1 = 7 (the last token is always recomputed)")]


def test_hit_ending_mid_block_breaks_the_hit_cap() -> None:
    """The forward pass then recomputes b's last token into a's block: a shared write too."""
    number, problems = first_broken(HitCapInTokens, [
        add("a", range(1, 9)), schedule("a"), add("b", range(1, 9)), schedule("b")])
    assert number == 4
    assert problems == [
        ("hit cap: get_computed_blocks('b') returned 2 blocks of 4 tokens but "
        "num_computed_tokens 7 (whole blocks only)"),
        ("shared write: the forward pass of allocate_slots('b') writes its position 7 into "
         "block 1 (its block 1), but request 'a' also holds it (its block 1); a block another "
         "live request holds is read-only: a request's new tokens go into blocks only it holds "
         "(a new block, or a copy)")]


def test_content_only_key_breaks_hit_correctness() -> None:
    """b's first block has the tokens of a's second block: a content-only key hits it."""
    number, problems = first_broken(ContentOnlyKey, [
        add("a", PROMPT), schedule("a"), add("b", [5, 6, 7, 8, 1, 2, 3, 4, 0]), schedule("b")])
    assert number == 4
    assert problems == [
        ("hit correctness: get_computed_blocks('b') returned block 1 at index 0 (positions "
        "0..3): it holds tokens [5, 6, 7, 8] at another position in the sequence written by "
        "request 'a' as its block 1; request 'b' needs tokens [5, 6, 7, 8]")]


def test_stale_cache_entry_after_reuse_breaks_hit_correctness() -> None:
    """a's block 1 is freed, handed to c (its block 6), and still found for a's prefix."""
    number, problems = first_broken(StaleCache, [
        add("a", PROMPT), schedule("a"), free("a"), add("c", range(100, 128)), schedule("c"),
        add("d", PROMPT), schedule("d")])
    assert number == 7
    assert problems == [
        ("hit correctness: get_computed_blocks('d') returned block 1 at index 1 (positions "
        "4..7): it holds tokens [124, 125, 126, 127] at another position in the sequence "
        "written by request 'c' as its block 6; request 'd' needs tokens [5, 6, 7, 8]")]


def test_same_workload_on_the_correct_fake_has_no_stale_hit() -> None:
    """The StaleCache workload is lawful on the correct fake: d hits only block 0."""
    driver = Driver(handle(FakeManager), SPEC)
    driver.run([add("a", PROMPT), schedule("a"), free("a"), add("c", range(100, 128)),
                schedule("c"), add("d", PROMPT)])
    assert driver.apply(schedule("d")) == {"hits": ([[0]], 4), "new": None}
    assert check_laws(driver) == []


class FailsOwnInvariants(FakeManager):
    def check_invariants(self) -> None:
        raise AssertionError("free list corrupt")


def test_own_invariants_are_reported_when_declared() -> None:
    assert first_broken(FailsOwnInvariants, [add("a", PROMPT)],
                        caps=ALL_CAPS | {"invariants"}) == (
        1, ["the implementation's own check_invariants(): free list corrupt"])
    assert first_broken(FailsOwnInvariants, [add("a", PROMPT)]) == (0, [])


class NullBlock(FakeManager):
    """A lawful design reserving block 0 (vLLM's null block): never free, never handed out."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.free_queue.remove(0)


def test_conservation_counts_from_the_fresh_pool_not_num_blocks() -> None:
    driver = Driver(handle(NullBlock, reserved=(0,)), SPEC)
    assert driver.initial_free == 7 and driver.ordinary_block_ids == (1, 2, 3, 4, 5, 6, 7)
    for op in [add("a", PROMPT), schedule("a"), add("b", PROMPT), schedule("b"), free("a")]:
        driver.apply(op)
        assert check_laws(driver) == []
    assert driver.tables() == {"b": [[1, 2, 4]]}
