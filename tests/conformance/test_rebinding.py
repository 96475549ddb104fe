"""Rebinding a table entry to an identical block (``dedup_on_insert``,
kvcheck.conformance.rebinding) and the shared-write law (kvcheck.conformance.shared_writes).

The designs are small fakes in the harness's style (``harness_fakes.FakeManager``, a prefix
cache where the first writer of a key wins, so a prompt computed twice leaves a duplicate
block outside the cache), driven through a real ``Pair`` and its guard: a lawful design that
deduplicates (after ``allocate_slots`` completed a full block equal to a cached one, it swaps
the entry for the cached block at the request's next call and frees its copy), and one
variant per way of getting a rebinding wrong, each refused with its reason."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from harness_fakes import ALL_CAPS, FakeManager, handle

from kvcheck.conformance.differential import ConformanceMismatch, Pair
from kvcheck.conformance.ops import Op, add, decode, free, schedule
from kvcheck.conformance.pinning import PinLedger
from kvcheck.conformance.protocol import KVCacheSpec, RequestView
from kvcheck.conformance.rebinding import Rebindings
from kvcheck.conformance.shared_writes import WriteLog, check_shared_writes
from kvcheck.conformance.written import WrittenBlocks

SPEC = KVCacheSpec(num_blocks=16, block_size=4, profile="generic")
DEDUP = ALL_CAPS | {"dedup_on_insert"}
PROMPT = list(range(1, 9))  # two full blocks of 4
#: a computes PROMPT into blocks 0, 1; b (the same prompt) hits block 0 and computes its copy
#: of block 1 into block 2; b's decode is its next call, after that forward pass.
DUPLICATE = [add("a", PROMPT), schedule("a"), add("b", PROMPT), schedule("b")]


class Dedup(FakeManager):
    """Lawful: at the start of a running request's ``allocate_slots`` (every block it computed
    before this call has been through a forward pass) each of its full blocks whose prefix is
    cached in another block is swapped for that block, and its copy released."""

    def allocate_slots(self, request: RequestView, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_block_ids: Sequence[int] = (),
                       num_lookahead_tokens: int = 0) -> list[int] | None:
        self._dedup(request, self._rebindable(request))
        return super().allocate_slots(request, num_new_tokens, num_new_computed_tokens,
                                      new_computed_block_ids, num_lookahead_tokens)

    def _rebindable(self, request: RequestView) -> int:
        """How many leading blocks may be rebound: the full blocks already computed."""
        return request.num_computed_tokens // self.bs

    def _cached(self, request: RequestView, index: int) -> int | None:
        return self.cache.get(self._key(request, index))

    def _dedup(self, request: RequestView, num_blocks: int) -> None:
        table = self.tables.get(request.request_id)
        for index in range(min(num_blocks, len(table or ()))):
            assert table is not None
            cached = self._cached(request, index)
            if cached is not None and cached != table[index]:
                self._take_hit(cached)
                self._drop_copy(table[index])
                table[index] = cached

    def _drop_copy(self, block_id: int) -> None:
        self._release([block_id])


class DedupLifo(Dedup):
    """Lawful: new blocks come from the tail of the free queue, so the copy a call releases is
    the block the same call hands out next."""

    def _pop_free(self) -> int:
        block_id = self.free_queue.pop()
        self._evict(block_id)
        return block_id


class DedupEveryone(DedupLifo):
    """Lawful: every call first deduplicates the other running requests (their last calls'
    forward passes have run), so another request's released copy is handed out by this
    call."""

    def __init__(self, spec: KVCacheSpec) -> None:
        super().__init__(spec)
        self.computed: dict[str, tuple[RequestView, int]] = {}  # rid -> (view, tokens)

    def allocate_slots(self, request: RequestView, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_block_ids: Sequence[int] = (),
                       num_lookahead_tokens: int = 0) -> list[int] | None:
        for rid, (view, tokens) in self.computed.items():
            if rid != request.request_id:
                self._dedup(view, tokens // self.bs)
        new = super().allocate_slots(request, num_new_tokens, num_new_computed_tokens,
                                     new_computed_block_ids, num_lookahead_tokens)
        if new is not None:
            self.computed[request.request_id] = (request, request.num_computed_tokens
                                                 + num_new_computed_tokens + num_new_tokens)
        return new

    def free(self, request_id: str) -> None:
        self.computed.pop(request_id, None)
        super().free(request_id)


class DedupTooEarly(Dedup):
    """Bug: deduplicates at the end of the call, blocks whose tokens it just scheduled."""

    def allocate_slots(self, request: RequestView, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_block_ids: Sequence[int] = (),
                       num_lookahead_tokens: int = 0) -> list[int] | None:
        new = FakeManager.allocate_slots(self, request, num_new_tokens, num_new_computed_tokens,
                                         new_computed_block_ids, num_lookahead_tokens)
        end = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        self._dedup(request, end // self.bs)
        return new


class DedupPartial(Dedup):
    """Bug: also deduplicates the partial last block, keyed by the view's tokens (some not
    computed yet)."""

    def _rebindable(self, request: RequestView) -> int:
        return -(-request.num_computed_tokens // self.bs)


class DedupByOwnTokens(Dedup):
    """Bug: matches a block by its own tokens, whatever comes before them."""

    def _cached(self, request: RequestView, index: int) -> int | None:
        tokens = request.token_ids[index * self.bs:(index + 1) * self.bs]
        for key, block_id in self.cache.items():
            if key[2][-self.bs:] == tokens:
                return block_id
        return None


class DedupKeepsCopy(Dedup):
    """Bug: swaps the entry but never releases its copy."""

    def _drop_copy(self, block_id: int) -> None:
        pass


def _pair(cls: type[FakeManager], caps: frozenset[str] = DEDUP) -> Pair:
    return Pair(handle(cls, caps=caps), None, SPEC)


def _failure(cls: type[FakeManager], ops: list[Op], caps: frozenset[str] = DEDUP) -> str:
    pair = _pair(cls, caps)
    with pytest.raises(ConformanceMismatch) as info:
        pair.run(ops)
    return str(info.value).partition("\n")[0]


# ---------------------------------------------------------------------- valid rebindings
def test_valid_rebinding_is_followed_as_a_release_and_a_share() -> None:
    """b's copy of block 1 is rebound to a's block 1 at b's next call and freed: the guard
    accepts it, every law holds after every op, and the pool counts it free again."""
    pair = _pair(Dedup)
    pair.run(DUPLICATE)
    assert pair.impl.tables() == {"a": [[0, 1]], "b": [[0, 2]]}
    free_before = pair.impl.manager.num_free_blocks()
    pair.apply(decode("b", 1))  # b's block 2 is computed: rebound to 1, a new block 3
    assert pair.impl.tables() == {"a": [[0, 1]], "b": [[0, 1, 3]]}
    assert pair.impl.manager.num_free_blocks() == free_before  # 2 freed, 3 taken
    assert 2 in pair.impl.manager.free_block_ids()
    assert pair.impl.manager.ref_cnt(1) == 2 and pair.impl.manager.ref_cnt(2) == 0
    # Later requests see the rebound table consistently: frees, hits, decodes.
    pair.run([decode("b", 4), free("a"), add("c", [*PROMPT, 9]), schedule("c"), free("b"),
              decode("c", 1), free("c")])
    assert pair.impl.manager.num_free_blocks() == SPEC.num_blocks


def test_released_copy_may_be_handed_out_by_the_same_call() -> None:
    """The copy released by the call's rebinding is the block it hands out next (LIFO free
    queue): not a block handed out while held."""
    pair = _pair(DedupLifo)
    pair.run(DUPLICATE)
    [a], [(_, copy)] = pair.impl.tables()["a"], pair.impl.tables()["b"]
    assert pair.apply(decode("b", 1))["new"] == [[copy]]
    assert pair.impl.tables()["b"] == [[*a, copy]]


def test_another_requests_released_copy_may_be_handed_out() -> None:
    """a's decode rebinds b's entry (b's table not read since) and hands b's copy to a: the
    guard reads b's table before calling it a block handed out while held."""
    pair = _pair(DedupEveryone)
    pair.run(DUPLICATE)
    [a], [(_, copy)] = pair.impl.tables()["a"], pair.impl.tables()["b"]
    assert pair.apply(decode("a", 1))["new"] == [[copy]]
    assert pair.impl.tables() == {"a": [[*a, copy]], "b": [a]}


# ---------------------------------------------------------------------- refused rebindings
def test_rebinding_without_the_capability_names_it() -> None:
    text = _failure(Dedup, [*DUPLICATE, decode("b", 1)], caps=ALL_CAPS)
    assert ("protocol violation: fake.get_block_ids('b') returned [0, 1, 3]: the block table "
            "must be [0, 2, 3] (the previous table + the hits passed to allocate_slots + the "
            "new ids it returned; [] after free or for an unknown request); index 1 changed "
            "from block 2 to block 1, which holds the same content (tokens [5, 6, 7, 8] "
            "written by request 'a' as its block 1): declare dedup_on_insert if your cache "
            "swaps identical blocks") in text, text


def test_rebinding_before_the_forward_pass_is_refused() -> None:
    text = _failure(DedupTooEarly, DUPLICATE)
    assert ("fake.get_block_ids('b') returned [0, 1]: the block table must be [0, 2]" in text
            and "; not a valid rebinding (dedup_on_insert): index 1 changed from block 2 to "
            "block 1: its tokens are not computed yet: positions 4..7 are computed by the "
            "allocate_slots('b', ...) just made (from position 4 on), whose forward pass has "
            "not run; rebind a block only after the call that scheduled its tokens") in text, text


def test_rebinding_a_partial_block_is_refused() -> None:
    """b computes 2 tokens of its block 1, then 1 more: the swap of that block (keyed by
    tokens not computed yet) is refused as partial."""
    text = _failure(DedupPartial, [add("a", PROMPT), schedule("a"), add("b", PROMPT),
                                   schedule("b", 2), schedule("b", 1)])
    assert ("not a valid rebinding (dedup_on_insert): index 1 changed from block 2 to block 1: "
            "a partial block: positions 4..7, but request 'b' has 7 tokens computed; only a "
            "full block whose tokens are all computed may be rebound") in text, text


def test_rebinding_to_other_content_is_refused() -> None:
    """b's first block holds the tokens of a's second block, at another position."""
    text = _failure(DedupByOwnTokens, [add("a", PROMPT), schedule("a"),
                                       add("b", [5, 6, 7, 8, 9]), schedule("b"),
                                       decode("b", 1)])
    assert ("not a valid rebinding (dedup_on_insert): index 0 changed from block 2 to block 1: "
            "the content differs: block 2 holds tokens [5, 6, 7, 8] written by request 'b' as "
            "its block 0; block 1 holds tokens [5, 6, 7, 8] at another position in the "
            "sequence written by request 'a' as its block 1") in text, text


def test_rebinding_that_keeps_its_copy_breaks_the_rebinding_law() -> None:
    text = _failure(DedupKeepsCopy, [*DUPLICATE, decode("b", 1)])
    assert ("rebinding: request 'b''s index 1 was rebound from block 2 to block 1 "
            "(dedup_on_insert), but block 2 was not released: no live request holds it and it "
            "is not in free_block_ids(); free the copy a rebinding replaces") in text, text
    assert "conservation: " in text and "a block was lost" in text, text


def test_rebinding_that_keeps_its_copy_without_a_free_queue_is_caught_by_counts() -> None:
    text = _failure(DedupKeepsCopy, [*DUPLICATE, decode("b", 1)],
                    caps=DEDUP - {"free_queue_order", "ref_counts"})
    assert ("block 2 was not released: no live request holds it and num_free_blocks() does not "
            "count it (conservation is short)") in text, text


def test_a_table_that_grows_is_no_rebinding() -> None:
    written = WrittenBlocks(4)
    judge = Rebindings(written, declared=True)
    assert judge.judge("a", [1, 2], [1, 2, 3], computed=8, fresh=None) == (False, (
        "; the table has 3 entries where 2 are due: a rebinding (dedup_on_insert) replaces "
        "entries, it never adds or removes any"))
    assert Rebindings(written, declared=False).judge("a", [1, 2], [1, 2, 3], computed=8,
                                                     fresh=None) == (False, "")
    assert judge.take() == []


def test_multi_group_specs_keep_their_table_rule() -> None:
    from kvcheck.conformance.rebinding import watch_rebindings

    assert watch_rebindings(object(), WrittenBlocks(4), declared=True) is None


# ---------------------------------------------------------------------- shared writes
def test_shared_write_names_block_requests_and_positions() -> None:
    log = WriteLog()
    log.admitted("b", [7])
    log.wrote("a", [5, 7, 9], 5, 12, 4)
    problems = check_shared_writes(log, {5: 1, 7: 2, 9: 1}, lambda: {"a": [[5, 7, 9]],
                                                                     "b": [[7, 8]]}, None)
    assert problems == [
        ("shared write: the forward pass of allocate_slots('a') writes its positions 5..7 into "
         "block 7 (its block 1), but request 'b' also holds it (its block 0, a cache hit it got "
         "from get_computed_blocks); a block another live request holds is read-only: a "
         "request's new tokens go into blocks only it holds (a new block, or a copy)")]
    assert log.take() == []  # judged once


def test_shared_write_per_group_leaves_the_null_block_out() -> None:
    """Group 1's null block sits at a written position and b holds it too: no write; group
    0's block 4 is also b's: a shared write, named by group."""
    log = WriteLog()
    log.wrote("a", [4, 6], 0, 6, 4, group=0, null=0)
    log.wrote("a", [0, 5], 0, 6, 4, group=1, null=0)
    tables: dict[str, Any] = {"a": [[4, 6], [0, 5]], "b": [[4], [0]]}
    problems = check_shared_writes(log, {4: 2, 5: 1, 6: 1}, lambda: tables, None, grouped=True)
    assert problems == [
        ("shared write: the forward pass of allocate_slots('a') writes its positions 0..3 into "
         "block 4 (its group 0 block 0), but request 'b' also holds it (its group 0 block 0); a "
         "block another live request holds is read-only: a request's new tokens go into blocks "
         "only it holds (a new block, or a copy)")]


def test_shared_write_into_a_pinned_block() -> None:
    pins = PinLedger()
    pins.pin("c", [3])
    log = WriteLog()
    log.wrote("a", [3], 0, 2, 4)
    problems = check_shared_writes(log, {3: 1}, lambda: {"a": [[3]]}, pins)
    assert problems == [
        ("shared write: the forward pass of allocate_slots('a') writes its positions 0..1 into "
         "block 3 (its block 0), but the outstanding lookup of request(s) ['c'] pinned it "
         "(pinning_lookup: a pinned hit is held by the request that looked it up); a block "
         "another live request holds is read-only: a request's new tokens go into blocks only "
         "it holds (a new block, or a copy)")]


def test_no_shared_write_when_only_the_writer_holds_its_blocks() -> None:
    log = WriteLog()
    log.wrote("a", [3, 4], 2, 6, 4)
    log.wrote("b", [5], 0, 0, 4)  # nothing computed: nothing written
    assert check_shared_writes(log, {3: 1, 4: 1, 5: 2}, dict, None) == []
