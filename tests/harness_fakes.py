"""Tiny fake KV-cache managers for the harness's own tests (``tests/conformance/
test_harness_*.py``), importable because pyproject sets ``pythonpath = ["tests"]``.

``FakeManager`` is a correct, minimal design in vLLM's shape: a free queue (new blocks from the
head, freed blocks appended last block first), reference counts, and a prefix cache keyed by
the request's whole token prefix (plus LoRA and cache salt), evicted when a cached block is
handed out anew. Each subclass below breaks one rule of the protocol, so a harness test can
check that exactly the intended law (or observation) catches it.

``handle(cls)`` wraps a manager class in a real ``ImplHandle`` without going through the
loader (no import, no probe), so the Driver, the guard and ``Pair`` see it as they would see a
loaded implementation. This module is also a loadable implementation itself (``IMPL_INFO``,
``make_kv_cache_manager``), so a repro snippet naming ``harness_fakes`` replays.
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Any

from kvcheck.conformance.loader import ImplHandle
from kvcheck.conformance.protocol import ImplInfo, KVCacheSpec, RequestView

#: Eight blocks of four tokens; ``generic`` reserves no block, so all eight are ordinary.
SPEC = KVCacheSpec(num_blocks=8, block_size=4, profile="generic")

#: Every capability the fakes implement.
ALL_CAPS = frozenset({"manager", "prefix_caching", "reset_prefix_cache", "free_queue_order",
                      "ref_counts", "block_hashes", "events", "slot_mapping"})

IMPL_INFO = ImplInfo(name="fake", version="0", capabilities=ALL_CAPS, profile="generic",
                     hash_algos=())


class FakeManager:
    """A correct ``KVCacheManagerAdapter`` with every observation but ``check_invariants``."""

    def __init__(self, spec: KVCacheSpec) -> None:
        self.spec = spec
        self.bs = spec.block_size
        self.free_queue: list[int] = list(range(spec.num_blocks))  # head first
        self.ref: dict[int, int] = {}
        self.tables: dict[str, list[int]] = {}
        self.cache: dict[tuple[Any, ...], int] = {}  # prefix key -> block id
        self.block_key: dict[int, tuple[Any, ...]] = {}  # block id -> its prefix key
        self.events: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ hooks for the bugs
    def _key(self, view: RequestView, index: int) -> tuple[Any, ...]:
        """The cache key of ``view``'s block ``index``: its context and whole prefix."""
        end = (index + 1) * self.bs
        return (view.lora, view.cache_salt, view.token_ids[:end])

    def _max_hit_blocks(self, view: RequestView) -> int:
        return (view.num_tokens - 1) // self.bs  # the last token is always recomputed

    def _num_hit_tokens(self, view: RequestView, hits: list[int]) -> int:
        return len(hits) * self.bs

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.bs)

    def _take_hit(self, block_id: int) -> None:
        if self.ref.get(block_id, 0) == 0:
            self.free_queue.remove(block_id)
        self.ref[block_id] = self.ref.get(block_id, 0) + 1

    def _pop_free(self) -> int:
        block_id = self.free_queue.pop(0)
        self._evict(block_id)
        return block_id

    def _evict(self, block_id: int) -> None:
        key = self.block_key.pop(block_id, None)
        if key is not None and self.cache.get(key) == block_id:
            del self.cache[key]

    def _release(self, table: list[int]) -> None:
        for block_id in reversed(table):  # last block first: the tail is evicted first
            self.ref[block_id] -= 1
            if self.ref[block_id] == 0:
                self.free_queue.append(block_id)

    # ------------------------------------------------------------------ the manager
    def get_computed_blocks(self, request: RequestView) -> tuple[list[int], int]:
        if not self.spec.enable_caching or request.skip_reading_prefix_cache:
            return [], 0
        hits: list[int] = []
        for index in range(self._max_hit_blocks(request)):
            block_id = self.cache.get(self._key(request, index))
            if block_id is None:
                break
            hits.append(block_id)
        return hits, self._num_hit_tokens(request, hits)

    def allocate_slots(self, request: RequestView, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_block_ids: Sequence[int] = (),
                       num_lookahead_tokens: int = 0) -> list[int] | None:
        rid = request.request_id
        hits = list(new_computed_block_ids)
        table = self.tables.get(rid, [])
        computed = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        need = max(0, self._blocks_for(computed + num_lookahead_tokens) - len(table) - len(hits))
        evictable = sum(1 for b in hits if self.ref.get(b, 0) == 0)
        if need + evictable > len(self.free_queue):
            return self._short(rid, need)
        for block_id in hits:
            self._take_hit(block_id)
        new = [self._pop_free() for _ in range(need)]
        for block_id in new:
            self.ref[block_id] = 1
        table = self.tables[rid] = table + hits + new
        if self.spec.enable_caching:
            for index in range(min(computed // self.bs, len(table))):
                key = self._key(request, index)
                if key not in self.cache and table[index] not in self.block_key:
                    self.cache[key] = table[index]
                    self.block_key[table[index]] = key
                    if self.spec.enable_kv_cache_events:
                        self.events.append({"type": "BlockStored", "block_ids": (table[index],)})
        return new

    def _short(self, request_id: str, need: int) -> list[int] | None:
        """The pool cannot serve ``need`` blocks: no state change at all."""
        return None

    def free(self, request_id: str) -> None:
        self._release(self.tables.pop(request_id, []))

    def get_block_ids(self, request_id: str) -> list[int]:
        return list(self.tables.get(request_id, []))

    def reset_prefix_cache(self) -> bool:
        if any(self.ref.values()):
            return False
        self.cache.clear()
        self.block_key.clear()
        return True

    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    # ------------------------------------------------------------------ observations
    def free_block_ids(self) -> list[int]:
        return list(self.free_queue)

    def ref_cnt(self, block_id: int) -> int:
        return self.ref.get(block_id, 0)

    def block_hashes(self, request_id: str) -> list[bytes]:
        """One made-up hash per cached block of the table: ``b"h<block id>"``."""
        return [b"h%d" % b for b in self.tables.get(request_id, []) if b in self.block_key]

    def take_events(self) -> list[dict[str, Any]]:
        events, self.events = self.events, []
        return events

    def slot_mapping(self, request_id: str, start: int, end: int) -> list[int]:
        table = self.tables[request_id]
        return [table[p // self.bs] * self.bs + p % self.bs for p in range(start, end)]


# ---------------------------------------------------------------------- one bug each
class LeakOnFree(FakeManager):
    """Bug: ``free`` drops the request's last block on the floor (neither free nor held)."""

    def _release(self, table: list[int]) -> None:
        super()._release(table)
        if table and self.ref[table[-1]] == 0:
            self.free_queue.remove(table[-1])


class FloorBlocks(FakeManager):
    """Bug: rounds the blocks a request needs down, so a partial last block gets none."""

    def _blocks_for(self, num_tokens: int) -> int:
        return num_tokens // self.bs


class FreesSharedBlocks(FakeManager):
    """Bug: ``free`` returns every block to the free queue, even one another request still
    holds as a cache hit."""

    def _release(self, table: list[int]) -> None:
        for block_id in reversed(table):
            self.ref[block_id] -= 1
            if block_id not in self.free_queue:
                self.free_queue.append(block_id)


class RefCountIgnoresHits(FakeManager):
    """Bug: a cache hit on a block that is in use does not raise its reference count."""

    def _take_hit(self, block_id: int) -> None:
        if self.ref.get(block_id, 0) == 0:
            self.free_queue.remove(block_id)
        self.ref[block_id] = 1


class PartialThenNone(FakeManager):
    """Bug: when the pool is short, takes what it can into the table, then returns None."""

    def _short(self, request_id: str, need: int) -> list[int] | None:
        taken = [self._pop_free() for _ in range(len(self.free_queue))]
        for block_id in taken:
            self.ref[block_id] = 1
        self.tables[request_id] = self.tables.get(request_id, []) + taken
        return None


class HitsWholePrompt(FakeManager):
    """Bug: a fully cached request hits all of its tokens (the last one must be recomputed)."""

    def _max_hit_blocks(self, view: RequestView) -> int:
        return view.num_tokens // self.bs


class HitCapInTokens(FakeManager):
    """Bug: caps the hit at ``num_tokens - 1`` tokens instead of dropping the last block, so
    the hit ends mid-block."""

    def _max_hit_blocks(self, view: RequestView) -> int:
        return view.num_tokens // self.bs

    def _num_hit_tokens(self, view: RequestView, hits: list[int]) -> int:
        return min(len(hits) * self.bs, view.num_tokens - 1)


class ContentOnlyKey(FakeManager):
    """Bug: the cache key is the block's own tokens, not the chain of the whole prefix."""

    def _key(self, view: RequestView, index: int) -> tuple[Any, ...]:
        start = index * self.bs
        return (view.lora, view.cache_salt, view.token_ids[start:start + self.bs])


class StaleCache(FakeManager):
    """Bug: a cached block handed out anew keeps its cache entry (stale hits after reuse)."""

    def _evict(self, block_id: int) -> None:
        pass


class LifoBlocks(FakeManager):
    """A different (lawful) design: new blocks come from the tail of the free queue."""

    def _pop_free(self) -> int:
        block_id = self.free_queue.pop()
        self._evict(block_id)
        return block_id


class ForwardFree(FakeManager):
    """A different (lawful) design: freed blocks go back first block first."""

    def _release(self, table: list[int]) -> None:
        for block_id in table:
            self.ref[block_id] -= 1
            if self.ref[block_id] == 0:
                self.free_queue.append(block_id)


class NoCaching(FakeManager):
    """A different (lawful) design: never finds a hit."""

    def get_computed_blocks(self, request: RequestView) -> tuple[list[int], int]:
        return [], 0


def make_kv_cache_manager(spec: KVCacheSpec) -> FakeManager:
    """The loadable factory (``--kv-impl=harness_fakes``): the correct fake."""
    return FakeManager(spec)


def handle(cls: type[FakeManager] = FakeManager, *, name: str = "fake",
           caps: frozenset[str] = ALL_CAPS, hash_algos: tuple[str, ...] = (),
           reserved: tuple[int, ...] | None = None) -> ImplHandle:
    """A real ``ImplHandle`` over ``cls`` (guarded managers, no call limit), built directly.

    ``target`` is ``harness_fakes``: a repro snippet replays the *correct* fake, whatever
    ``cls`` is (enough for the tests that execute one)."""
    info = ImplInfo(name=name, version="0", capabilities=caps, profile="generic",
                    hash_algos=hash_algos, reserved_block_ids=reserved)
    return ImplHandle(name=name, target="harness_fakes", module=types.ModuleType(name),
                      info=info, factory=cls, pool_factory=None, call_timeout=None)
