"""The offload tier's laws, policy-free: a model of every key's state that checks each answer
of a tier as it comes (docs/semantics.md#the-offload-tier).

The model knows what any correct tier must answer whatever its eviction policy:

* ``lookup``: ``MISS`` for a key not in the tier, ``HIT_PENDING`` while its store is not
  complete (``ref_cnt == -1``), ``HIT`` once it is; a local tier never answers ``RETRY``;
* ``prepare_store``: ``keys_to_store`` is exactly the offered keys not in the tier (that the
  admission filter lets through, with ``store_threshold >= 2``), in offer order; exactly as many
  keys are evicted as the free slots lack, each one ready and unpinned (``ref_cnt == 0``) and
  not offered; the answer is None only when fewer such keys exist than needed, and then nothing
  changed; a slot is never handed out while another key holds it;
* ``prepare_load``'s slots are the ones the keys were stored in;
* events: one removal per ``prepare_store`` that evicted (its ``evicted_keys``), one store per
  successful ``complete_store`` (its keys), one ``metadata_only`` removal per failed one, whose
  keys stored again before ``take_events`` are left out (a removal with none left is dropped).

Which keys a policy evicts is not a law: the oracle comparison checks it
(``offload_driver``). A broken law raises ``OffloadLawBroken`` naming the call and the law.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypedDict

from kvcheck.conformance.errors import OffloadLawBroken
from kvcheck.conformance.offload_protocol import OffloadSpec, StoreAnswer
from kvcheck.reference_impl.offload_manager import count_offer

if TYPE_CHECKING:
    from kvcheck.conformance.offload_guard import OffloadEvent

__all__ = ["OffloadLawBroken", "TierModel"]


class _LawEvent(TypedDict):
    """The fields of an event the laws compare, in this order."""

    keys: list[bytes]
    removed: object
    removal_expected: object
    metadata_only: object

_PENDING = -1


def _hex(keys: Sequence[bytes]) -> str:
    return "[" + ", ".join(key[:6].hex() + ".." for key in keys) + "]"


class TierModel:
    """Every key's state (``-1`` pending, ``n >= 0`` ready and pinned ``n`` times), its slot
    (when the tier reports slots), the admission tracker and the events owed.

    The caller (the driver) makes only calls vLLM's scheduler makes: loads of ``HIT`` keys,
    completions of what was prepared, offers without duplicates.
    """

    def __init__(self, spec: OffloadSpec) -> None:
        self.spec = spec
        self.state: dict[bytes, int] = {}
        self.slot: dict[bytes, int] = {}
        self.counts: OrderedDict[bytes, int] | None = (
            OrderedDict() if spec.store_threshold >= 2 else None)
        self._owed: list[_LawEvent] = []

    # --- queries the driver uses to choose legal calls --------------------------------------

    def ready(self, key: bytes) -> bool:
        return self.state.get(key, _PENDING) >= 0

    def pending(self, key: bytes) -> bool:
        return self.state.get(key) == _PENDING

    # --- laws ------------------------------------------------------------------------------

    def lookup(self, key: bytes, answer: str) -> None:
        state = self.state.get(key)
        want = "MISS" if state is None else "HIT_PENDING" if state == _PENDING else "HIT"
        if answer != want:
            why = ("not in the tier" if state is None else "its store is not complete"
                   if state == _PENDING else f"ready (ref_cnt {state})")
            raise OffloadLawBroken(f"lookup({_hex([key])}) answered {answer}, expected {want}: "
                                   f"the key is {why}")

    def prepare_load(self, keys: Sequence[bytes], slots: list[int] | None) -> None:
        for i, key in enumerate(keys):
            if slots is not None and key in self.slot and slots[i] != self.slot[key]:
                raise OffloadLawBroken(
                    f"prepare_load({_hex(keys)}) reads key {key.hex()} from slot {slots[i]}, "
                    f"but it was stored in slot {self.slot[key]}")
            self.state[key] += 1

    def complete_load(self, keys: Sequence[bytes]) -> None:
        for key in keys:
            self.state[key] -= 1

    def _admitted(self, keys: Sequence[bytes]) -> list[bytes]:
        """The offered keys a correct tier stores (the admission tracker counted first)."""
        counts = self.counts
        if counts is not None:
            # vLLM's tracker rule, the one the reference keeps (a rule, not a policy choice).
            count_offer(counts, keys, self.spec.max_tracker_size)
        absent = [key for key in keys if key not in self.state]
        if counts is None:
            return absent
        return [key for key in absent if counts.get(key, 0) >= self.spec.store_threshold]

    def prepare_store(self, keys: Sequence[bytes], answer: StoreAnswer | None) -> None:
        call = f"prepare_store({_hex(keys)})"
        want = self._admitted(keys)
        offered = set(keys)
        free = self.spec.num_chunks - len(self.state)
        evictable = [k for k, s in self.state.items() if s == 0 and k not in offered]
        deficit = len(want) - free
        if answer is None:
            if want and deficit > len(evictable):
                return  # refused, rightly: the model stays as it was
            if not want:
                raise OffloadLawBroken(
                    f"{call} answered None, but nothing is to be stored (every offered key is "
                    "in the tier" + ("" if self.counts is None else " or not admitted yet")
                    + "): the answer is {'keys_to_store': [], 'evicted_keys': [], ...}")
            raise OffloadLawBroken(
                f"{call} answered None, but {len(want)} key(s) fit: {max(free, 0)} free "
                f"slot(s) and {len(evictable)} ready unpinned chunk(s) not in the offer")
        got = answer["keys_to_store"]
        if got != want:
            rule = ("the offered keys not in the tier, in offer order" if self.counts is None
                    else f"the offered keys not in the tier that were offered at least "
                         f"{self.spec.store_threshold} times (store_threshold), in offer order")
            raise OffloadLawBroken(f"{call}: keys_to_store {_hex(got)}, expected {_hex(want)}: "
                                   f"{rule}")
        evicted = answer["evicted_keys"]
        for key in evicted:
            state = self.state.get(key)
            if state != 0:
                why = ("not in the tier" if state is None else "its store is pending"
                       if state == _PENDING else f"pinned by {state} load(s)")
                raise OffloadLawBroken(f"{call} evicted {key.hex()}, which is {why}: only ready "
                                       "unpinned chunks are evicted")
        if len(evicted) != max(deficit, 0):
            raise OffloadLawBroken(f"{call} evicted {len(evicted)} key(s) for {len(want)} new "
                                   f"one(s) with {max(free, 0)} free slot(s): exactly "
                                   f"{max(deficit, 0)} must go")
        for key in evicted:
            del self.state[key]
            self.slot.pop(key, None)
        chunk_ids = answer.get("chunk_ids")
        if chunk_ids is not None:
            held = {slot: key for key, slot in self.slot.items()}
            for key, slot in zip(want, chunk_ids, strict=True):
                if slot in held:
                    raise OffloadLawBroken(f"{call} gives key {key.hex()} slot {slot}, which key "
                                           f"{held[slot].hex()} still holds")
                held[slot] = key
                self.slot[key] = slot
        for key in want:
            self.state[key] = _PENDING
        if evicted and self.spec.enable_events:
            self._owed.append(_event(evicted, removed=True))

    def complete_store(self, keys: Sequence[bytes], success: bool) -> None:
        for key in keys:
            if success:
                self.state[key] = 0
            else:
                del self.state[key]
                self.slot.pop(key, None)
        if keys and self.spec.enable_events:
            self._owed.append(_event(list(keys), removed=not success,
                                     metadata_only=not success))

    def reset(self) -> None:
        self.state.clear()
        self.slot.clear()

    def take_events(self, answer: list[OffloadEvent]) -> None:
        want: list[_LawEvent] = []
        for event in self._owed:
            if not event["metadata_only"]:
                want.append(event)
                continue
            keys = [key for key in event["keys"] if key not in self.state]
            if keys:
                want.append({**event, "keys": keys})
        self._owed = []
        got: list[_LawEvent] = [
            {"keys": event["keys"], "removed": event["removed"],
             "removal_expected": event["removal_expected"], "metadata_only": event["metadata_only"]}
            for event in answer]
        if got != want:
            raise OffloadLawBroken(
                "take_events() answered " + _events_text(got) + ", expected "
                + _events_text(want) + ": one removal per prepare_store that evicted, one store "
                "per successful complete_store, one metadata_only removal per failed one "
                "(without the keys stored again since)")


def _event(keys: list[bytes], *, removed: bool, metadata_only: bool = False) -> _LawEvent:
    return {"keys": keys, "removed": removed, "removal_expected": False,
            "metadata_only": metadata_only}


def _events_text(events: list[_LawEvent]) -> str:
    parts = [("removed" if e["removed"] else "stored")
             + (" (metadata only)" if e["metadata_only"] else "") + " " + _hex(e["keys"])
             for e in events]
    return "[" + "; ".join(parts) + "]"
