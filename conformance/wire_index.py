"""The prefix index a KV-aware router rebuilds from an engine's event stream (``event_wire``).

A router (llm-d's indexer, Dynamo's KV router, SGLang's router) never sees the engine's block
tables: it sees ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` and scores a new
request by how many of its leading blocks the stream says are cached. ``WireIndex`` is that
router, written as vLLM's events mean it:

* a hash may sit on several physical blocks; every copy is stored with its own
  ``BlockStored`` and removed with its own ``BlockRemoved`` (vLLM's ``BlockPool`` emits one per
  map entry dropped, spec kv-events-wire.md §3), so the index counts copies and a hash is cached
  while its count is positive. A router that drops the hash on its first removal under-scores
  (vLLM PR #55092);
* a request's blocks are found by content: block ``i`` of a store holds
  ``token_ids[i*bs:(i+1)*bs]`` after ``block_hashes[i-1]`` (``parent_block_hash`` for the
  first), as in a dense (full-attention) group, where every block of the span has a hash. The
  index never recomputes the engine's hash function: any hash bytes work.

``cached_prefix_blocks(tokens)`` is then the router's score: the leading full blocks of
``tokens`` the stream holds (group 0, plain requests: no LoRA, multimodal items or salt).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from kvcheck.events.codec import DecodedBatch
from kvcheck.reference_impl.events import AllBlocksCleared, BlockRemoved, BlockStored

__all__ = ["WireIndex"]

#: (group, parent hash or None, the block's token ids)
_ContentKey = tuple[int, bytes | None, tuple[int, ...]]


class WireIndex:
    """Feed decoded batches in stream order; ask for a prompt's cached prefix."""

    def __init__(self) -> None:
        #: (group, hash) -> physical copies stored and not removed.
        self.copies: Counter[tuple[int, bytes]] = Counter()
        #: content -> the hash the stream stored it under (dense stores only).
        self._by_content: dict[_ContentKey, bytes] = {}

    def feed(self, batch: DecodedBatch) -> None:
        for event in batch.events:
            if isinstance(event, AllBlocksCleared):
                self.copies.clear()
                self._by_content.clear()
            elif isinstance(event, BlockRemoved):
                for block_hash in event.block_hashes:
                    key = (event.group_idx, block_hash)
                    if self.copies[key] > 0:
                        self.copies[key] -= 1
            elif isinstance(event, BlockStored):
                self._stored(event)

    def _stored(self, event: BlockStored) -> None:
        group, size = event.group_idx, event.block_size
        for block_hash in event.block_hashes:
            self.copies[group, block_hash] += 1
        if size <= 0 or len(event.token_ids) != size * len(event.block_hashes):
            return  # a sparse store: its tokens span null blocks, no content per hash
        if event.lora_id is not None or any(k is not None for k in event.extra_keys or ()):
            return  # keyed by more than tokens (0.33 lists one entry per block, None if none)
        parent = event.parent_block_hash
        for i, block_hash in enumerate(event.block_hashes):
            block = tuple(event.token_ids[i * size:(i + 1) * size])
            self._by_content[group, parent, block] = block_hash
            parent = block_hash

    def cached_prefix_blocks(self, tokens: Sequence[int], block_size: int,
                             group: int = 0) -> int:
        """How many leading full blocks of ``tokens`` the stream holds in ``group``."""
        parent: bytes | None = None
        count = 0
        for start in range(0, len(tokens) - block_size + 1, block_size):
            block_hash = self._by_content.get(
                (group, parent, tuple(tokens[start:start + block_size])))
            if block_hash is None or self.copies[group, block_hash] <= 0:
                break
            count += 1
            parent = block_hash
        return count

    def cached_hashes(self, group: int | None = None) -> Counter[bytes]:
        """Hash -> copies the stream holds (in ``group``, or all groups)."""
        out: Counter[bytes] = Counter()
        for (g, block_hash), n in self.copies.items():
            if n > 0 and (group is None or g == group):
                out[block_hash] += n
        return out
