"""radix_indexer: a KV-aware router's prefix index as a radix tree over token blocks.

An independent implementation of the ``indexer`` protocol written from docs/indexers.md
(and the event fields of docs/events.md and docs/semantics.md), to show those pages suffice.

Design: per worker and per KV-cache group, a tree whose nodes are blocks. A node sits under
its parent node (the block before it) and is keyed among its siblings by its *content*: the
block's ``block_size`` tokens and its context (the LoRA adapter and, on vLLM 0.33, the
event's per-block ``extra_keys``). Each node carries the engine hash the stream gave it and
a copy count (one ``BlockStored`` per physical copy, one ``BlockRemoved`` per copy
evicted). A map from engine hash to node serves removals and finds a store's parent. A match
walks the request's full blocks down from the root and counts the leading nodes with at
least one copy. Engine hashes are never recomputed (``hash_algos=()``): the index works with
any hash algorithm, seed and hash form.

Capabilities: ``indexer``; both hash forms (a hash is only ever a dict key, compared with
hashes of the same stream); ``decoded_events``; ``replay`` (batches are applied strictly in
sequence order, later ones wait for a gap's replay, already-applied ones are ignored);
``lora`` (0.33's stores name the adapter, 0.10.2's give its int id, and each release hashes
the adapter by what it sends, name or id); ``kv_cache_groups`` (one tree per group, only the
match group's answers matches).

Not declared: ``cache_salt`` and ``multimodal``. vLLM 0.33's stores carry each block's
untagged extra keys (LoRA name, ``(identifier, offset)`` per image, salt), and this index keys
blocks by them, so on 0.33 salted and multimodal requests would be told apart; but 0.10.2's
stores carry no extra keys, so a salted or multimodal block looks exactly like a base-model
block with the same tokens, and a content-keyed index would count one for the other.
Capabilities are static (one declaration for every profile), and passing under 0.10 would
need hashing requests as the engine does, which this design avoids.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvcheck.conformance.indexer_protocol import IndexerConfig, MatchContext
from kvcheck.conformance.protocol import ImplInfo

IMPL_INFO = ImplInfo(
    name="radix-indexer",
    version="0.1",
    profile="vllm-0.33",
    hash_algos=(),  # keyed by content: works with any engine hash algorithm
    capabilities=frozenset({"indexer", "int_hashes", "bytes_hashes", "decoded_events",
                            "replay", "lora", "kv_cache_groups"}),
)

#: A block's context: (the LoRA adapter as the release sends it, the block's extra keys).
Context = tuple[Hashable, Hashable]
#: A child's key under its parent: (the block's tokens, its context).
ChildKey = tuple[tuple[int, ...], Context]


def _frozen(value: Any) -> Hashable:
    """``value`` with every list turned into a tuple, recursively (msgpack decodes tuples as
    lists), so extra keys from the wire compare equal to ones built here and can be hashed."""
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    scalar: Hashable = value
    return scalar


# ---------------------------------------------------------------------------------------------
# Events, parsed once on arrival (the caller's batch is never kept or changed)
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Stored:
    """The full blocks of one ``BlockStored``: ``blocks[i]`` is ``(hash, tokens, context)``,
    chained after ``parent`` (an engine hash, or None at the start of a prompt)."""

    group: int
    parent: Hashable | None
    blocks: tuple[tuple[Hashable, tuple[int, ...], Context], ...]


@dataclass(frozen=True, slots=True)
class Removed:
    """One ``BlockRemoved``: one copy of each hash left the group's cache."""

    group: int
    hashes: tuple[Hashable, ...]


@dataclass(frozen=True, slots=True)
class Cleared:
    """``AllBlocksCleared``: the worker's cache is empty, every group."""


Event = Stored | Removed | Cleared


def _on_gpu(event: Mapping[str, Any]) -> bool:
    """Whether the event is about the GPU prefix cache (the one requests hit)."""
    return event.get("medium") in ("GPU", None)


def _parse_batch(batch: Mapping[str, Any], config: IndexerConfig,
                 worker_id: str) -> list[Event]:
    """The events of a decoded batch, in order, as this index applies them.

    Raises ValueError, before anything is applied, for a store in the match group whose
    ``block_size`` is not the configured one (its blocks are not the blocks a request is cut
    into; docs/indexers.md, "block size"), unless it is a partial-block key, which is dropped.
    Events of another medium and event types this index does not know are dropped.
    """
    parsed: list[Event] = []
    for event in batch["events"]:
        kind = event.get("type")
        group = event.get("group_idx") or 0  # absent on 0.10.2: one group
        if kind == "AllBlocksCleared":
            parsed.append(Cleared())
        elif kind == "BlockStored":
            if group == config.match_group and _is_partial_key(event, config):
                continue  # a key at a boundary inside a block: never a block of the tree
            if group == config.match_group and event["block_size"] != config.block_size:
                raise ValueError(
                    f"worker {worker_id!r}: a BlockStored in group {group} has blocks of "
                    f"{event['block_size']} tokens, the index is configured for "
                    f"{config.block_size}; refusing the batch")
            if _on_gpu(event):
                parsed.append(_parse_store(event, group, config.release))
        elif kind == "BlockRemoved" and _on_gpu(event):
            parsed.append(Removed(group, tuple(event["block_hashes"])))
    return parsed


def _is_partial_key(event: Mapping[str, Any], config: IndexerConfig) -> bool:
    """vLLM 0.33's partial-block key (docs/indexers.md, "partial keys"): one hash of one
    hash block, in a match group of larger blocks. Its removal later names a hash no node
    has, which changes nothing."""
    hash_block = config.hash_block_size or config.block_size
    return (hash_block < config.block_size and event["block_size"] == hash_block
            and len(event["block_hashes"]) == 1 and len(event["token_ids"]) == hash_block)


def _parse_store(event: Mapping[str, Any], group: int, release: str) -> Stored:
    """One ``BlockStored`` as its full blocks.

    Only blocks its ``token_ids`` fill count: a trimmed store's trailing partial block is
    never a prefix block. A sparse store (a sliding-window or Mamba group, whose
    ``token_ids`` span null blocks that ``block_hashes`` skips) cannot be laid out block by
    block from the event, so it adds no node; such stores never occur in a full-attention
    group, the only kind matches count in.
    """
    size = event["block_size"]
    tokens: Sequence[int] = event["token_ids"]
    hashes: Sequence[Hashable] = event["block_hashes"]
    full = len(tokens) // size
    if full > len(hashes):  # sparse: which token blocks the hashes belong to is unknown
        return Stored(group, event["parent_block_hash"], ())
    extra_keys = event.get("extra_keys") or ()
    lora = _store_lora(event, release)
    blocks = []
    for i in range(min(full, len(hashes))):
        extra = extra_keys[i] if i < len(extra_keys) else None
        blocks.append((hashes[i], tuple(tokens[i * size:(i + 1) * size]),
                       (lora, _frozen(extra) or None)))
    return Stored(group, event["parent_block_hash"], tuple(blocks))


def _store_lora(event: Mapping[str, Any], release: str) -> Hashable:
    """The adapter as the block's hash includes it: its name on 0.33 (0.10.2 sends none),
    its int id on 0.10.2 (docs/semantics.md, "Extra keys")."""
    lora: Hashable = event.get("lora_id" if release == "vllm-0.10" else "lora_name")
    return lora


def request_contexts(num_blocks: int, block_size: int, context: MatchContext,
                     release: str) -> Iterator[Context]:
    """The context of each of a request's first ``num_blocks`` blocks, built as a store of
    that block would carry it: vLLM 0.33's untagged extra keys (LoRA name, then
    ``(identifier, offset from the block start)`` per multimodal item overlapping the block,
    then the salt on the block at token 0), or 0.10.2's bare LoRA id and no extra keys."""
    lora = context.lora
    if release == "vllm-0.10":
        for _ in range(num_blocks):
            yield (lora[1] if lora else None, None)
        return
    for i in range(num_blocks):
        start, end = i * block_size, (i + 1) * block_size
        keys: list[Hashable] = [lora[0]] if lora else []
        keys += [(ident, offset - start) for ident, offset, length in context.mm_features
                 if offset < end and offset + length > start]
        if start == 0 and context.cache_salt:
            keys.append(context.cache_salt)
        yield (lora[0] if lora else None, tuple(keys) or None)


# ---------------------------------------------------------------------------------------------
# The tree
# ---------------------------------------------------------------------------------------------

@dataclass(eq=False, slots=True)
class Node:
    """One block: its engine hash, how many physical copies the stream says are cached, and
    the blocks stored after it. ``key`` is None for the root and for a placeholder (a parent
    hash a store named before the index saw that block stored: its content is unknown until
    then)."""

    hash: Hashable | None
    parent: Node | None = None
    key: ChildKey | None = None
    copies: int = 0
    children: dict[ChildKey, Node] = field(default_factory=dict)


class BlockTree:
    """The cached blocks of one worker's KV-cache group.

    Invariants: ``by_hash`` maps each engine hash the tree holds to its node; a node stays
    while it has copies or children (a block may stay cached after its parent was evicted,
    and a later store of the parent must find it again), and is pruned otherwise.
    """

    def __init__(self) -> None:
        self.root = Node(hash=None)
        self.by_hash: dict[Hashable, Node] = {}

    def store(self, event: Stored) -> None:
        """Add one copy of each block of ``event`` under its parent."""
        if not event.blocks:
            return
        node = self._parent(event.parent)
        for block_hash, tokens, context in event.blocks:
            node = self._child(node, (tokens, context), block_hash)
            node.copies += 1

    def remove(self, block_hash: Hashable) -> None:
        """One copy of ``block_hash`` was evicted. A hash with no copy (never stored, or
        already gone) changes nothing."""
        node = self.by_hash.get(block_hash)
        if node is None or node.copies == 0:
            return
        node.copies -= 1
        self._prune(node)

    def match(self, token_ids: Sequence[int], contexts: Iterator[Context],
              block_size: int) -> int:
        """How many leading full blocks of ``token_ids`` (with ``contexts``, one per block)
        have a cached copy."""
        node, count = self.root, 0
        for i, context in enumerate(contexts):
            tokens = tuple(token_ids[i * block_size:(i + 1) * block_size])
            child = node.children.get((tokens, context))
            if child is None or child.copies == 0:
                break
            node, count = child, count + 1
        return count

    def _parent(self, parent_hash: Hashable | None) -> Node:
        """The node a store chains after: the root, the parent's node, or a placeholder for a
        parent the tree has not seen stored (adopted when it is)."""
        if parent_hash is None:
            return self.root
        node = self.by_hash.get(parent_hash)
        if node is None:
            node = self.by_hash[parent_hash] = Node(hash=parent_hash)
        return node

    def _child(self, parent: Node, key: ChildKey, block_hash: Hashable) -> Node:
        """The child of ``parent`` keyed ``key``, created (or adopted from a placeholder of
        ``block_hash``) if missing."""
        child = parent.children.get(key)
        if child is None:
            known = self.by_hash.get(block_hash)
            is_placeholder = known is not None and known.key is None
            child = known if known is not None and is_placeholder else Node(hash=block_hash)
            child.parent, child.key = parent, key
            parent.children[key] = child
        # Normally child.hash == block_hash; should two hashes ever share one content key
        # (content the events cannot tell apart), both name this node.
        self.by_hash[block_hash] = child
        return child

    def _prune(self, node: Node) -> None:
        """Drop ``node`` and its ancestors while they have neither copies nor children."""
        while node is not self.root and node.copies == 0 and not node.children:
            if self.by_hash.get(node.hash) is node:
                del self.by_hash[node.hash]
            parent = node.parent
            if parent is None or node.key is None:  # a placeholder: not in any children
                return
            del parent.children[node.key]
            node = parent


# ---------------------------------------------------------------------------------------------
# Workers and the index
# ---------------------------------------------------------------------------------------------

@dataclass(slots=True)
class Worker:
    """One worker's stream position and trees.

    ``next_seq`` is the next sequence number to apply; ``waiting`` holds parsed batches that
    arrived ahead of it (after a gap); ``last_live`` is the last live sequence number, which
    a new publisher (a restarted engine) goes back below.
    """

    next_seq: int = 0
    last_live: int | None = None
    waiting: dict[int, list[Event]] = field(default_factory=dict)
    trees: dict[int, BlockTree] = field(default_factory=dict)

    def restart(self) -> None:
        """A new publisher: an empty cache, its stream from sequence 0."""
        self.next_seq = 0
        self.waiting.clear()
        self.trees.clear()

    def deliver(self, seq: int, events: list[Event]) -> None:
        """Apply batch ``seq`` and every waiting batch it unblocks, in sequence order; a batch
        already applied or already waiting is ignored."""
        if seq < self.next_seq or seq in self.waiting:
            return
        self.waiting[seq] = events
        while self.next_seq in self.waiting:
            self._apply(self.waiting.pop(self.next_seq))
            self.next_seq += 1

    def _apply(self, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, Cleared):
                self.trees.clear()
            elif isinstance(event, Stored):
                self.trees.setdefault(event.group, BlockTree()).store(event)
            elif event.group in self.trees:  # a removal in an empty group changes nothing
                for block_hash in event.hashes:
                    self.trees[event.group].remove(block_hash)


class RadixIndexer:
    """A prefix index of many workers (the ``indexer`` protocol, ``decoded_events``)."""

    def __init__(self, config: IndexerConfig) -> None:
        self.config = config
        self.workers: dict[str, Worker] = {}

    def apply_events(self, worker_id: str, seq: int, batch: Mapping[str, Any],
                     replay: bool = False) -> None:
        """Batch ``seq`` of ``worker_id`` (``replay``: asked for after a gap). Only that
        worker changes. A live ``seq`` below the last live one is a restarted engine: the
        worker is cleared first. Raises ValueError, changing nothing, for a store of another
        block size in the match group. ``batch`` is read, never changed or kept."""
        events = _parse_batch(batch, self.config, worker_id)
        worker = self.workers.setdefault(worker_id, Worker())
        if not replay:
            if worker.last_live is not None and seq < worker.last_live:
                worker.restart()
            worker.last_live = seq
        worker.deliver(seq, events)

    def match(self, token_ids: Sequence[int], context: MatchContext) -> dict[str, int]:
        """Per worker holding any, the number of leading full blocks of ``token_ids`` (with
        ``context``) cached in the match group; workers holding none are left out."""
        size, group = self.config.block_size, self.config.match_group
        num_blocks = len(token_ids) // size
        answer = {}
        for worker_id, worker in self.workers.items():
            tree = worker.trees.get(group)
            if tree is None:
                continue
            contexts = request_contexts(num_blocks, size, context, self.config.release)
            count = tree.match(token_ids, contexts, size)
            if count:
                answer[worker_id] = count
        return answer

    def remove_worker(self, worker_id: str) -> None:
        """Forget ``worker_id`` (it left the pool)."""
        self.workers.pop(worker_id, None)


def make_indexer(config: IndexerConfig) -> RadixIndexer:
    """A fresh, empty index for workers configured as ``config`` says."""
    return RadixIndexer(config)
