"""The offload tier's building blocks: keys, chunks, the per-request context and the cache
policy interface, as vLLM 0.33's ``v1/kv_offload/base.py`` and ``cpu/policies/base.py`` define
them (docs/semantics.md#the-offload-tier).

An offloaded block is named by an ``OffloadKey``: the block hash followed by its KV-cache group
index as 4 big-endian bytes. Its storage is a *chunk* (one slot of the CPU buffer) with a
reference count: ``-1`` while its write is pending (not readable), ``0`` ready and evictable,
``n > 0`` pinned by ``n`` loads.

A ``CachePolicy`` organises the chunks and chooses victims (``offload_lru.LRUCachePolicy``,
``offload_arc.ARCCachePolicy``); the manager (``offload_manager.CPUOffloadingManager``) owns the
reference counts, the chunk pool and the events.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

__all__ = ["GROUP_IDX_BYTES", "CachePolicy", "ChunkStatus", "OffloadKey", "ReqContext",
           "get_offload_group_idx", "make_offload_key", "order_request_keys"]

#: An offloaded block's name: ``block_hash + group_idx.to_bytes(4, "big")``.
OffloadKey = bytes
#: Width of the group index at the end of every key.
GROUP_IDX_BYTES = 4

_T = TypeVar("_T")


def make_offload_key(block_hash: bytes, group_idx: int) -> OffloadKey:
    """``block_hash`` followed by ``group_idx`` as 4 big-endian unsigned bytes."""
    return bytes(block_hash) + group_idx.to_bytes(GROUP_IDX_BYTES, "big", signed=False)


def get_offload_group_idx(key: OffloadKey) -> int:
    """The KV-cache group index a key ends with."""
    return int.from_bytes(key[-GROUP_IDX_BYTES:], "big", signed=False)


class ChunkStatus:
    """One chunk of the tier: its slot (``chunk_id``) and its reference count (``ref_cnt``:
    -1 write pending, 0 ready, n > 0 pinned by n loads). New chunks start pending."""

    __slots__ = ("chunk_id", "ref_cnt")

    def __init__(self, chunk_id: int) -> None:
        self.chunk_id = chunk_id
        self.ref_cnt = -1

    @property
    def is_ready(self) -> bool:
        """Readable: the write completed (``ref_cnt >= 0``)."""
        return self.ref_cnt >= 0

    def __repr__(self) -> str:
        return f"ChunkStatus(chunk_id={self.chunk_id}, ref_cnt={self.ref_cnt})"


class ReqContext:
    """What the scheduler knows about one request, passed with every call for it.

    ``set_offload_key_position(key, end_token)`` records where a key's block ends in the
    request (in tokens); the policies order a request's keys by it (tail before head). Each
    component keeps its own per-request scratch state here, keyed by type (``set_state``).
    """

    __slots__ = ("_positions", "_state", "req_id")

    def __init__(self, req_id: str) -> None:
        self.req_id = req_id
        self._positions: dict[OffloadKey, int] = {}
        # Any: each value keyed by its own type (set_state), so get_state(cls) reads a cls; a
        # cast there would cost a call on every policy operation.
        self._state: dict[type, Any] = {}

    def set_offload_key_position(self, key: OffloadKey, end_token: int) -> None:
        self._positions[key] = end_token

    def get_offload_key_position(self, key: OffloadKey) -> int | None:
        return self._positions.get(key)

    def set_state(self, value: object) -> None:
        self._state[type(value)] = value

    def get_state(self, cls: type[_T]) -> _T | None:
        state: _T | None = self._state.get(cls)
        return state


def order_request_keys(key_groups: Sequence[Sequence[OffloadKey]],
                       req_context: ReqContext) -> list[OffloadKey]:
    """A request's keys head to tail: the groups concatenated, then sorted by end position
    (stable) when every key has one; otherwise left in group order."""
    keys = [key for group in key_groups for key in group]
    positions = [req_context.get_offload_key_position(key) for key in keys]
    ends = [p for p in positions if p is not None]
    if len(ends) != len(keys):
        return keys
    order = sorted(range(len(keys)), key=ends.__getitem__)
    return [keys[i] for i in order]


class CachePolicy(ABC):
    """How chunks are organised and which are evicted. The manager calls it; it never touches
    reference counts except through the ``ChunkStatus`` objects it holds.

    Contract of ``evict(n, protected)``: exactly ``n`` chunks with ``ref_cnt == 0`` whose keys
    are not in ``protected``, removed and returned as ``(key, chunk)``; or None, with no state
    changed, when fewer than ``n`` qualify.
    """

    def __init__(self, cache_capacity: int) -> None:
        self.cache_capacity = cache_capacity

    @abstractmethod
    def get(self, key: OffloadKey) -> ChunkStatus | None:
        """The chunk of ``key``, or None."""

    @abstractmethod
    def insert(self, key: OffloadKey, chunk: ChunkStatus, req_context: ReqContext) -> None:
        """Track a newly allocated (pending) chunk, stored for ``req_context``'s request."""

    @abstractmethod
    def remove(self, key: OffloadKey) -> None:
        """Forget a chunk whose store failed."""

    @abstractmethod
    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        """Mark ``keys`` (head to tail) recently used."""

    @abstractmethod
    def evict(self, n: int,
              protected: set[OffloadKey]) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        """See the class docstring."""

    @abstractmethod
    def clear(self) -> None:
        """Forget every chunk, and any adaptive state."""

    def on_store_miss(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        """Keys about to be stored (absent now), once per request: a touch by default."""
        self.touch(keys, req_context)

    def on_request_access(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        """Keys a request reads or stores, the first time it does (no frequency counted)."""
        return

    def on_request_finished(self, key_groups: Sequence[Sequence[OffloadKey]],
                            insertion_only_keys: set[OffloadKey], reused_keys: set[OffloadKey],
                            req_context: ReqContext) -> None:
        """The request's accesses, committed once: ``key_groups`` per KV-cache group (head to
        tail), which keys it only inserted and which ready chunks it reused. By default one
        touch per group."""
        del insertion_only_keys, reused_keys
        for keys in key_groups:
            self.touch(keys, req_context)

    def mark_evictable(self, key: OffloadKey) -> None:
        """``key``'s reference count became 0."""
        return

    def mark_non_evictable(self, key: OffloadKey) -> None:
        """``key``'s reference count left 0 (a load pinned it)."""
        return
