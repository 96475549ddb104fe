"""nano_kv: a small paged KV-cache block manager in the style of nano-vllm, written for kvcheck's
``--kv-profile=generic`` (``pytest --kv-impl=nano_kv --kv-profile=generic`` with this folder on
``PYTHONPATH``). It is an independent design, not vLLM's, and shows what ``generic`` checks:

* no reserved null block: every id in ``[0, num_blocks)`` is an ordinary block;
* blocks for the whole sequence at admission: the first ``allocate_slots`` of a request takes
  blocks for all its current tokens (a chunked prefill then continues inside them);
* one token per decode step: a running request gets at most one more block per call;
* always caching (``enable_caching`` is ignored) and no ``reset_prefix_cache``;
* its own chained hash (blake2b over the parent digest and the block's tokens), not one of
  vLLM's algorithms (``hash_algos=()``);
* a hash map where the last writer wins: a block-aligned prompt recomputes its last block and
  the recomputed copy replaces the older one in the map; a block's key leaves the map when the
  block is handed out again (lazy eviction: a freed block keeps hitting until then);
* a free list (deque): new blocks come from its head, freed blocks go to its tail, last block
  of a request first.

A full block is hashed once its tokens are computed (``num_computed_tokens`` + the new ones),
never at admission, so a hit always points at computed KV.

The mutants in this folder (``mut_*.py``) subclass ``NanoManager`` with one bug each.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import deque
from collections.abc import Sequence

from kvcheck.conformance.protocol import ImplInfo, KVCacheSpec, RequestView, UnsupportedSpec

__all__ = ["BLOCK_SIZES", "IMPL_INFO", "NanoManager", "chain_hash", "make_kv_cache_manager"]

#: Block sizes (tokens) the design supports: powers of two from 2 (a 1-token block would make
#: the per-block bookkeeping cost more than the KV it pages).
BLOCK_SIZES = (2, 4, 8, 16, 32)

IMPL_INFO = ImplInfo(
    name="nano_kv",
    version="0.1.0",
    # caches_running_requests: a block is keyed as soon as its tokens are computed, while the
    # request still runs (cache_full_blocks in allocate_slots).
    capabilities=frozenset({"manager", "prefix_caching", "ref_counts", "free_queue_order",
                            "caches_running_requests"}),
    profile="generic",
    hash_algos=(),
    block_sizes=BLOCK_SIZES,
)


def chain_hash(parent: bytes, tokens: Sequence[int]) -> bytes:
    """The key of a full block: blake2b-128 of the parent block's key and its token ids as
    little-endian int64 (the first block's parent is ``b""``)."""
    return hashlib.blake2b(parent + array("q", tokens).tobytes(), digest_size=16).digest()


class Block:
    """One physical block: how many requests hold it and the key of the tokens it caches."""

    __slots__ = ("block_id", "hash", "ref_count")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.hash: bytes | None = None


class NanoManager:
    """The ``KVCacheManagerAdapter`` surface plus ``ref_cnt`` and ``free_block_ids``."""

    def __init__(self, spec: KVCacheSpec) -> None:
        if spec.block_size not in BLOCK_SIZES:
            raise UnsupportedSpec(f"nano_kv supports block sizes {BLOCK_SIZES}, not "
                                  f"{spec.block_size}")
        self.block_size = spec.block_size
        self.blocks = [Block(i) for i in range(spec.num_blocks)]
        self.hash_to_block_id: dict[bytes, int] = {}
        self.free_ids: deque[int] = deque(range(spec.num_blocks))
        self.tables: dict[str, list[int]] = {}
        self.hashes: dict[str, list[bytes]] = {}  # keys of each request's cached blocks

    # ------------------------------------------------------------------ lookups
    def key_of(self, parent: bytes, tokens: Sequence[int]) -> bytes:
        return chain_hash(parent, tokens)

    def lookup(self, key: bytes) -> int | None:
        return self.hash_to_block_id.get(key)

    def get_computed_blocks(self, request: RequestView) -> tuple[list[int], int]:
        bs = self.block_size
        tokens = request.token_ids
        ids: list[int] = []
        key = b""
        # The last token is always recomputed (its logits are needed): at most n - 1 tokens.
        for i in range((len(tokens) - 1) // bs):
            key = self.key_of(key, tokens[i * bs:(i + 1) * bs])
            block_id = self.lookup(key)
            if block_id is None:
                break
            ids.append(block_id)
        return ids, len(ids) * bs

    # ------------------------------------------------------------------ allocation
    def take_free_block(self) -> int:
        """The head of the free list, its old key dropped (it is about to be overwritten)."""
        block_id = self.free_ids.popleft()
        block = self.blocks[block_id]
        if block.hash is not None:
            if self.hash_to_block_id.get(block.hash) == block_id:
                del self.hash_to_block_id[block.hash]
            block.hash = None
        block.ref_count = 1
        return block_id

    def hold_hit(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            self.free_ids.remove(block_id)
        block.ref_count += 1

    def allocate_slots(self, request: RequestView, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_block_ids: Sequence[int] = (),
                       num_lookahead_tokens: int = 0) -> list[int] | None:
        bs = self.block_size
        rid = request.request_id
        computed_end = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        table = self.tables.get(rid)
        if table is None:
            # Admission: the hits plus blocks for every current token of the sequence.
            hits = list(new_computed_block_ids)
            num_new = -(-max(request.num_tokens, computed_end) // bs) - len(hits)
            free_hits = sum(1 for b in hits if self.blocks[b].ref_count == 0)
            if num_new > len(self.free_ids) - free_hits:
                return None
            for block_id in hits:
                self.hold_hit(block_id)
            new = [self.take_free_block() for _ in range(max(0, num_new))]
            table = self.tables[rid] = hits + new
            self.hashes[rid] = [self.blocks[b].hash for b in hits]  # type: ignore[misc]
        else:
            # A running request: a prefill chunk fits the blocks taken at admission; a decode
            # step appends one token, so it needs at most one more block.
            new = []
            if -(-max(request.num_tokens, computed_end) // bs) > len(table):
                if not self.free_ids:
                    return None
                new = [self.take_free_block()]
                table.extend(new)
        self.cache_full_blocks(request, table, min(computed_end, request.num_tokens) // bs)
        return new

    def cache_full_blocks(self, request: RequestView, table: list[int], num_full: int) -> None:
        """Key every computed full block not keyed yet; the last writer of a key wins."""
        bs = self.block_size
        keys = self.hashes[request.request_id]
        tokens = request.token_ids
        for i in range(len(keys), min(num_full, len(table))):
            key = self.key_of(keys[-1] if keys else b"", tokens[i * bs:(i + 1) * bs])
            self.blocks[table[i]].hash = key
            self.hash_to_block_id[key] = table[i]
            keys.append(key)

    def free(self, request_id: str) -> None:
        table = self.tables.pop(request_id, None)
        if table is None:
            return
        self.hashes.pop(request_id, None)
        for block_id in reversed(table):  # the last block is evicted first
            self.release(block_id)

    def release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free_ids.append(block_id)

    # ------------------------------------------------------------------ observations
    def get_block_ids(self, request_id: str) -> list[int]:
        return list(self.tables.get(request_id, ()))

    def num_free_blocks(self) -> int:
        return len(self.free_ids)

    def free_block_ids(self) -> list[int]:
        return list(self.free_ids)

    def ref_cnt(self, block_id: int) -> int:
        return self.blocks[block_id].ref_count


def make_kv_cache_manager(spec: KVCacheSpec) -> NanoManager:
    return NanoManager(spec)
