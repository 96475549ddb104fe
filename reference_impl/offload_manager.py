"""The offload tier's manager: a pool of CPU chunks with reference counts, a cache policy
(LRU or ARC) and events, as vLLM 0.33's ``v1/kv_offload/cpu/manager.py``
``CPUOffloadingManager`` runs it in the scheduler (docs/semantics.md#the-offload-tier).

The call discipline (vLLM's ``OffloadingManager`` API):

* ``lookup(key)``: ``MISS`` (absent), ``HIT_PENDING`` (its write is pending), ``HIT``.
* ``prepare_load(keys)`` pins ready chunks (``ref_cnt += 1``; a pinned chunk is never evicted)
  until ``complete_load(keys)``.
* ``prepare_store(keys)``: keys already present are not stored again; the rest (those the
  admission filter lets through when ``store_threshold >= 2``) get chunks, pending
  (``ref_cnt == -1``: not readable, not evictable). Chunks are freed by evicting ready unpinned
  ones, **never a key of the same offer**; either every needed chunk is found or nothing
  changes and the answer is None.
* ``complete_store(keys, success)``: pending chunks become ready (one stored event), or on
  failure are dropped (one ``metadata_only`` removed event, which ``take_events`` filters for
  keys stored again since).
* ``on_request_finished``: the request's reads and stores, in prefix order, are committed to
  the policy's recency (and, for ARC, frequency).

Keys are bytes (``offload_policy.make_offload_key``). Calls that vLLM's scheduler never makes
raise ``OffloadMisuseError`` naming the key and the rule, and change nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum, auto

from kvcheck.reference_impl.errors import OffloadMisuseError
from kvcheck.reference_impl.offload_arc import ARCCachePolicy
from kvcheck.reference_impl.offload_lru import LRUCachePolicy
from kvcheck.reference_impl.offload_policy import (
    CachePolicy,
    ChunkStatus,
    OffloadKey,
    ReqContext,
    get_offload_group_idx,
)

__all__ = ["CACHE_POLICIES", "CPUOffloadingManager", "LoadStoreSpec", "LookupResult",
           "OffloadingEvent", "PrepareStoreOutput", "count_offer"]

#: Policy name -> class (vLLM's ``CachePolicyFactory`` built-ins).
CACHE_POLICIES: dict[str, type[CachePolicy]] = {"lru": LRUCachePolicy, "arc": ARCCachePolicy}


class LookupResult(Enum):
    """The answer of ``lookup``."""

    MISS = auto()
    HIT = auto()
    HIT_PENDING = auto()
    RETRY = auto()


@dataclass(frozen=True, slots=True)
class LoadStoreSpec:
    """Where a load reads or a store writes: one chunk slot per key (vLLM's
    ``CPULoadStoreSpec.block_ids``)."""

    block_ids: tuple[int, ...]


@dataclass(slots=True)
class PrepareStoreOutput:
    """``keys_to_store`` (in offer order) get the slots of ``store_spec``; ``evicted_keys`` were
    evicted to make room."""

    keys_to_store: list[OffloadKey]
    store_spec: LoadStoreSpec
    evicted_keys: list[OffloadKey]


@dataclass(frozen=True, slots=True)
class OffloadingEvent:
    """Keys stored (``removed=False``) or removed, with vLLM's fields. ``metadata_only``: a
    failed store released them (no public eviction)."""

    keys: list[OffloadKey]
    medium: str
    removed: bool
    locality: str | None = None
    ownership: str | None = None
    removal_expected: bool = False
    metadata_only: bool = False


@dataclass(slots=True)
class _RequestAccess:
    """The keys one request read or stored (this manager, this cache generation)."""

    owner: object
    generation: int
    key_groups: dict[int, list[OffloadKey]] = field(default_factory=dict)
    seen: set[OffloadKey] = field(default_factory=set)
    inserted: set[OffloadKey] = field(default_factory=set)
    reused: set[OffloadKey] = field(default_factory=set)
    store_missed: set[OffloadKey] = field(default_factory=set)
    finished: bool = False


def count_offer(counts: OrderedDict[OffloadKey, int], keys: Sequence[OffloadKey],
                max_tracker_size: int) -> None:
    """The admission filter's tracker (``store_threshold >= 2``): one more offer for each of
    ``keys`` (each moved to the newest end), new keys counted 1; beyond ``max_tracker_size``
    the oldest entries are dropped, never a key of this offer (a new key that finds none to
    drop is not counted)."""
    offered = 0
    for key in keys:
        if key in counts:
            counts.move_to_end(key)
            counts[key] += 1
            offered += 1
    droppable = len(counts) - offered
    for key in keys:
        if key in counts:
            continue
        if len(counts) >= max_tracker_size:
            if droppable == 0:
                continue
            counts.popitem(last=False)
            droppable -= 1
        counts[key] = 1


class CPUOffloadingManager:
    """See the module docstring.

    Args:
        num_chunks: slots in the tier.
        cache_policy: ``"lru"`` or ``"arc"``.
        enable_events: keep events for ``take_events``.
        store_threshold: with 2 or more, a key is stored only once it has been offered that
            many times (counted in an LRU tracker of ``max_tracker_size`` keys).
        key_width: the byte length every key must have (None: any), e.g. 36 for a 32-byte
            hash and its group index.
    """

    medium = "CPU"

    def __init__(self, num_chunks: int, cache_policy: str = "lru", enable_events: bool = False,
                 store_threshold: int = 1, max_tracker_size: int = 64_000,
                 key_width: int | None = None) -> None:
        if type(num_chunks) is not int or num_chunks < 0:
            raise OffloadMisuseError(f"num_chunks={num_chunks!r}: the tier's size must be an "
                                     "int >= 0")
        if cache_policy not in CACHE_POLICIES:
            raise OffloadMisuseError(f"unknown cache_policy {cache_policy!r}: use one of "
                                     f"{sorted(CACHE_POLICIES)}")
        if type(store_threshold) is not int or store_threshold < 1 or max_tracker_size < 1:
            raise OffloadMisuseError(f"store_threshold={store_threshold!r}, max_tracker_size="
                                     f"{max_tracker_size!r}: both must be ints >= 1")
        self._num_chunks = num_chunks
        self._policy: CachePolicy = CACHE_POLICIES[cache_policy](num_chunks)
        self._key_width = key_width
        self.events: list[OffloadingEvent] | None = [] if enable_events else None
        self.store_threshold = store_threshold
        self.max_tracker_size = max_tracker_size
        # Offers per key, oldest first (the admission filter), when store_threshold >= 2.
        self.counts: OrderedDict[OffloadKey, int] | None = (
            OrderedDict() if store_threshold >= 2 else None)
        self._num_allocated = 0  # slots handed out at least once since the last reset
        self._free: list[int] = []  # slots given back, reused last in first out
        self._num_evictable = 0  # chunks with ref_cnt 0
        self._num_pending = 0  # chunks with ref_cnt -1
        self._generation = 0

    # --- checks ----------------------------------------------------------------------------

    def _check_keys(self, keys: Collection[OffloadKey], call: str) -> None:
        for key in keys:
            if not isinstance(key, bytes):
                raise OffloadMisuseError(f"{call}: key {key!r} is a {type(key).__name__}; keys "
                                         "are bytes (block hash + 4-byte group index)")
            if self._key_width is not None and len(key) != self._key_width:
                raise OffloadMisuseError(
                    f"{call}: key {key.hex()} is {len(key)} bytes; this tier's keys are "
                    f"{self._key_width} (a block hash and a 4-byte group index)")

    # --- chunk slots -----------------------------------------------------------------------

    def _num_free(self) -> int:
        return len(self._free) + self._num_chunks - self._num_allocated

    def _allocate(self, n: int) -> list[ChunkStatus]:
        fresh = min(n, self._num_chunks - self._num_allocated)
        chunks = [ChunkStatus(self._num_allocated + i) for i in range(fresh)]
        self._num_allocated += fresh
        chunks += [ChunkStatus(self._free.pop()) for _ in range(n - fresh)]
        return chunks

    # --- per-request accesses --------------------------------------------------------------

    def _access(self, req_context: ReqContext) -> _RequestAccess:
        state = req_context.get_state(_RequestAccess)
        if state is None or state.owner is not self or state.generation != self._generation:
            state = _RequestAccess(self, self._generation)
            req_context.set_state(state)
        return state

    def _record_access(self, keys: Collection[OffloadKey], req_context: ReqContext,
                       reused: Collection[OffloadKey] = ()) -> None:
        state = self._access(req_context)
        new = [key for key in dict.fromkeys(keys) if key not in state.seen]
        for key in new:
            state.key_groups.setdefault(get_offload_group_idx(key), []).append(key)
            state.seen.add(key)
        if new:
            self._policy.on_request_access(new, req_context)
        # Re-reading a chunk this request stored is not a second access.
        state.reused.update(key for key in reused if key not in state.inserted)

    def _check_open(self, keys: Collection[OffloadKey], req_context: ReqContext,
                    call: str) -> None:
        """No new key for a request after ``on_request_finished`` (vLLM asserts)."""
        state = self._access(req_context)
        if state.finished:
            new = next((key for key in keys if key not in state.seen), None)
            if new is not None:
                raise OffloadMisuseError(
                    f"{call}: request {req_context.req_id!r} finished (on_request_finished) "
                    f"but key {new.hex()} is new to it: no prepare_load or prepare_store "
                    "follows a request's end")

    def _count_offer(self, keys: list[OffloadKey]) -> None:
        assert self.counts is not None
        count_offer(self.counts, keys, self.max_tracker_size)

    # --- the OffloadingManager API ---------------------------------------------------------

    def on_new_request(self, req_context: ReqContext) -> None:
        self._access(req_context)

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        self._check_keys((key,), "lookup")
        chunk = self._policy.get(key)
        if chunk is None:
            return LookupResult.MISS
        return LookupResult.HIT if chunk.is_ready else LookupResult.HIT_PENDING

    def prepare_load(self, keys: Collection[OffloadKey],
                     req_context: ReqContext) -> LoadStoreSpec:
        self._check_keys(keys, "prepare_load")
        self._check_open(keys, req_context, "prepare_load")
        chunks = [self._policy.get(key) for key in keys]
        for key, chunk in zip(keys, chunks, strict=True):
            if chunk is None or not chunk.is_ready:
                state = "absent" if chunk is None else "still being written (ref_cnt -1)"
                raise OffloadMisuseError(
                    f"prepare_load: key {key.hex()} is {state}; only a key whose lookup is HIT "
                    "can be loaded")
        for key, chunk in zip(keys, chunks, strict=True):
            assert chunk is not None
            if chunk.ref_cnt == 0:
                self._policy.mark_non_evictable(key)
                self._num_evictable -= 1
            chunk.ref_cnt += 1
        self._record_access(keys, req_context, reused=keys)
        return LoadStoreSpec(tuple(chunk.chunk_id for chunk in chunks if chunk is not None))

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self._check_keys(keys, "touch")
        self._policy.touch(keys, req_context)

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self._check_keys(keys, "complete_load")
        pins: dict[OffloadKey, int] = {}
        for key in keys:
            pins[key] = pins.get(key, 0) + 1
            chunk = self._policy.get(key)
            if chunk is None or chunk.ref_cnt < pins[key]:
                raise OffloadMisuseError(
                    f"complete_load: key {key.hex()} has no load in flight (ref_cnt "
                    f"{None if chunk is None else chunk.ref_cnt}); complete only what "
                    "prepare_load pinned, once")
        for key in keys:
            chunk = self._policy.get(key)
            assert chunk is not None
            chunk.ref_cnt -= 1
            if chunk.ref_cnt == 0:
                self._num_evictable += 1
                self._policy.mark_evictable(key)

    def prepare_store(self, keys: Collection[OffloadKey],
                      req_context: ReqContext) -> PrepareStoreOutput | None:
        keys = list(keys)
        self._check_keys(keys, "prepare_store")
        if len(set(keys)) != len(keys):
            twice = next(key for key in keys if keys.count(key) > 1)
            raise OffloadMisuseError(f"prepare_store: key {twice.hex()} is offered twice in one "
                                     "call; an offer lists each key once")
        self._check_open(keys, req_context, "prepare_store")
        if self.counts is not None:
            self._count_offer(keys)
        to_store: list[OffloadKey] = []
        ready: list[OffloadKey] = []
        for key in keys:
            chunk = self._policy.get(key)
            if chunk is None:
                to_store.append(key)
            elif chunk.is_ready:
                ready.append(key)
        if self.counts is not None:
            counts = self.counts
            to_store = [key for key in to_store if counts.get(key, 0) >= self.store_threshold]
        state = self._access(req_context)
        misses = [key for key in to_store if key not in state.store_missed]
        if misses:
            # Before insert() takes the keys out of ARC's ghost lists; once per request.
            self._policy.on_store_miss(misses, req_context)
            state.store_missed.update(misses)
        recorded = set(to_store) | set(ready)
        self._record_access([key for key in keys if key in recorded], req_context, reused=ready)
        if not to_store:
            return PrepareStoreOutput([], LoadStoreSpec(()), [])

        deficit = len(to_store) - self._num_free()
        evicted: list[OffloadKey] = []
        if deficit > 0:
            if deficit > self._num_evictable:
                return None
            victims = self._policy.evict(deficit, set(keys))
            if victims is None:
                return None
            self._num_evictable -= len(victims)
            for key, chunk in victims:
                self._free.append(chunk.chunk_id)
                evicted.append(key)
            if self.events is not None:
                self.events.append(OffloadingEvent(evicted, self.medium, removed=True))
        chunks = self._allocate(len(to_store))
        for key, chunk in zip(to_store, chunks, strict=True):
            self._policy.insert(key, chunk, req_context)
        self._num_pending += len(to_store)
        state.inserted.update(to_store)
        return PrepareStoreOutput(to_store, LoadStoreSpec(tuple(c.chunk_id for c in chunks)),
                                  evicted)

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext,
                       success: bool = True) -> None:
        self._check_keys(keys, "complete_store")
        for key in keys:
            chunk = self._policy.get(key)
            if chunk is None or chunk.is_ready:
                state = "absent" if chunk is None else f"ready (ref_cnt {chunk.ref_cnt})"
                raise OffloadMisuseError(
                    f"complete_store: key {key.hex()} is {state}, not being written; complete "
                    "only the keys_to_store of a prepare_store, once")
        done: list[OffloadKey] = []
        for key in dict.fromkeys(keys):
            chunk = self._policy.get(key)
            assert chunk is not None
            self._num_pending -= 1
            if success:
                chunk.ref_cnt = 0
                self._num_evictable += 1
                self._policy.mark_evictable(key)
            else:
                self._policy.remove(key)
                self._free.append(chunk.chunk_id)
            done.append(key)
        if done and self.events is not None:
            self.events.append(OffloadingEvent(done, self.medium, removed=not success,
                                               metadata_only=not success))

    def on_request_finished(self, req_context: ReqContext) -> None:
        state = req_context.get_state(_RequestAccess)
        if (state is None or state.owner is not self or state.generation != self._generation
                or state.finished):
            return
        state.finished = True
        key_groups = []
        for group_idx in sorted(state.key_groups):
            keys = state.key_groups[group_idx]
            positions = [req_context.get_offload_key_position(key) for key in keys]
            if None not in positions:
                ends = [p for p in positions if p is not None]
                keys = [keys[i] for i in sorted(range(len(keys)), key=ends.__getitem__)]
            key_groups.append(tuple(keys))
        self._policy.on_request_finished(tuple(key_groups), state.inserted - state.reused,
                                         state.reused, req_context)

    def reset_cache(self) -> None:
        """Drop every chunk (pinned and pending ones too: vLLM's scheduler never completes a
        job of before the reset). The admission tracker and undrained events stay."""
        self._policy.clear()
        self._generation += 1
        self._num_evictable = self._num_pending = 0
        self._free.clear()
        self._num_allocated = 0

    def take_events(self) -> Iterator[OffloadingEvent]:
        """The events since the last call, oldest first. A failed store's removal names only
        the keys still absent (a retry may have stored one again since)."""
        if self.events is None:
            return
        events, self.events = self.events, []
        for event in events:
            if not event.metadata_only:
                yield event
                continue
            keys = [key for key in event.keys if self._policy.get(key) is None]
            if keys:
                yield replace(event, keys=keys)
