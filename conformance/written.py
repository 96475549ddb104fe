"""``WrittenBlocks``: kvcheck's shadow record of which tokens the suite's scheduler computed
into which block, the ground truth of the hit-correctness law (``kvcheck.conformance.laws``)
and of the rebinding judge (``kvcheck.conformance.rebinding``). One record per KV-cache group,
at that group's block size.

In a layout with fine-grained partial hits (``kvcheck.conformance.fine_grained``) a record
also keeps, per block, the prefix before it and the tokens written into it, so a hit ending
inside a block is judged on its first tokens (``partial_mismatch``), a request may continue a
block whose first tokens are its own (a copy-on-write block), and ``copy(src, dst)`` models a
copy: ``dst`` gets what ``src`` held before this step's writes (vLLM's worker copies before
the step's forward pass), the writes already recorded into ``dst`` on top. ``settle()`` ends
the step (called where the copies are drained).

With vLLM 0.33's multi-module MTP (``lag``: ``num_prefill_lookahead - 1`` re-prefillable
tokens) a record also keeps which blocks are *final*: a request computed at least ``lag``
tokens past their end while they held its tokens, so a cache may have keyed them
(``is_final``; docs/semantics.md#multi-module-mtp).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from kvcheck.conformance.protocol import RequestView

__all__ = ["WrittenBlocks"]

# WrittenBlocks' interned keys: a request's root context (LoRA, cache salt), and one full
# block (the parent prefix id, the block's tokens, its multimodal items as (id, offset)).
_RootKey = tuple[Literal["root"], tuple[str, int, str] | None, str | None]
_BlockKey = tuple[int, tuple[int, ...], tuple[tuple[str, int], ...]]
_Key = _RootKey | _BlockKey


class _Write:
    """What one block holds: written by ``rid`` as its block ``index``, ``filled`` tokens from
    the block start, and once full the id of the prefix it holds (``None`` until then). With
    fine-grained hits also ``parent``, the prefix id before the block, and ``view``, the
    writer's request (its tokens)."""

    __slots__ = ("filled", "index", "parent", "prefix", "rid", "view")

    def __init__(self, rid: str, index: int, filled: int, prefix: int | None,
                 parent: int | None = None, view: RequestView | None = None) -> None:
        self.rid, self.index, self.filled, self.prefix = rid, index, filled, prefix
        self.parent, self.view = parent, view

    def clone(self) -> _Write:
        return _Write(self.rid, self.index, self.filled, self.prefix, self.parent, self.view)


class WrittenBlocks:
    """The shadow record of what the scheduler wrote into each block.

    A *prefix id* names one (context, tokens ``[0, (i + 1) * block_size)``) identity: the root
    is the request's LoRA and cache salt; each full block adds its tokens and the multimodal
    items overlapping it (identifier and offset in the block, as vLLM keys them). Equal ids
    mean the KV computed for that block is the same, so ids are interned integers and the
    law is one comparison per hit block.
    """

    def __init__(self, block_size: int, *, fine: bool = False, state: bool = False,
                 lag: int = 0) -> None:
        """``fine``: the layout has fine-grained partial hits (see the module doc); ``state``:
        the group keeps states (Mamba), so a block's content is the state after exactly its
        ``filled`` tokens, not a prefix of them; ``lag``: the re-prefillable tokens of
        multi-module MTP (0: none, ``is_final`` is not kept)."""
        self.block_size = block_size
        self.fine = fine
        self.state = state
        self.lag = lag
        #: With ``lag``: the blocks some request computed ``lag`` tokens past while holding.
        self._final: set[int] = set()
        #: Fine-grained: per block written or handed out since ``settle``, what it held before
        #: and the writes into it since, ``(view, index, lo, hi)``.
        self._since: dict[int, tuple[_Write | None, list[tuple[RequestView, int, int, int]]]] = {}
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
            self._final.discard(block_id)
            if self.fine:
                self._since[block_id] = (None, [])

    def write(self, view: RequestView, table: Sequence[int], start: int, end: int) -> None:
        """``view`` computed its positions ``[start, end)`` into the blocks of ``table``."""
        bs = self.block_size
        for index in range(start // bs, min(len(table), -(-end // bs))):
            block_id = table[index]
            lo = max(start, index * bs) - index * bs
            hi = min(end, (index + 1) * bs) - index * bs
            if self.fine and block_id >= 0:  # (negative: a null position's stand-in)
                if block_id not in self._since:
                    old = self._blocks.get(block_id)
                    self._since[block_id] = (None if old is None else old.clone(), [])
                self._since[block_id][1].append((view, index, lo, hi))
            self._write_block(view, block_id, index, lo, hi)
        lag = self.lag
        if lag:  # the blocks this step's tokens finalized (the earlier ones were before)
            for index in range(max(0, (start - lag) // bs),
                               min(len(table), max(0, (end - lag) // bs))):
                if table[index] >= 0:
                    self._final.add(table[index])

    def is_final(self, block_id: int) -> bool:
        """With ``lag``: whether a request computed ``lag`` tokens past ``block_id``'s end while
        it held the block (vLLM 0.33 caches no block before)."""
        return block_id in self._final

    def _write_block(self, view: RequestView, block_id: int, index: int, lo: int,
                     hi: int) -> None:
        """``view`` computed the tokens ``[lo, hi)`` of its block ``index`` into
        ``block_id``."""
        rid = view.request_id
        old = self._blocks.get(block_id)
        if lo == 0:
            write = self._blocks[block_id] = _Write(
                rid, index, hi, None, *((self.prefix_id(view, index - 1), view) if self.fine
                                        else ()))
        elif (old is not None and old.rid == rid and old.index == index
              and old.filled == lo and old.prefix is None):
            write = old
            write.filled = hi
            if self.fine:
                write.view = view
        elif self.fine and old is not None and self._holds_start(old, view, index, lo):
            # Its first lo tokens are the writer's own (a copy-on-write block): continued.
            write = self._blocks[block_id] = _Write(rid, index, hi, None,
                                                    self.prefix_id(view, index - 1), view)
        else:  # a write continuing someone else's (or nobody's) tokens: mixed content
            self._blocks[block_id] = _Write(rid, index, -1, None)
            return
        if write.filled == self.block_size:
            write.prefix = self.prefix_id(view, index)

    def _holds_start(self, write: _Write, view: RequestView, index: int, count: int) -> bool:
        """Whether ``write`` holds ``view``'s block ``index`` through its first ``count``
        tokens (exactly ``count`` for a state)."""
        if write.view is None or write.filled < 0 or write.index != index or (
                write.filled != count if self.state else write.filled < count):
            return False
        if write.parent != self.prefix_id(view, index - 1):
            return False
        lo = index * self.block_size
        return (write.view.token_ids[lo:lo + count] == view.token_ids[lo:lo + count]
                and _mm_in(write.view, lo, lo + count) == _mm_in(view, lo, lo + count))

    def write_state(self, view: RequestView, block_id: int, num_tokens: int) -> None:
        """``block_id`` now holds ``view``'s state after exactly its first ``num_tokens``
        tokens, whatever table index it sits at (a state group's prefill checkpoint,
        ``kvcheck.conformance.mamba_checkpoints``): recorded as ``view``'s block ``(num_tokens
        - 1) // block_size`` written through that many tokens."""
        bs = self.block_size
        index = (num_tokens - 1) // bs
        filled = num_tokens - index * bs
        self._blocks[block_id] = _Write(
            view.request_id, index, filled,
            self.prefix_id(view, index) if filled == bs else None,
            *((self.prefix_id(view, index - 1), view) if self.fine else ()))

    # ------------------------------------------------------------------ copies
    def copy(self, src: int, dst: int) -> None:
        """A copy from ``src`` to ``dst`` (fine-grained hits): ``dst`` holds what ``src``
        held before this step's writes, then the writes recorded into ``dst`` since."""
        base = self._since[src][0] if src in self._since else self._blocks.get(src)
        notes = self._since[dst][1] if dst in self._since else []
        if base is None:
            self._blocks.pop(dst, None)
        else:
            self._blocks[dst] = base.clone()
        for view, index, lo, hi in notes:
            self._write_block(view, dst, index, lo, hi)

    def knows(self, block_id: int) -> bool:
        """Whether this record has seen ``block_id`` written (or handed out) in this group."""
        return block_id in self._blocks or block_id in self._since

    def settle(self) -> None:
        """The step's copies are done: forget the before-images."""
        self._since.clear()

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

    def partial_mismatch(self, block_id: int, view: RequestView, index: int,
                         count: int) -> str | None:
        """Why ``block_id`` does not hold ``view``'s block ``index`` through its first
        ``count`` tokens, the prefix before it included (a hit ending inside the block;
        exactly ``count`` for a state), or None if it does."""
        write = self._blocks.get(block_id)
        if write is not None and self._holds_start(write, view, index, count):
            return None
        lo = index * self.block_size
        wanted = list(view.token_ids[lo:lo + count])
        return (f"it holds {self.holds(block_id)}; request {view.request_id!r} needs "
                f"{'the state after ' if self.state else ''}its first {count} tokens "
                f"{wanted} of the block after its own prefix{_ctx(view)}")

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


def _mm_in(view: RequestView, start: int, end: int) -> tuple[tuple[str, int], ...]:
    """``view``'s multimodal items overlapping ``[start, end)`` (identifier, offset from
    ``start``)."""
    return tuple((ident, offset - start) for ident, offset, length in view.mm_features
                 if offset < end and offset + length > start)


def _ctx(view: RequestView) -> str:
    extras = [f"{name}={value!r}" for name, value in (
        ("lora", view.lora), ("cache_salt", view.cache_salt),
        ("mm_features", view.mm_features)) if value]
    return f" ({', '.join(extras)})" if extras else ""
