"""finish_kv: a block trie that caches a request's blocks only when it finishes, in the style of
LMDeploy's ``BlockTrie`` over an LRU block pool, for large blocks only, written for kvcheck's
``--kv-profile=generic`` (``pytest --kv-impl=finish_kv --kv-profile=generic`` with this folder on
``PYTHONPATH``). An independent design, not vLLM's:

* **large blocks**: 256 or 512 tokens a block, as an engine with fixed attention-kernel tiles
  has (``IMPL_INFO.block_sizes``); the factory declines any other size (``UnsupportedSpec``);
* **insert at finish**: a running request's blocks are never looked up by another request
  (no ``caches_running_requests``); ``free`` (the request finished or was preempted) walks the
  trie along its full computed blocks and adds each block the trie lacks; where the trie
  already holds that content in another block, the trie's block stays (first inserted wins),
  the request's copy is released uncached and the walk goes on below the trie's block;
* **the trie**: one node per cached block, children keyed by their block's tokens, one root
  (no LoRA or salt namespaces: none declared); a lookup walks it through at most
  ``(num_tokens - 1) // block_size`` blocks and has no side effects (``allocate_slots`` takes
  the hits);
* **reference counts** in vLLM's convention (``ref_cnt_counts_cache=False``): the requests
  holding a block; the trie holds none, so a cached block nobody holds has ref_cnt 0 and is
  evictable;
* **eviction**: uncached free blocks first (freed blocks to the tail, last block first), then
  the least recently released cached leaf (a trie node without children: a node is evicted
  only after its children); ``free_block_ids`` lists that order.

``make_impl_info`` builds variants of ``IMPL_INFO`` (other declared sizes or pool limits,
another capability) that ``tests/plugin/test_declared_sizes.py`` loads in its place; the
factory honours the module's ``IMPL_INFO`` at the time it is called.

The mutants in this folder (``mut_finish_*.py``) subclass ``FinishManager`` with one bug each.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Sequence

from kvcheck.conformance.protocol import ImplInfo, KVCacheSpec, RequestView, UnsupportedSpec

__all__ = ["BLOCK_SIZES", "CAPABILITIES", "IMPL_INFO", "FinishManager", "make_impl_info",
           "make_kv_cache_manager"]

#: The block sizes (tokens) the design supports.
BLOCK_SIZES = (256, 512)
#: No design capability: in particular not caches_running_requests.
CAPABILITIES = frozenset({"manager", "prefix_caching", "ref_counts", "free_queue_order"})


def make_impl_info(block_sizes: tuple[int, ...] | None = BLOCK_SIZES,
                   num_blocks_range: tuple[int, int] | None = None,
                   extra: frozenset[str] = frozenset()) -> ImplInfo:
    """``IMPL_INFO`` with other declared sizes and ``extra`` capabilities."""
    return ImplInfo(name="finish_kv", version="0.1.0", capabilities=CAPABILITIES | extra,
                    profile="generic", hash_algos=(), block_sizes=block_sizes,
                    num_blocks_range=num_blocks_range)


IMPL_INFO = make_impl_info()


class TrieNode:
    """One cached block: its tokens (``key``), id, parent and children."""

    __slots__ = ("block_id", "children", "key", "parent")

    def __init__(self, block_id: int, key: tuple[int, ...], parent: TrieNode | None) -> None:
        self.block_id = block_id
        self.key = key
        self.parent = parent
        self.children: dict[tuple[int, ...], TrieNode] = {}


class FinishManager:
    """The ``KVCacheManagerAdapter`` surface plus ``ref_cnt`` and ``free_block_ids``."""

    def __init__(self, spec: KVCacheSpec) -> None:
        if spec.kv_cache_groups or not IMPL_INFO.supports(spec):
            raise UnsupportedSpec(f"finish_kv supports one KV-cache group, block sizes "
                                  f"{IMPL_INFO.block_sizes} and pools of "
                                  f"{IMPL_INFO.num_blocks_range or 'any number of'} blocks, "
                                  f"not {spec.block_size} and {spec.num_blocks}")
        self.block_size = spec.block_size
        self.ref = [0] * spec.num_blocks  # the requests holding each block
        self.free_list: deque[int] = deque(range(spec.num_blocks))  # uncached, unused
        self.root = TrieNode(-1, (), None)
        self.node_of: dict[int, TrieNode] = {}  # a cached block -> its trie node
        # When each cached block nobody holds was released: (tick, order within the free).
        self.released: dict[int, tuple[int, int]] = {}
        self._clock = itertools.count(1)
        self.tables: dict[str, list[int]] = {}
        # The tokens each running request has computed (through its last allocate_slots):
        # free() caches their full blocks.
        self.computed: dict[str, tuple[int, ...]] = {}

    # ------------------------------------------------------------------ lookup
    def _blocks_of(self, tokens: Sequence[int], count: int) -> list[tuple[int, ...]]:
        bs = self.block_size
        return [tuple(tokens[i * bs:(i + 1) * bs]) for i in range(count)]

    def get_computed_blocks(self, request: RequestView) -> tuple[list[int], int]:
        """The cached blocks of the longest prefix, at most ``num_tokens - 1`` tokens."""
        node, ids = self.root, []
        for key in self._blocks_of(request.token_ids,
                                   (request.num_tokens - 1) // self.block_size):
            child = node.children.get(key)
            if child is None:
                break
            ids.append(child.block_id)
            node = child
        return ids, len(ids) * self.block_size

    # ------------------------------------------------------------------ allocation
    def allocate_slots(self, request: RequestView, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_block_ids: Sequence[int] = (),
                       num_lookahead_tokens: int = 0) -> list[int] | None:
        rid = request.request_id
        table = self.tables.get(rid, [])
        hits = list(new_computed_block_ids)
        end = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        need = max(0, -(-(end + num_lookahead_tokens) // self.block_size)
                   - len(table) - len(hits))
        free_hits = len({b for b in hits if self.ref[b] == 0})
        if need > self.num_free_blocks() - free_hits:
            return None
        for block_id in hits:
            if self.ref[block_id] == 0:
                self._reuse(block_id)
            self.ref[block_id] += 1
        new = [self._new_block() for _ in range(need)]
        self.tables[rid] = table + hits + new
        self.record_computed(request, end)
        return new

    def record_computed(self, request: RequestView, end: int) -> None:
        """The request has computed its tokens ``[0, end)`` (cached from these at free)."""
        self.computed[request.request_id] = request.token_ids[:end]

    def _reuse(self, block_id: int) -> None:
        """An unused block is taken: out of the free list, or of the evictable blocks."""
        if block_id in self.node_of:
            del self.released[block_id]
        else:
            self.free_list.remove(block_id)

    def _new_block(self) -> int:
        if self.free_list:
            block_id = self.free_list.popleft()
        else:  # evict the least recently released cached leaf
            block_id = self._eviction_order()[0]
            node = self.node_of.pop(block_id)
            assert node.parent is not None and not node.children
            del node.parent.children[node.key]
            del self.released[block_id]
        self.ref[block_id] = 1
        return block_id

    def _eviction_order(self) -> list[int]:
        """The cached blocks nobody holds, least recently released leaf first (a node after
        its children)."""
        left = {b: len(self.node_of[b].children) for b in self.released}
        heap = [(self.released[b], b) for b, n in left.items() if n == 0]
        heapq.heapify(heap)
        order = []
        while heap:
            _, block_id = heapq.heappop(heap)
            order.append(block_id)
            parent = self.node_of[block_id].parent
            if parent is not None and parent.block_id in left:
                left[parent.block_id] -= 1
                if left[parent.block_id] == 0:
                    heapq.heappush(heap, (self.released[parent.block_id], parent.block_id))
        return order

    def free(self, request_id: str) -> None:
        """Cache the request's full computed blocks the trie lacks, then release its blocks,
        last first."""
        table = self.tables.pop(request_id, None)
        if table is None:
            return
        tokens = self.computed.pop(request_id)
        node = self.root
        for index, key in enumerate(self._blocks_of(tokens, self.num_full_blocks(tokens, table))):
            child = node.children.get(key)
            if child is None:
                block_id = table[index]
                assert block_id not in self.node_of, f"block {block_id} is cached elsewhere"
                child = node.children[key] = TrieNode(block_id, key, node)
                self.node_of[block_id] = child
            node = child
        tick = next(self._clock)
        for order, block_id in enumerate(reversed(table)):
            self.ref[block_id] -= 1
            if self.ref[block_id] == 0:
                if block_id in self.node_of:
                    self.released[block_id] = (tick, order)
                else:
                    self.free_list.append(block_id)

    def num_full_blocks(self, tokens: Sequence[int], table: Sequence[int]) -> int:
        """How many leading blocks of ``table`` hold ``block_size`` computed tokens
        (``tokens``): the blocks ``free`` caches."""
        return min(len(tokens) // self.block_size, len(table))

    # ------------------------------------------------------------------ observations
    def get_block_ids(self, request_id: str) -> list[int]:
        return list(self.tables.get(request_id, ()))

    def num_free_blocks(self) -> int:
        return len(self.free_list) + len(self.released)

    def free_block_ids(self) -> list[int]:
        return [*self.free_list, *self._eviction_order()]

    def ref_cnt(self, block_id: int) -> int:
        return self.ref[block_id]


def make_kv_cache_manager(spec: KVCacheSpec) -> FinishManager:
    return FinishManager(spec)
