"""Rebinding a block-table entry to an identical block (capability ``dedup_on_insert``, issue
24 item 1).

Radix and trie caches deduplicate on insert: after a forward pass they swap a request's freshly
written block for an identical block already in the cache and free their own copy. The
protocol's table rule (``get_block_ids`` = the previous table + the hits + the new ids, see
``kvcheck.conformance.guard``) forbids any change to an entry; declaring ``dedup_on_insert``
allows one kind: entry ``i`` of request ``r`` may change from block ``old`` to block ``new``
when

* the entry is a full block (positions ``[i * block_size, (i + 1) * block_size)``) that ``r``
  has computed: every position below the end of its last ``allocate_slots``;
* its tokens are computed: a change seen by the first look at the table after the
  ``allocate_slots`` that scheduled those positions may have been made during that call,
  before its forward pass ran, so there the positions from that call's start on count as not
  computed yet;
* ``new`` holds the same content as the entry: the same prefix identity in kvcheck's shadow
  record of the writes (``kvcheck.conformance.written.WrittenBlocks``: the tokens from position 0
  through the block's end, and their context), which is also what ``old`` holds.

The guard judges every changed entry with ``Rebindings.judge`` (the driver attaches one to
its guarded manager, ``watch_rebindings``); an accepted change updates the guard's table and
holds like a release of ``old`` and a share of ``new``, so conservation and the ref counts see
exactly that. After the op, ``check_rebindings`` requires ``old`` to be released: held by
another live request, or free (in ``free_block_ids()`` with ``free_queue_order``; otherwise
conservation must balance). Without the capability the rule is unchanged; the violation then
names the capability when every change it sees is a valid rebinding.

Multi-group specs keep their own table rule (entries may only become the null block): a
rebinding there is not judged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from kvcheck.conformance.guard import GuardedManager

if TYPE_CHECKING:
    from kvcheck.conformance.protocol import ManagerWithCapabilities
    from kvcheck.conformance.written import WrittenBlocks

__all__ = ["CAPABILITY", "Rebindings", "Rebound", "check_rebindings", "watch_rebindings"]

#: The capability this module is about.
CAPABILITY = "dedup_on_insert"
#: Most invalid changes one violation message describes.
_SHOWN = 3


class Rebound(NamedTuple):
    """An accepted rebinding: ``request_id``'s table entry ``entry`` went from block ``old``
    to block ``new``."""

    request_id: str
    entry: int
    old: int
    new: int


class Rebindings:
    """The judge of changed table entries for one guarded manager, and the accepted
    rebindings not yet checked by ``check_rebindings``.

    ``written`` is the driver's shadow record (read only); ``declared`` whether the
    implementation declares ``dedup_on_insert``.
    """

    __slots__ = ("_done", "declared", "written")

    def __init__(self, written: WrittenBlocks, *, declared: bool) -> None:
        self.written = written
        self.declared = declared
        self._done: list[Rebound] = []

    def judge(self, request_id: str, expected: Sequence[int], got: Sequence[int], *,
              computed: int, fresh: int | None) -> tuple[bool, str]:
        """Whether the table ``got`` is ``expected`` with valid rebindings (declared), and the
        note the guard's violation ends with otherwise ("" for none).

        ``computed``: the request's computed tokens (the end of its last ``allocate_slots``);
        ``fresh``: that call's start when this is the first look at the table since it, else
        None. Accepted changes are recorded for ``check_rebindings``.
        """
        if len(got) != len(expected):
            if not self.declared:
                return False, ""
            return False, (f"; the table has {len(got)} entries where {len(expected)} are "
                           "due: a rebinding (dedup_on_insert) replaces entries, it never adds "
                           "or removes any")
        changes = [Rebound(request_id, i, old, new)
                   for i, (old, new) in enumerate(zip(expected, got, strict=True)) if old != new]
        reasons = [(change, self._invalid(change, computed, fresh)) for change in changes]
        invalid = [(change, why) for change, why in reasons if why is not None]
        if not invalid:
            if self.declared:
                self._done += changes
                return True, ""
            shown = "; ".join(f"index {c.entry} changed from block {c.old} to block {c.new}, "
                              f"which holds the same content ({self.written.holds(c.new)})"
                              for c in changes[:_SHOWN])
            return False, (f"; {shown}{_more(len(changes))}: declare dedup_on_insert if your "
                           "cache swaps identical blocks")
        if not self.declared:
            return False, ""
        shown = "; ".join(f"index {c.entry} changed from block {c.old} to block {c.new}: {why}"
                          for c, why in invalid[:_SHOWN])
        return False, f"; not a valid rebinding (dedup_on_insert): {shown}{_more(len(invalid))}"

    def _invalid(self, change: Rebound, computed: int, fresh: int | None) -> str | None:
        """Why ``change`` is not a valid rebinding (None if it is one)."""
        bs = self.written.block_size
        first, end = change.entry * bs, (change.entry + 1) * bs
        where = f"positions {first}..{end - 1}"
        if end > computed:
            return (f"a partial block: {where}, but request {change.request_id!r} has "
                    f"{computed} tokens computed; only a full block whose tokens are all "
                    "computed may be rebound")
        if fresh is not None and end > fresh:
            return (f"its tokens are not computed yet: {where} are computed by the "
                    f"allocate_slots({change.request_id!r}, ...) just made (from position "
                    f"{max(first, fresh)} on), whose forward pass has not run; rebind a block "
                    "only after the call that scheduled its tokens")
        need = self.written.chain_prefix(change.request_id, change.entry)
        held_old = self.written.held_prefix(change.old)
        if need is None:
            need = held_old
        if need is not None and self.written.held_prefix(change.new) == need:
            return None
        return (f"the content differs: block {change.old} holds "
                f"{self.written.holds(change.old)}; block {change.new} holds "
                f"{self.written.holds(change.new, need)}")

    def take(self) -> list[Rebound]:
        """The rebindings accepted since the last call (and forget them)."""
        done, self._done = self._done, []
        return done


def _more(count: int) -> str:
    return f" (and {count - _SHOWN} more)" if count > _SHOWN else ""


def watch_rebindings(manager: object, written: WrittenBlocks, *,
                     declared: bool) -> Rebindings | None:
    """Attach a ``Rebindings`` judge over ``written`` to a guarded single-group ``manager``
    and return it (None for a multi-group guard or an unguarded manager: nothing judged)."""
    if not isinstance(manager, GuardedManager) or manager.grouped:
        return None
    judge = Rebindings(written, declared=declared)
    manager.judge_rebindings(judge)
    return judge


def check_rebindings(judge: Rebindings | None, holders: Mapping[int, int], *,
                     manager: ManagerWithCapabilities, free_queue: bool,
                     initial_free: int) -> list[str]:
    """The rebinding law after an op: the old block of every rebinding ``judge`` accepted
    since the last check is released (``holders``: each live block id and its number of
    holders; ``free_queue``: whether ``manager`` shows its free queue; ``initial_free``: the
    fresh pool's ``num_free_blocks()``)."""
    if judge is None:
        return []
    kept = [r for r in judge.take() if not holders.get(r.old)]
    if not kept:
        return []
    if free_queue:
        free = set(manager.free_block_ids())
        kept = [r for r in kept if r.old not in free]
        how = "it is not in free_block_ids()"
    else:
        short = manager.num_free_blocks() + len(holders) < initial_free
        kept = kept if short else []
        how = "num_free_blocks() does not count it (conservation is short)"
    return [f"rebinding: request {r.request_id!r}'s index {r.entry} was rebound from block "
            f"{r.old} to block {r.new} (dedup_on_insert), but block {r.old} was not released: "
            f"no live request holds it and {how}; free the copy a rebinding replaces"
            for r in kept]
