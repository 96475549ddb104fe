"""Lookups with side effects (capability ``pinning_lookup``, issue 24 item 5).

Radix and trie caches take a reference on the blocks a prefix match returns (SGLang locks the
matched nodes, LMDeploy touches its LRU): ``get_computed_blocks`` *pins* its hits. Declaring
``pinning_lookup`` allows that, and the suite then keeps one rule (``SupportsReleaseComputed``):
every lookup of a request is followed by ``allocate_slots`` for that request (which turns the
pins into the request's references, or keeps them when it refuses) or by
``release_computed(request_id)`` (after a refusal, or a lookup the scheduler does not follow
with an allocation), and never by a second lookup or a ``free`` of that request in between.

``PinLedger`` is the guard's record of the pins outstanding (``GuardedManager.pin_ledger``,
None without the capability). The laws (``kvcheck.conformance.laws.check_pool``) count a
pinned block as held by the request that looked it up: conservation counts it once among the
held blocks, it must not be in the free queue, and ``ref_cnt`` counts the pin. The guard
refuses an ``allocate_slots`` that hands a pinned block out anew. When a pin ends (consumed by
``allocate_slots`` or dropped by ``release_computed``) the ledger remembers how, until the
block is handed out anew, so that a block lost to a pin the design never dropped is named in
the conservation message.

Without the capability ``get_computed_blocks`` must have no side effects (vLLM's rule); there
is no ledger and nothing here applies.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from kvcheck.conformance.errors import PinningMisuse
from kvcheck.conformance.protocol import RequestView

if TYPE_CHECKING:
    from kvcheck.conformance.groups import AdapterBlockIds

__all__ = [
    "CAPABILITY",
    "PinLedger",
    "PinningMisuse",
    "declares_pinning",
    "ledger_of",
    "pinned_ids",
    "probe_computed_blocks",
    "release_after_lookup",
]

#: The capability this module is about.
CAPABILITY = "pinning_lookup"
#: Most blocks a conservation message names as possibly leaked by a pin.
_SHOWN = 8


class _Lookups(Protocol):
    """What the helpers call: a (guarded) manager."""

    def get_computed_blocks(self, request: RequestView) -> tuple[AdapterBlockIds, int]: ...
    def release_computed(self, request_id: str) -> None: ...


def pinned_ids(hits: Sequence[Sequence[int]], *, null: int | None) -> list[int]:
    """The block ids a lookup answer pins: every id of its per-group ``hits`` but the null
    block ``null`` (a multi-group spec's 0; None for a single-group spec, where 0 may be an
    ordinary block)."""
    return [int(b) for group in hits for b in group if b != null]


class PinLedger:
    """The pins outstanding, request by request, and how recent pins ended.

    ``pin`` (a lookup answered), ``consume`` (``allocate_slots`` succeeded), ``release``
    (``release_computed``) and ``handed_out`` (blocks ``allocate_slots`` returned as new) are
    called by the guard; the laws read ``holders``, ``pinners`` and ``ended``.
    """

    __slots__ = ("_ended", "_pins")

    def __init__(self) -> None:
        self._pins: dict[str, list[int]] = {}  # request id -> the block ids its lookup pinned
        # block id -> how its last pin ended, most recent last (until handed out anew).
        self._ended: dict[int, str] = {}

    # ------------------------------------------------------------------ the guard's side
    def pin(self, request_id: str, block_ids: Iterable[int]) -> None:
        """``get_computed_blocks(request)`` answered: its hits are pinned by the request.

        Raises:
            PinningMisuse: the request's previous lookup was neither allocated nor released.
        """
        if request_id in self._pins:
            raise PinningMisuse(
                f"kvcheck: get_computed_blocks({request_id!r}) called again while the pins of "
                f"its previous lookup ({self._pins[request_id]}) are outstanding\n  Fix: under "
                "pinning_lookup follow every lookup with allocate_slots for that request or "
                f"with release_computed({request_id!r}) (kvcheck.conformance.pinning)")
        self._pins[request_id] = list(block_ids)

    def consume(self, request_id: str) -> None:
        """``allocate_slots(request, ...)`` succeeded: its pins became its references."""
        self._end(request_id, f"allocate_slots({request_id!r})")

    def release(self, request_id: str) -> None:
        """``release_computed(request_id)`` was called: its pins are gone."""
        self._end(request_id, f"release_computed({request_id!r})")

    def check_free(self, request_id: str) -> None:
        """``free(request_id)`` is about to be called.

        Raises:
            PinningMisuse: the request has an outstanding lookup.
        """
        if request_id in self._pins:
            raise PinningMisuse(
                f"kvcheck: free({request_id!r}) called while the pins of its lookup "
                f"({self._pins[request_id]}) are outstanding\n  Fix: under pinning_lookup "
                f"call allocate_slots or release_computed({request_id!r}) after the lookup, "
                "before anything else for that request (kvcheck.conformance.pinning)")

    def handed_out(self, block_ids: Iterable[int]) -> None:
        """Blocks ``allocate_slots`` returned as new: their pin history is over."""
        for block_id in block_ids:
            self._ended.pop(block_id, None)

    def clash(self, request_id: str, new_ids: Iterable[int]) -> str | None:
        """Why ``allocate_slots(request_id)`` may not return ``new_ids`` as new blocks (None
        if it may): one of them is pinned by a lookup (of this request or another one)."""
        for block_id in new_ids:
            owners = self.pinners(block_id)
            if owners:
                who = ("this request's own lookup, so it is a hit, never a new block"
                       if owners == [request_id] else
                       f"the lookup of request(s) {owners}, not yet followed by allocate_slots "
                       "or release_computed")
                return (f"block {block_id} is handed out anew but it is pinned by {who} "
                        "(pinning_lookup: a pinned block is held by the request that looked it "
                        "up; it must not be evicted or handed out)")
        return None

    def _end(self, request_id: str, how: str) -> None:
        for block_id in self._pins.pop(request_id, ()):
            self._ended.pop(block_id, None)  # re-inserted: most recent last
            self._ended[block_id] = how

    # ------------------------------------------------------------------ the laws' side
    def pinned(self) -> dict[str, list[int]]:
        """Request id -> the blocks its outstanding lookup pinned (copies)."""
        return {rid: list(ids) for rid, ids in self._pins.items()}

    def pinners(self, block_id: int) -> list[str]:
        """The requests whose outstanding lookup pinned ``block_id``, sorted."""
        return sorted(rid for rid, ids in self._pins.items() if block_id in ids)

    def holders(self) -> Counter[int]:
        """Block id -> the number of outstanding lookups pinning it."""
        counts: Counter[int] = Counter()
        for ids in self._pins.values():
            counts.update(set(ids))
        return counts

    def ended(self) -> dict[int, str]:
        """Block id -> the call that ended its last pin, most recent last, for blocks not
        handed out anew since."""
        return dict(self._ended)

    def leak_hint(self, exclude: Iterable[int], *, free_known: bool) -> str:
        """For a conservation deficit: the blocks whose pin ended and that are not in
        ``exclude`` (the blocks held or pinned now, and the free ones when ``free_known``),
        most recent first; "" when there are none."""
        skip = set(exclude)
        suspects = [(b, how) for b, how in reversed(self._ended.items()) if b not in skip]
        if not suspects:
            return ""
        shown = ", ".join(f"block {b} (pin ended by {how})" for b, how in suspects[:_SHOWN])
        more = f" and {len(suspects) - _SHOWN} more" if len(suspects) > _SHOWN else ""
        where = ("neither held by a request nor free" if free_known else
                 "held by no request (the free queue is not declared: some may be free)")
        return (f"; pinning_lookup: a pin the design did not drop keeps its block out of "
                f"num_free_blocks(), and these once-pinned blocks are {where} now: "
                f"{shown}{more}")


def ledger_of(manager: object) -> PinLedger | None:
    """The ``PinLedger`` of a guarded manager whose implementation declares
    ``pinning_lookup`` (None otherwise: no pins to follow)."""
    ledger = getattr(type(manager), "pin_ledger", None)
    if ledger is None:
        return None
    value = getattr(manager, "pin_ledger", None)
    return value if isinstance(value, PinLedger) else None


def declares_pinning(impl: object) -> bool:
    """Whether ``impl`` (an ``ImplHandle``, or any object with an ``info.capabilities``)
    declares ``pinning_lookup``; False for one that says nothing (a benchmark's stand-in)."""
    capabilities = getattr(getattr(impl, "info", None), "capabilities", ())
    return CAPABILITY in capabilities


def release_after_lookup(manager: _Lookups, request_id: str, *, pinning: bool) -> None:
    """The end of a lookup that no successful ``allocate_slots`` followed: with ``pinning``
    (the implementation declares ``pinning_lookup``), ``release_computed(request_id)``;
    without, nothing (the lookup had no side effects)."""
    if pinning:
        manager.release_computed(request_id)


def probe_computed_blocks(manager: _Lookups,
                          request: RequestView) -> tuple[AdapterBlockIds, int]:
    """``get_computed_blocks(request)`` as a test that only looks (no allocation follows):
    the answer, with the pins released at once when the guarded ``manager`` follows pins."""
    answer = manager.get_computed_blocks(request)
    release_after_lookup(manager, request.request_id, pinning=ledger_of(manager) is not None)
    return answer
