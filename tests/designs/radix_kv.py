"""radix_kv: a radix-tree prefix cache over a paged block allocator, in the style of SGLang's
``RadixCache`` with ``page_size > 1``, written for kvcheck's ``--kv-profile=generic``
(``pytest --kv-impl=radix_kv --kv-profile=generic`` with this folder on ``PYTHONPATH``). It is
an independent design, not vLLM's:

* **a paged allocator with one reference count per block**: one per request holding the
  block, one per lookup locking it, and one for the tree while the block is in it (so
  ``ref_cnt_counts_cache=True``: a cached block nobody uses has ref_cnt 1 and is evictable);
  no reserved block, ids ``0..num_blocks-1``;
* **the tree**: one root per context (LoRA adapter, cache salt: SGLang's extra-key
  namespaces); a node holds a run of pages (``key``: their tokens, ``value``: their block
  ids) and its children are keyed by their first page; an insert that diverges inside a node
  splits it; a lookup never splits;
* **locking lookups** (``pinning_lookup``): ``match_prefix`` walks at most ``(num_tokens - 1)
  // page_size`` pages and takes a reference on every matched block; the request's next
  ``allocate_slots`` turns those into its own references, ``release_computed`` drops them;
* **insert while running** (``caches_running_requests``, SGLang's ``cache_unfinished_req``):
  at the end of ``allocate_slots`` the request's computed full pages go into the tree, the
  request's own blocks where the tree lacks the page; at a page the tree already holds in
  another block the insert stops: the request computed a duplicate whose forward pass has
  not run yet;
* **dedup on insert** (``dedup_on_insert``): at the request's next ``allocate_slots`` (that
  forward pass has run) the insert resumes, rebinding each duplicate entry to the tree's
  block and freeing the request's copy; ``free`` (``cache_finished_req``) does the same
  before releasing everything;
* **eviction**: uncached free blocks first (a FIFO free list), then the last page of the least
  recently used unlocked leaf, one page at a time; ``free_block_ids`` lists that order.

Every block held by a request or locked by a lookup lies on a path from a root whose blocks
it all holds, so an unused tree block is always reachable by leaf-first eviction:
``num_free_blocks`` counts it. ``check_invariants`` checks that and the reference counts.

The mutants in this folder (``mut_radix_*.py``) subclass ``RadixManager`` with one bug each.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter, deque
from collections.abc import Iterator, Sequence

from kvcheck.conformance.protocol import ImplInfo, KVCacheSpec, RequestView, UnsupportedSpec

__all__ = ["IMPL_INFO", "PAGE_SIZES", "RadixManager", "TreeNode", "make_kv_cache_manager"]

#: Page sizes (tokens per block) the design supports: SGLang's token-granular tree (1) and
#: the paged ones.
PAGE_SIZES = (1, 4, 16, 64)

IMPL_INFO = ImplInfo(
    name="radix_kv",
    version="0.1.0",
    capabilities=frozenset({
        "manager", "prefix_caching", "ref_counts", "free_queue_order", "invariants",
        "caches_running_requests", "dedup_on_insert", "pinning_lookup", "reset_prefix_cache",
        "caching_off", "skip_reading_prefix_cache", "lookahead", "multi_token_decode",
        "lora", "cache_salt",
    }),
    profile="generic",
    hash_algos=(),
    block_sizes=PAGE_SIZES,
    ref_cnt_counts_cache=True,
)

Page = tuple[int, ...]
#: A request's namespace in the tree: its LoRA adapter and cache salt.
Context = tuple[tuple[str, int, str] | None, str | None]


class TreeNode:
    """A run of pages: ``key[i]`` is a page's tokens, ``value[i]`` the block holding its KV.
    A root has no pages and no parent."""

    __slots__ = ("children", "key", "last_access", "parent", "serial", "value")

    def __init__(self, parent: TreeNode | None, key: list[Page], value: list[int],
                 last_access: int, serial: int) -> None:
        self.parent = parent
        self.key = key
        self.value = value
        self.children: dict[Page, TreeNode] = {}
        self.last_access = last_access
        self.serial = serial  # ties in last_access: the older node first


class RadixManager:
    """The ``KVCacheManagerAdapter`` surface plus ``release_computed``, ``ref_cnt``,
    ``free_block_ids``, ``reset_prefix_cache`` and ``check_invariants``."""

    def __init__(self, spec: KVCacheSpec) -> None:
        if spec.kv_cache_groups:
            raise UnsupportedSpec("radix_kv manages a single KV-cache group")
        if spec.block_size not in PAGE_SIZES:
            raise UnsupportedSpec(f"radix_kv supports page sizes {PAGE_SIZES}, not "
                                  f"{spec.block_size}")
        self.page_size = spec.block_size
        self.caching = spec.enable_caching
        self.num_blocks = spec.num_blocks
        self.ref = [0] * spec.num_blocks
        self.free_list: deque[int] = deque(range(spec.num_blocks))  # ref 0, not in the tree
        self.roots: dict[Context, TreeNode] = {}
        self.node_of: dict[int, TreeNode] = {}  # a block in the tree -> its node
        self.tables: dict[str, list[int]] = {}
        self.contexts: dict[str, Context] = {}
        # The tokens each running request has computed (through its last allocate_slots).
        self.computed: dict[str, tuple[int, ...]] = {}
        self.locks: dict[str, list[int]] = {}  # request id -> the blocks its match locked
        self._clock = itertools.count(1)
        self._serials = itertools.count()

    # ------------------------------------------------------------------ helpers
    def _pages(self, tokens: Sequence[int], start: int, stop: int) -> list[Page]:
        ps = self.page_size
        return [tuple(tokens[i * ps:(i + 1) * ps]) for i in range(start, stop)]

    @staticmethod
    def _context(request: RequestView) -> Context:
        return request.lora, request.cache_salt or None

    def _root(self, context: Context) -> TreeNode:
        root = self.roots.get(context)
        if root is None:
            root = self.roots[context] = TreeNode(None, [], [], 0, next(self._serials))
        return root

    def _take(self, block_id: int) -> None:
        """One more reference on ``block_id`` (out of the free list if it was there)."""
        if self.ref[block_id] == 0 and block_id not in self.node_of:
            self.free_list.remove(block_id)
        self.ref[block_id] += 1

    def _unref(self, block_id: int) -> None:
        self.ref[block_id] -= 1
        if self.ref[block_id] == 0:
            self.free_list.append(block_id)  # only the tree keeps a block at ref 1

    def _is_free(self, block_id: int) -> bool:
        """Counted by ``num_free_blocks``: unused, or used by the tree alone (evictable)."""
        return self.ref[block_id] == (1 if block_id in self.node_of else 0)

    # ------------------------------------------------------------------ match_prefix
    def get_computed_blocks(self, request: RequestView) -> tuple[list[int], int]:
        """The longest cached prefix of whole pages, at most ``num_tokens - 1`` tokens (the
        last token's logits are needed), each matched block locked for the request."""
        blocks: list[int] = []
        if self.caching and not request.skip_reading_prefix_cache:
            pages = self._pages(request.token_ids, 0, (request.num_tokens - 1) // self.page_size)
            blocks = self._match_prefix(self._context(request), pages)
        for block_id in blocks:
            self.ref[block_id] += 1  # inc_lock_ref
        self.locks[request.request_id] = blocks
        return list(blocks), len(blocks) * self.page_size

    def _match_prefix(self, context: Context, pages: list[Page]) -> list[int]:
        node = self.roots.get(context)
        blocks: list[int] = []
        i = 0
        while node is not None and i < len(pages):
            child = node.children.get(pages[i])
            if child is None:
                break
            j = 0
            while j < len(child.key) and i < len(pages) and child.key[j] == pages[i]:
                blocks.append(child.value[j])
                i += 1
                j += 1
            node = child if j == len(child.key) else None
        return blocks

    def release_computed(self, request_id: str) -> None:
        """The scheduler did not admit the request it looked up: unlock its match."""
        for block_id in self.locks.pop(request_id, []):
            self._unref(block_id)  # dec_lock_ref

    # ------------------------------------------------------------------ insert
    def _key_match(self, key: list[Page], pages: list[Page], start: int) -> int:
        """How many leading pages of a node's ``key`` equal ``pages[start:]``."""
        n = 0
        while n < len(key) and start + n < len(pages) and key[n] == pages[start + n]:
            n += 1
        return n

    def _insert(self, context: Context, table: list[int], tokens: Sequence[int],
                num_pages: int, *, rebind: bool) -> None:
        """Put the request's first ``num_pages`` full pages into the tree. A page the tree
        lacks gets the request's block; one the tree holds in another block is a duplicate:
        with ``rebind`` (its forward pass has run) the table entry becomes the tree's block
        and the copy is freed, else the insert stops there."""
        num_pages = min(num_pages, len(table))
        pages = self._pages(tokens, 0, num_pages)
        now = next(self._clock)
        node = self._root(context)
        i = 0
        while i < num_pages:
            child = node.children.get(pages[i])
            if child is None:
                self._add_leaf(node, pages[i:], table[i:num_pages], now)
                return
            matched = self._key_match(child.key, pages, i)
            for j in range(matched):
                cached = child.value[j]
                if cached != table[i + j]:
                    if not rebind:
                        return  # dedup at the request's next call, after its forward pass
                    self._rebind(table, i + j, cached)
            child.last_access = now
            i += matched
            if matched < len(child.key):
                if i == num_pages:
                    return
                child = self._split(child, matched)
            node = child

    def _rebind(self, table: list[int], index: int, cached: int) -> None:
        """Dedup: entry ``index`` becomes the tree's block ``cached``; the copy is freed."""
        self._take(cached)
        self._unref(table[index])
        table[index] = cached

    def _add_leaf(self, parent: TreeNode, key: list[Page], value: list[int], now: int) -> None:
        leaf = TreeNode(parent, key, value, now, next(self._serials))
        parent.children[key[0]] = leaf
        for block_id in value:
            self.ref[block_id] += 1  # the tree's own reference
            self.node_of[block_id] = leaf

    def _split(self, node: TreeNode, at: int) -> TreeNode:
        """Split ``node`` before its page ``at``; returns the new upper half."""
        assert node.parent is not None
        upper = TreeNode(node.parent, node.key[:at], node.value[:at], node.last_access,
                         next(self._serials))
        node.parent.children[node.key[0]] = upper
        upper.children[node.key[at]] = node
        node.key, node.value, node.parent = node.key[at:], node.value[at:], upper
        for block_id in upper.value:
            self.node_of[block_id] = upper
        return upper

    # ------------------------------------------------------------------ allocation
    def allocate_slots(self, request: RequestView, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_block_ids: Sequence[int] = (),
                       num_lookahead_tokens: int = 0) -> list[int] | None:
        ps = self.page_size
        rid = request.request_id
        hits = list(new_computed_block_ids)
        running = rid in self.tables
        table = self.tables.get(rid, [])
        end = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        need = max(0, -(-(end + num_lookahead_tokens) // ps) - len(table) - len(hits))
        locked = Counter(self.locks.get(rid, ()))
        # A hit the match did not lock that only the tree holds is taken from the free ones.
        unlocked_free = {b for b in hits if not locked[b] and self._is_free(b)}
        if need > self.num_free_blocks() - len(unlocked_free):
            return None  # nothing changed; the locks stay until release_computed
        self.locks.pop(rid, None)
        for block_id in hits:
            if locked[block_id]:
                locked[block_id] -= 1  # the lock becomes the request's reference
            else:
                self._take(block_id)
        for block_id in locked.elements():  # matched but not passed back
            self._unref(block_id)
        context = self.contexts.setdefault(rid, self._context(request))
        if running and self.caching:
            # The previous call's forward pass has run: dedup and insert what it computed
            # (the copies freed here may be handed out below).
            self._insert(context, table, request.token_ids, request.num_computed_tokens // ps,
                         rebind=True)
        new = [self._new_block() for _ in range(need)]
        table = self.tables[rid] = table + hits + new
        self.computed[rid] = request.token_ids[:end]
        if self.caching:
            self._insert(context, table, request.token_ids, min(end, request.num_tokens) // ps,
                         rebind=False)
        return new

    def _new_block(self) -> int:
        block_id = self.free_list.popleft() if self.free_list else self._evict_one()
        self.ref[block_id] = 1
        return block_id

    def _evict_one(self) -> int:
        """Drop the last page of the least recently used unlocked leaf from the tree."""
        block_id = self._eviction_order()[0]
        node = self.node_of.pop(block_id)
        assert node.value[-1] == block_id and not node.children and node.parent is not None
        first = node.key[0]
        node.key.pop()
        node.value.pop()
        if not node.value:
            del node.parent.children[first]
        self.ref[block_id] = 0
        return block_id

    def _nodes(self) -> Iterator[TreeNode]:
        """Every non-root node."""
        stack = [child for root in self.roots.values() for child in root.children.values()]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _eviction_order(self) -> list[int]:
        """The tree blocks only the tree holds, in the order eviction takes them: the least
        recently used leaf first, its pages from the last; a parent once its children are
        gone."""
        left: dict[TreeNode, int] = {}
        heap: list[tuple[int, int, TreeNode]] = []
        for node in self._nodes():
            left[node] = len(node.children)
            if not node.children:
                heap.append((node.last_access, node.serial, node))
        heapq.heapify(heap)
        order: list[int] = []
        while heap:
            _, _, node = heapq.heappop(heap)
            evictable = 0
            for block_id in reversed(node.value):
                if self.ref[block_id] != 1:
                    break
                evictable += 1
            order += node.value[len(node.value) - evictable:][::-1]
            parent = node.parent
            if evictable == len(node.value) and parent is not None and parent.parent is not None:
                left[parent] -= 1
                if left[parent] == 0:
                    heapq.heappush(heap, (parent.last_access, parent.serial, parent))
        return order

    def free(self, request_id: str) -> None:
        """The request finished or was preempted: insert all it computed (its duplicates
        deduplicated), then release its blocks, last first."""
        self.release_computed(request_id)
        table = self.tables.pop(request_id, None)
        if table is None:
            return
        context = self.contexts.pop(request_id)
        tokens = self.computed.pop(request_id)
        if self.caching:
            self._insert(context, table, tokens, len(tokens) // self.page_size, rebind=True)
        for block_id in reversed(table):
            self._unref(block_id)

    def reset_prefix_cache(self) -> bool:
        """Empty the tree, only when no block is in use (held or locked)."""
        if any(self.ref[b] > (b in self.node_of) for b in range(self.num_blocks)):
            return False
        for block_id in sorted(self.node_of):
            self._unref(block_id)
        self.node_of.clear()
        self.roots.clear()
        return True

    # ------------------------------------------------------------------ observations
    def get_block_ids(self, request_id: str) -> list[int]:
        return list(self.tables.get(request_id, ()))

    def num_free_blocks(self) -> int:
        return len(self.free_list) + sum(1 for b in self.node_of if self.ref[b] == 1)

    def free_block_ids(self) -> list[int]:
        return [*self.free_list, *self._eviction_order()]

    def ref_cnt(self, block_id: int) -> int:
        return self.ref[block_id]

    def check_invariants(self) -> None:
        users: Counter[int] = Counter()
        for ids in (*self.tables.values(), *self.locks.values()):
            users.update(ids)
        for block_id in range(self.num_blocks):
            want = users[block_id] + (block_id in self.node_of)
            assert self.ref[block_id] == want, (
                f"block {block_id}: ref {self.ref[block_id]}, but {users[block_id]} "
                f"table entries / locks and {'one' if block_id in self.node_of else 'no'} "
                "tree reference")
        assert len(set(self.free_list)) == len(self.free_list), "free list repeats a block"
        assert all(self.ref[b] == 0 and b not in self.node_of for b in self.free_list), (
            "a free-list block is in use or in the tree")
        unused = sorted(b for b in self.node_of if self.ref[b] == 1)
        assert sorted(self._eviction_order()) == unused, (
            f"tree blocks nobody uses {unused} are not all reachable by eviction")
        for node in self._nodes():
            assert node.value and len(node.key) == len(node.value), "an empty or ragged node"
            assert node.parent is not None and node.parent.children.get(node.key[0]) is node
            assert all(self.node_of.get(b) is node for b in node.value), "node_of is stale"


def make_kv_cache_manager(spec: KVCacheSpec) -> RadixManager:
    return RadixManager(spec)
