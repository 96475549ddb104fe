"""Profile-independent laws checked on an implementation after every op, with or without
an oracle (they are all that ``--kv-profile=generic`` checks besides its scripted tests).

* conservation: ``num_free_blocks()`` + distinct blocks held by live requests equals the
  ``num_free_blocks()`` of the fresh pool;
* ownership: a request holds enough blocks for its computed tokens, none twice, none of the
  reserved ids (``reserved_block_ids``: vLLM's null block 0; none under ``generic`` unless
  declared); free and held blocks are disjoint (``free_queue_order``); ``ref_cnt`` equals the
  number of holders for every other id (``ref_counts``; with ``ImplInfo.ref_cnt_counts_cache``
  one more where the cache may hold the block: ``kvcheck.conformance.cache_refs``);
* pins (``pinning_lookup``, ``kvcheck.conformance.pinning``): a block pinned by a lookup not
  yet followed by ``allocate_slots`` or ``release_computed`` counts as held by the request
  that looked it up (conservation, the free queue, ``ref_cnt``);
* no shared write (``kvcheck.conformance.shared_writes``): the blocks an ``allocate_slots``
  makes the forward pass write (its new tokens' positions) are held by no other live request
  and pinned by no other lookup;
* rebinding (``dedup_on_insert``, ``kvcheck.conformance.rebinding``): a table entry the guard
  accepted as rebound to an identical block released its old block (held by another request,
  or free);
* hit caps: ``get_computed_blocks`` returns whole blocks, at most ``num_tokens - 1`` tokens;
* hit correctness: every block ``get_computed_blocks`` returns at index ``i`` holds exactly the
  request's tokens ``[0, (i + 1) * block_size)`` under the same LoRA / salt / multimodal
  context. ``WrittenBlocks`` is the shadow record of what the suite's scheduler wrote into
  each block, so the law holds whatever the hashing scheme (stale hits after reuse,
  content-only hashes and broken chains all fail it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from kvcheck.conformance.cache_refs import ref_count_problems
from kvcheck.conformance.pinning import ledger_of
from kvcheck.conformance.protocol import RequestView
from kvcheck.conformance.rebinding import check_rebindings
from kvcheck.conformance.shared_writes import check_shared_writes

if TYPE_CHECKING:
    from kvcheck.conformance.driver import Driver

__all__ = ["WrittenBlocks", "check_hits", "check_laws", "check_pool"]

# WrittenBlocks' interned keys: a request's root context (LoRA, cache salt), and one full
# block (the parent prefix id, the block's tokens, its multimodal items as (id, offset)).
_RootKey = tuple[Literal["root"], tuple[str, int, str] | None, str | None]
_BlockKey = tuple[int, tuple[int, ...], tuple[tuple[str, int], ...]]
_Key = _RootKey | _BlockKey


def check_laws(driver: Driver) -> list[str]:
    """The broken laws (empty when all hold). Each message names its terms.

    Also drains the hit-correctness problems the driver recorded while running the last op
    (they are judged when ``get_computed_blocks`` answers, before the op writes anything).
    """
    problems: list[str] = driver.take_law_problems()
    spec = driver.spec
    reserved = driver.reserved
    tables = driver.tables()
    holders: Counter[int] = Counter()
    for rid, ids in tables.items():
        holders.update(ids)
        bad = [b for b in ids if not 0 <= b < spec.num_blocks]
        if bad:
            problems.append(f"request {rid!r} holds out-of-range block ids {bad}")
        if len(set(ids)) != len(ids):
            dup = sorted(b for b, n in Counter(ids).items() if n > 1)
            problems.append(f"request {rid!r} holds blocks {dup} more than once")
        held_reserved = [b for b in ids if b in reserved]
        if held_reserved:
            problems.append(f"reserved blocks: request {rid!r} holds {held_reserved}, which "
                            f"the design reserves (reserved_block_ids {list(reserved)})")
        need = -(-driver.views[rid].num_computed_tokens // spec.block_size)
        if len(ids) < need:
            problems.append(f"request {rid!r} has {driver.views[rid].num_computed_tokens} "
                            f"computed tokens but only {len(ids)} blocks of {spec.block_size}")
    # No write into a shared block, and rebindings that released their old block (the
    # modules say why).
    problems += check_shared_writes(driver.write_log, holders,
                                    lambda: {rid: [ids] for rid, ids in tables.items()},
                                    ledger_of(driver.manager))
    return problems + check_pool(driver, holders) + check_rebindings(driver, holders)


def check_pool(driver: Driver, holders: Counter[int], *,
               held: str = "blocks held by live requests", pool: str = "",
               null_block: int | None = None) -> list[str]:
    """The laws of the one block pool every request draws from, given ``holders`` (each live
    block id, with its number of holders): conservation, the free queue
    (``free_queue_order``), ``ref_cnt`` (``ref_counts``) and the implementation's own
    ``check_invariants()`` (``invariants``).

    A multi-group manager (``kvcheck.conformance.hybrid_laws``) words the conservation terms
    its way (``held``, and ``pool`` before the verdict) and passes its ``null_block``: never
    in the free queue, never counted by ``ref_cnt``.
    """
    problems: list[str] = []
    mgr, caps = driver.manager, driver.capabilities
    num_free = mgr.num_free_blocks()
    initial = driver.initial_free
    ledger = ledger_of(mgr)
    pins: Counter[int] = Counter() if ledger is None else ledger.holders()
    live = holders.keys() | pins.keys()  # pinned: held by the request that looked it up
    total = num_free + len(live)
    if total != initial:
        pinned = (f" or pinned by a lookup ({len(live)}, {len(live - holders.keys())} of them "
                  "pinned only)" if pins else f" ({len(holders)})")
        problems.append(
            f"conservation: num_free_blocks() ({num_free}) + distinct {held}{pinned} "
            f"= {total} != {initial}, the num_free_blocks() of the fresh pool "
            f"({pool}a block was {'lost' if total < initial else 'counted twice'})"
            + _pin_hint(driver, live, total < initial, bool(pins)))
    exempt = set() if null_block is None else {null_block}
    if "free_queue_order" in caps:
        queue = list(mgr.free_block_ids())
        if len(queue) != num_free:
            problems.append(f"free queue holds {len(queue)} blocks but num_free_blocks() "
                            f"is {num_free}")
        if null_block is not None and null_block in queue:
            problems.append(f"null block: the null block {null_block} is in the free queue "
                            f"at position {queue.index(null_block)}")
        queue_set = set(queue)
        held_and_free = sorted(queue_set.intersection(holders))
        if held_and_free:
            problems.append(f"blocks {held_and_free} are both free and held by a request")
        pinned_and_free = sorted(queue_set.intersection(pins) - holders.keys())
        if pinned_and_free and ledger is not None:
            problems.append(
                f"blocks {pinned_and_free} are both free and pinned by the lookup of request(s) "
                f"{sorted({r for b in pinned_and_free for r in ledger.pinners(b)})} "
                "(pinning_lookup: a pinned block is held until allocate_slots or "
                "release_computed, never free)")
        if len(queue_set) != len(queue):
            problems.append("the free queue lists a block twice")
        free_reserved = sorted(queue_set.intersection(driver.reserved) - exempt)
        if free_reserved:
            problems.append(f"reserved blocks {free_reserved} are in the free queue")
    if "ref_counts" in caps:
        problems += ref_count_problems(driver, holders, pins, exempt)
    if "invariants" in caps:
        try:
            mgr.check_invariants()
        except AssertionError as exc:
            problems.append(f"the implementation's own check_invariants(): {exc}")
    return problems


def _pin_hint(driver: Driver, live: set[int], lost: bool, pinned: bool) -> str:
    """What a conservation failure may owe to ``pinning_lookup``: for a lost block, the
    blocks whose pins ended and that nobody holds or pins now (free ones left out when the
    free queue shows them); for a block counted twice, that pinned blocks are not free."""
    ledger = ledger_of(driver.manager)
    if ledger is None:
        return ""
    if not lost:
        return ("; pinning_lookup: a block pinned by a lookup counts as held by the request "
                "that looked it up, so num_free_blocks() must not count it" if pinned else "")
    free_known = "free_queue_order" in driver.capabilities
    free = set(driver.manager.free_block_ids()) if free_known else set()
    return ledger.leak_hint(live | free, free_known=free_known)


def check_hits(written: WrittenBlocks, view: RequestView, hits: Sequence[int],
               num_hit: int) -> list[str]:
    """Hit caps and hit correctness of one ``get_computed_blocks(view) -> (hits, num_hit)``
    answer, judged against what was written into each block so far."""
    bs = written.block_size
    rid = view.request_id
    problems = []
    if num_hit != len(hits) * bs:
        problems.append(f"hit cap: get_computed_blocks({rid!r}) returned {len(hits)} blocks of "
                        f"{bs} tokens but num_computed_tokens {num_hit} (whole blocks only)")
    if num_hit > max(0, view.num_tokens - 1):
        problems.append(f"hit cap: get_computed_blocks({rid!r}) hit {num_hit} tokens of a "
                        f"{view.num_tokens}-token request; at most num_tokens - 1 = "
                        f"{view.num_tokens - 1} (the last token is always recomputed)")
    for index, block_id in enumerate(hits):
        problem = written.mismatch(block_id, view, index)
        if problem:
            problems.append(f"hit correctness: get_computed_blocks({rid!r}) returned block "
                            f"{block_id} at index {index} (positions {index * bs}.."
                            f"{(index + 1) * bs - 1}): {problem}")
            break  # later blocks of a wrong chain say nothing new
    return problems


class _Write:
    """What one block holds: written by ``rid`` as its block ``index``, ``filled`` tokens from
    the block start, and once full the id of the prefix it holds (``None`` until then)."""

    __slots__ = ("filled", "index", "prefix", "rid")

    def __init__(self, rid: str, index: int, filled: int, prefix: int | None) -> None:
        self.rid, self.index, self.filled, self.prefix = rid, index, filled, prefix


class WrittenBlocks:
    """The shadow record of what the scheduler wrote into each block.

    A *prefix id* names one (context, tokens ``[0, (i + 1) * block_size)``) identity: the root
    is the request's LoRA and cache salt; each full block adds its tokens and the multimodal
    items overlapping it (identifier and offset in the block, as vLLM keys them). Equal ids
    mean the KV computed for that block is the same, so ids are interned integers and the
    law is one comparison per hit block.
    """

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._ids: dict[_Key, int] = {}
        self._parts: list[_Key] = []  # prefix id -> its key (for messages)
        self._chains: dict[str, list[int]] = {}  # request id -> prefix ids of its blocks
        self._blocks: dict[int, _Write] = {}

    # ------------------------------------------------------------------ request identities
    def forget(self, rid: str) -> None:
        """A new request under ``rid`` (its tokens may differ from the old one's)."""
        self._chains.pop(rid, None)

    def _intern(self, key: _Key) -> int:
        found = self._ids.get(key)
        if found is None:
            found = self._ids[key] = len(self._parts)
            self._parts.append(key)
        return found

    def prefix_id(self, view: RequestView, index: int) -> int:
        """The prefix id of ``view``'s block ``index`` (its tokens must all be known)."""
        chain = self._chains.get(view.request_id)
        if chain is None:
            root: _RootKey = ("root", view.lora, view.cache_salt or None)
            chain = self._chains[view.request_id] = [self._intern(root)]
        bs = self.block_size
        tokens = view.token_ids
        while len(chain) <= index + 1:
            start = (len(chain) - 1) * bs
            end = start + bs
            mm = tuple((ident, offset - start) for ident, offset, length in view.mm_features
                       if offset < end and offset + length > start)
            chain.append(self._intern((chain[-1], tokens[start:end], mm)))
        return chain[index + 1]

    # ------------------------------------------------------------------ writes
    def clear(self, block_ids: Sequence[int]) -> None:
        """Blocks just handed out as new: whatever they held is being overwritten."""
        for block_id in block_ids:
            self._blocks.pop(block_id, None)

    def write(self, view: RequestView, table: Sequence[int], start: int, end: int) -> None:
        """``view`` computed its positions ``[start, end)`` into the blocks of ``table``."""
        bs = self.block_size
        rid = view.request_id
        for index in range(start // bs, min(len(table), -(-end // bs))):
            block_id = table[index]
            lo = max(start, index * bs) - index * bs
            hi = min(end, (index + 1) * bs) - index * bs
            old = self._blocks.get(block_id)
            if lo == 0:
                write = self._blocks[block_id] = _Write(rid, index, hi, None)
            elif (old is not None and old.rid == rid and old.index == index
                  and old.filled == lo and old.prefix is None):
                write = old
                write.filled = hi
            else:  # a write continuing someone else's (or nobody's) tokens: mixed content
                self._blocks[block_id] = _Write(rid, index, -1, None)
                continue
            if write.filled == bs:
                write.prefix = self.prefix_id(view, index)

    def full_blocks(self) -> list[int]:
        """The blocks that hold a full block of computed tokens (a cache may keep them)."""
        return [b for b, write in self._blocks.items() if write.prefix is not None]

    # ------------------------------------------------------------------ the law
    def mismatch(self, block_id: int, view: RequestView, index: int) -> str | None:
        """Why ``block_id`` does not hold ``view``'s prefix through block ``index`` (None if
        it does)."""
        need = self.prefix_id(view, index)
        write = self._blocks.get(block_id)
        if write is not None and write.prefix == need:
            return None
        bs = self.block_size
        wanted = list(view.token_ids[index * bs:(index + 1) * bs])
        held = self.holds(block_id, need)
        return f"it holds {held}; request {view.request_id!r} needs tokens {wanted}{_ctx(view)}"

    def holds(self, block_id: int, need: int | None = None) -> str:
        """What ``block_id`` holds, in words (its prefix described relative to the prefix id
        ``need`` when given)."""
        write = self._blocks.get(block_id)
        if write is None:
            return "nothing computed since it was last handed out as a new block"
        if write.filled < 0:
            return (f"a mix of tokens from more than one write (last by request "
                    f"{write.rid!r} as its block {write.index})")
        if write.prefix is None:
            return (f"only {write.filled} of {self.block_size} tokens (request {write.rid!r}'s "
                    f"block {write.index}, not full)")
        what = self._describe(write.prefix, write.prefix if need is None else need)
        return f"{what} written by request {write.rid!r} as its block {write.index}"

    def held_prefix(self, block_id: int) -> int | None:
        """The prefix id ``block_id`` holds (None: nothing, a partial block or mixed writes)."""
        write = self._blocks.get(block_id)
        return None if write is None else write.prefix

    def chain_prefix(self, request_id: str, index: int) -> int | None:
        """The prefix id of request ``request_id``'s block ``index`` if the record knows it
        (it does for every full block the request wrote or hit)."""
        chain = self._chains.get(request_id)
        return chain[index + 1] if chain is not None and index + 1 < len(chain) else None

    def _describe(self, held: int, need: int) -> str:
        """What prefix ``held`` is, relative to the one needed."""
        (held_root, held_blocks), (need_root, need_blocks) = self._unroll(held), self._unroll(need)
        tokens = list(held_blocks[-1][1])
        if held_root != need_root:
            _, lora, salt = held_root
            return f"tokens {tokens} under another context (lora={lora!r}, cache_salt={salt!r})"
        if len(held_blocks) != len(need_blocks):
            return f"tokens {tokens} at another position in the sequence"
        for i, (mine, theirs) in enumerate(zip(held_blocks, need_blocks, strict=True)):
            if mine != theirs:
                if i == len(held_blocks) - 1:
                    what = "tokens" if mine[1] != theirs[1] else "multimodal items"
                    return f"tokens {tokens} (different {what}: {list(mine[1])}, mm {mine[2]})"
                return (f"tokens {tokens} after a different prefix (block {i} held "
                        f"{list(mine[1])}, mm {mine[2]}; needed {list(theirs[1])}, "
                        f"mm {theirs[2]})")
        return f"tokens {tokens}"  # the prefix needed (``holds`` describes any block)

    def _unroll(self, prefix: int) -> tuple[_RootKey, list[_BlockKey]]:
        """The root key, and the key of each block from the first on."""
        blocks: list[_BlockKey] = []
        while True:
            key = self._parts[prefix]
            if key[0] == "root":
                return key, blocks[::-1]
            blocks.append(key)
            prefix = key[0]


def _ctx(view: RequestView) -> str:
    extras = [f"{name}={value!r}" for name, value in (
        ("lora", view.lora), ("cache_salt", view.cache_salt),
        ("mm_features", view.mm_features)) if value]
    return f" ({', '.join(extras)})" if extras else ""
