"""No write into a shared block (issue 24 item 2): a law of every profile.

The forward pass after ``allocate_slots(request, num_new_tokens, num_new_computed_tokens,
hits)`` writes the KV of the request's positions ``[start, start + num_new_tokens)``, ``start =
num_computed_tokens + num_new_computed_tokens``, into the blocks its table has at those
positions. None of those blocks may be held by another live request (in its table: a block of
its own or a cache hit it got from ``get_computed_blocks``) or pinned by another request's
outstanding lookup (``pinning_lookup``, ``kvcheck.conformance.pinning``): that request reads
the block's KV, and the write changes it under it. A design that shares a block it must
write (a trie matching a block-aligned prompt through its last block, then recomputing the
last token in place) breaks the law; copying the block first keeps it.

vLLM never writes a shared block: hits are full blocks below ``start``, a new block is nobody
else's, and a partial block is never cached. In a multi-group spec the law holds group by
group (a block id belongs to one group at a time, so "another request holds it" is read
across all groups); the null block 0 is shared legitimately and never written, so it is left
out.

The driver records each step's writes in its ``WriteLog`` (``wrote``) and the hits of each
admission (``admitted``, to say how another request holds a block); ``check_shared_writes``
judges the writes of the last op against the live tables after it (``laws.check_laws``).

The copy-on-write law (a layout with vLLM 0.33's fine-grained partial hits,
``kvcheck.conformance.fine_grained``; ``WriteLog(read_only_hits=True)``): a request never
writes into a block it got as a cache hit, whoever else holds it (a hit ending inside a block
is copied to a private block first; writing the hit block would change cached content under
its key).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple

from kvcheck.conformance.pinning import PinLedger

__all__ = ["WriteLog", "check_shared_writes"]

#: Most shared writes one op reports (they usually share one cause).
_SHOWN = 3


class _Write(NamedTuple):
    """``request_id`` computed its positions ``[start, end)`` into ``table`` (of ``group``, at
    ``block_size`` tokens a block; ``null``: the id that marks a skipped position)."""

    request_id: str
    group: int | None
    table: Sequence[int]
    start: int
    end: int
    block_size: int
    null: int | None


class WriteLog:
    """The writes of the op being run and the hits each live request was admitted with."""

    __slots__ = ("_hits", "_writes", "read_only_hits")

    def __init__(self, *, read_only_hits: bool = False) -> None:
        """``read_only_hits``: a layout with fine-grained partial hits, where a request's own
        hit blocks are read-only too (the copy-on-write law)."""
        self._writes: list[_Write] = []
        self._hits: dict[str, set[int]] = {}
        self.read_only_hits = read_only_hits

    def begin(self) -> None:
        """A new op starts: the writes of the previous one are no longer judged."""
        self._writes.clear()

    def admitted(self, request_id: str, hit_ids: Iterable[int]) -> None:
        """``request_id`` now holds ``hit_ids`` as cache hits it got from a lookup."""
        self._hits[request_id] = set(hit_ids)

    def handed_out(self, request_id: str, block_ids: Iterable[int]) -> None:
        """``request_id`` got ``block_ids`` as new blocks: no longer hits of its own (a
        released hit block may come back to it anew, a Mamba state's)."""
        hits = self._hits.get(request_id)
        if hits:
            hits.difference_update(block_ids)

    def forget(self, request_id: str) -> None:
        """``request_id`` was freed: it holds nothing."""
        self._hits.pop(request_id, None)

    def wrote(self, request_id: str, table: Sequence[int], start: int, end: int,
              block_size: int, *, group: int | None = None, null: int | None = None) -> None:
        """``request_id``'s forward pass writes its positions ``[start, end)`` into the
        blocks ``table`` has there (``group`` and ``null`` for a multi-group spec)."""
        if end > start:
            self._writes.append(_Write(request_id, group, table, start, end, block_size, null))

    def take(self) -> list[_Write]:
        """The writes recorded since ``begin`` (and forget them)."""
        writes, self._writes = self._writes, []
        return writes

    def got_as_hit(self, request_id: str, block_id: int) -> bool:
        return block_id in self._hits.get(request_id, ())


#: Where each live block sits: block id -> [(request id, group or None, index)].
_Places = dict[int, list[tuple[str, int | None, int]]]


def _places(tables: Mapping[str, Sequence[Sequence[int]]], grouped: bool) -> _Places:
    where: _Places = {}
    for rid, groups in tables.items():
        for g, ids in enumerate(groups):
            for i, b in enumerate(ids):
                where.setdefault(b, []).append((rid, g if grouped else None, i))
    return where


def check_shared_writes(log: WriteLog, holders: Mapping[int, int],
                        tables: Callable[[], Mapping[str, Sequence[Sequence[int]]]],
                        pins: PinLedger | None, *, grouped: bool = False) -> list[str]:
    """The shared writes of the last op (empty when there are none).

    ``holders``: each live block id and the number of live requests holding it (the writer
    included); ``tables``: computes every live request's tables, one list per group (read
    only when some written block has another holder); ``pins``: the outstanding lookups.
    """
    problems: list[str] = []
    where: _Places | None = None
    for w in log.take():
        bs = w.block_size
        for index in range(w.start // bs, min(len(w.table), -(-w.end // bs))):
            block = w.table[index]
            if block == w.null:
                continue
            pinners = [] if pins is None else [r for r in pins.pinners(block) if r != w.request_id]
            if log.read_only_hits and log.got_as_hit(w.request_id, block):
                # Cached content, however many hold it: a hit ending inside a block is copied
                # on write first (vLLM 0.33's fine-grained hits), a whole-block hit never
                # written.
                first = max(w.start, index * bs)
                last = min(w.end, (index + 1) * bs) - 1
                problems.append(
                    f"copy-on-write: the forward pass of allocate_slots({w.request_id!r}) "
                    f"writes its positions {first}..{last} into block {block} "
                    f"({_at(w.group, index)}), a cache hit it got from get_computed_blocks: a "
                    "hit block is read-only (a hit ending inside a block is copied to a "
                    "private block before the request writes past the hit)")
                if len(problems) == _SHOWN:
                    return problems
                continue
            if holders.get(block, 0) <= 1 and not pinners:
                continue
            if where is None:
                where = _places(tables(), grouped)
            others = [p for p in where.get(block, ()) if p[0] != w.request_id]
            if not others and not pinners:
                continue  # the writer lists it twice: "no block twice" says so
            first = max(w.start, index * bs)
            last = min(w.end, (index + 1) * bs) - 1
            span = f"position {first}" if first == last else f"positions {first}..{last}"
            held = [f"request {rid!r} also holds it ({_at(g, i)}"
                    + (", a cache hit it got from get_computed_blocks)"
                       if log.got_as_hit(rid, block) else ")")
                    for rid, g, i in others]
            if pinners:
                held.append(f"the outstanding lookup of request(s) {pinners} pinned it "
                            "(pinning_lookup: a pinned hit is held by the request that looked "
                            "it up)")
            problems.append(
                f"shared write: the forward pass of allocate_slots({w.request_id!r}) writes its "
                f"{span} into block {block} ({_at(w.group, index)}), but "
                f"{'; '.join(held)}; a block another live request holds is read-only: a "
                "request's new tokens go into blocks only it holds (a new block, or a copy)")
            if len(problems) == _SHOWN:
                return problems
    return problems


def _at(group: int | None, index: int) -> str:
    return f"its block {index}" if group is None else f"its group {group} block {index}"
