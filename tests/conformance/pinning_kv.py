"""pinning_kv: a tiny prefix cache whose lookups pin their hits and whose ref counts count the
cache's own reference, the two conventions of radix / trie caches that kvcheck's generic
profile accepts when declared (``pinning_lookup``, ``ImplInfo.ref_cnt_counts_cache``; issue 24
items 5 and 6). An independent design, not vLLM's:

* every block carries one reference count: one per request holding it, one per lookup pinning
  it, and one for the cache while the block is cached (so a cached block nobody uses has
  ref_cnt 1 and is *evictable*: counted by ``num_free_blocks``, handed out once the uncached
  free blocks are gone, least recently released first);
* ``get_computed_blocks`` pins each hit (a reference, and out of the evictable list, as a
  radix tree locks the matched nodes); the next ``allocate_slots`` of the request turns the
  pins into its references (a refusal keeps them), ``release_computed`` drops them;
* a request's full computed blocks are cached as soon as ``allocate_slots`` returns; a block
  whose content is already cached under another block stays private (no dedup);
* its own chained key (blake2b over the parent key, the tokens and the multimodal items of the
  block; the root is the LoRA and the cache salt); no reserved block: ids ``0..num_blocks-1``.

``tests/conformance/mut_pin_leak.py`` is the same design with one bug (``release_computed``
forgets the references).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import Counter, OrderedDict, deque
from collections.abc import Sequence

from kvcheck.conformance.protocol import ImplInfo, KVCacheSpec, RequestView

__all__ = ["IMPL_INFO", "PinningManager", "make_kv_cache_manager"]

IMPL_INFO = ImplInfo(
    name="pinning_kv",
    version="0.1.0",
    capabilities=frozenset({"manager", "prefix_caching", "ref_counts", "free_queue_order",
                            "pinning_lookup", "caches_running_requests", "lookahead",
                            "multi_token_decode"}),
    profile="generic",
    hash_algos=(),
    ref_cnt_counts_cache=True,
)


class PinningManager:
    """The ``KVCacheManagerAdapter`` surface plus ``release_computed``, ``ref_cnt`` and
    ``free_block_ids``."""

    def __init__(self, spec: KVCacheSpec) -> None:
        n = spec.num_blocks
        self.block_size = spec.block_size
        self.caching = spec.enable_caching
        self.ref = [0] * n  # requests + pins + the cache's own reference
        self.key: list[bytes | None] = [None] * n  # the key a cached block is found by
        self.cache: dict[bytes, int] = {}
        self.free_list: deque[int] = deque(range(n))  # ref 0: neither used nor cached
        self.evictable: OrderedDict[int, None] = OrderedDict()  # cached, ref 1 (the cache's)
        self.tables: dict[str, list[int]] = {}
        self.pins: dict[str, list[int]] = {}  # request id -> blocks its lookup pinned

    # ------------------------------------------------------------------ references
    def _take(self, block_id: int) -> None:
        self.evictable.pop(block_id, None)  # in use: no longer evictable
        self.ref[block_id] += 1

    def _drop(self, block_id: int) -> None:
        self.ref[block_id] -= 1
        if self.ref[block_id] == 0:
            self.free_list.append(block_id)
        elif self.ref[block_id] == 1 and self.key[block_id] is not None:
            self.evictable[block_id] = None  # only the cache holds it

    def _keys(self, view: RequestView, num_blocks: int) -> list[bytes]:
        """The chained keys of ``view``'s first ``num_blocks`` full blocks."""
        bs = self.block_size
        parent = hashlib.blake2b(repr((view.lora, view.cache_salt)).encode(),
                                 digest_size=16).digest()
        tokens = view.token_ids
        keys = []
        for i in range(num_blocks):
            start, end = i * bs, (i + 1) * bs
            mm = [(ident, off - start) for ident, off, length in view.mm_features
                  if off < end and off + length > start]
            parent = hashlib.blake2b(parent + array("q", tokens[start:end]).tobytes()
                                     + repr(mm).encode(), digest_size=16).digest()
            keys.append(parent)
        return keys

    # ------------------------------------------------------------------ the protocol
    def get_computed_blocks(self, request: RequestView) -> tuple[list[int], int]:
        """The longest cached prefix (at most num_tokens - 1 tokens), each hit pinned."""
        hits: list[int] = []
        if self.caching:
            for key in self._keys(request, (request.num_tokens - 1) // self.block_size):
                block_id = self.cache.get(key)
                if block_id is None:
                    break
                hits.append(block_id)
        for block_id in hits:
            self._take(block_id)
        self.pins[request.request_id] = hits
        return list(hits), len(hits) * self.block_size

    def release_computed(self, request_id: str) -> None:
        for block_id in self.pins.pop(request_id, []):
            self._drop(block_id)

    def allocate_slots(self, request: RequestView, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_block_ids: Sequence[int] = (),
                       num_lookahead_tokens: int = 0) -> list[int] | None:
        rid = request.request_id
        hits = list(new_computed_block_ids)
        table = self.tables.get(rid, [])
        pinned = Counter(self.pins.get(rid, ()))
        unpinned = [b for b in hits if not pinned[b]]
        computed = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        need = max(0, -(-(computed + num_lookahead_tokens) // self.block_size)
                   - len(table) - len(hits))
        # Hits not pinned by a lookup come out of the evictable blocks when taken.
        available = (len(self.free_list) + len(self.evictable)
                     - sum(1 for b in set(unpinned) if b in self.evictable))
        if need > available:
            return None  # nothing changed; a lookup's pins stay until release_computed
        self.pins.pop(rid, None)
        for block_id in hits:  # the pins become the request's references
            if pinned[block_id]:
                pinned[block_id] -= 1
            else:
                self._take(block_id)
        for block_id in pinned.elements():  # looked up but not passed: unpinned
            self._drop(block_id)
        new = [self._new_block() for _ in range(need)]
        table = self.tables[rid] = table + hits + new
        if self.caching:
            full = min(computed, request.num_tokens) // self.block_size
            for index, key in enumerate(self._keys(request, full)):
                block_id = table[index]
                if self.key[block_id] is None and key not in self.cache:
                    self.cache[key] = block_id
                    self.key[block_id] = key
                    self.ref[block_id] += 1  # the cache's own reference
        return new

    def _new_block(self) -> int:
        if self.free_list:
            block_id = self.free_list.popleft()
        else:  # evict the least recently released cached block
            block_id, _ = self.evictable.popitem(last=False)
            key = self.key[block_id]
            assert key is not None
            del self.cache[key]
            self.key[block_id] = None
            self.ref[block_id] = 0
        self.ref[block_id] = 1
        return block_id

    def free(self, request_id: str) -> None:
        self.release_computed(request_id)
        for block_id in reversed(self.tables.pop(request_id, [])):
            self._drop(block_id)

    def get_block_ids(self, request_id: str) -> list[int]:
        return list(self.tables.get(request_id, []))

    def num_free_blocks(self) -> int:
        return len(self.free_list) + len(self.evictable)

    def free_block_ids(self) -> list[int]:
        """Allocation order: the uncached free blocks, then the evictable ones, LRU first."""
        return [*self.free_list, *self.evictable]

    def ref_cnt(self, block_id: int) -> int:
        return self.ref[block_id]


def make_kv_cache_manager(spec: KVCacheSpec) -> PinningManager:
    return PinningManager(spec)
