"""``BlockPool``: every physical block, the free queue and the prefix-cache map.

Order rules (docs/semantics.md#free-order), with Q the free queue, head first:

* init: ``Q = [1, ..., N-1]``; block 0 is popped as the null block and never returned.
* ``get_new_blocks(n)``: pop ``Q[:n]`` in order; each popped block loses its cache keys
  (lazy eviction: a freed cached block stays a possible hit until it is popped).
* ``touch(b)``: if ``ref_cnt(b) == 0`` remove b from Q; then ``ref_cnt += 1``.
* ``free_blocks(F)`` for the blocks of F whose ``ref_cnt`` reaches 0, in F's order:
  ``vllm-0.33``: ``Q = unhashed ++ Q ++ hashed``; ``vllm-0.10``: ``Q = Q ++ F``.

Cache keys (docs/semantics.md#partial-block-keys): a block carries at most one *primary* key
(``block.block_hash``), the one ``cache_full_blocks`` gives it, or a partial-block key when it
has none; further keys are *secondary* (``cached_block_hashes_by_block``). Evicting a block
removes every key it carries, primary first, one ``BlockRemoved`` per key.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from kvcheck.reference_impl import events as reference_events
from kvcheck.reference_impl.block import (
    BlockHash,
    BlockHashWithGroupId,
    KVCacheBlock,
    get_block_hash,
    get_group_id,
    group_id_suffix,
    make_block_hash_with_group_id,
)
from kvcheck.reference_impl.block_hash_map import BlockHashToBlockMap
from kvcheck.reference_impl.errors import KVCacheMisuseError
from kvcheck.reference_impl.events import KVCacheEvent, KVEventFactory
from kvcheck.reference_impl.extra_keys import generate_block_hash_extra_keys, to_event_extra_keys
from kvcheck.reference_impl.free_block_queue import FreeKVCacheBlockQueue
from kvcheck.reference_impl.profiles import ProfileBehaviour, get_profile

if TYPE_CHECKING:
    from kvcheck.reference_impl.request import Request

__all__ = ["BlockPool"]


class BlockPool:
    """All ``num_gpu_blocks`` blocks of one KV-cache pool.

    Args:
        num_gpu_blocks: total blocks, the null block included (usable: ``num_gpu_blocks - 1``).
        enable_caching: prefix caching on; off means blocks are never hashed or looked up.
        enable_kv_cache_events: record ``BlockStored`` / ``BlockRemoved`` /
            ``AllBlocksCleared`` for ``take_events``.
        profile: version profile name or ``ProfileBehaviour`` (default ``vllm-0.33``).
        event_factory: what the events are built with (``events.KVEventFactory``; default
            the reference's dataclasses, ``kvcheck.reference_impl.events``).
        num_hash_lookahead_tokens: vLLM 0.33's hash lookahead ``L`` (``BlockPool(
            num_hash_lookahead_tokens=L)``, docs/semantics.md#request-block-hashes): each
            ``BlockStored`` carries, per block, the ``L`` tokens after it
            (``lookahead_token_ids``) and extra keys over the block and those tokens. The
            hashes themselves come from the request (its hasher's lookahead).
    """

    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool = True,
        enable_kv_cache_events: bool = False,
        profile: str | ProfileBehaviour | None = None,
        event_factory: KVEventFactory | None = None,
        num_hash_lookahead_tokens: int = 0,
    ) -> None:
        if not isinstance(num_gpu_blocks, int) or num_gpu_blocks < 1:
            raise KVCacheMisuseError(
                f"num_gpu_blocks must be an int >= 1 (block 0 is the null block), "
                f"got {num_gpu_blocks!r}"
            )
        self.profile = get_profile(profile)
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.enable_kv_cache_events = enable_kv_cache_events
        self.blocks = [KVCacheBlock(block_id=i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        #: Block id -> its secondary cache keys, in insertion order (vLLM 0.33's
        #: ``cached_block_hashes_by_block``, a set there: only a partial-block key is ever
        #: secondary, and a block holds at most one in what a manager's calls reach).
        self.cached_block_hashes_by_block: dict[int, list[BlockHashWithGroupId]] = {}
        #: Block id -> the prefix tokens its primary key covers, for a primary partial-block
        #: key only (vLLM's ``block_hash_num_tokens``; a full key covers its whole block, more
        #: than any boundary inside it, and is not listed).
        self.partial_block_hash_num_tokens: dict[int, int] = {}
        # Like vLLM: the null block is simply the first block popped, hence always block 0.
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        #: The events' classes: with another factory, the queue holds its objects.
        self.event_factory: KVEventFactory = (reference_events if event_factory is None
                                              else event_factory)
        self.kv_event_queue: list[KVCacheEvent] = []
        #: Tokens after each block its hash covers (vLLM 0.33's hash lookahead; 0: none).
        self.num_hash_lookahead_tokens = num_hash_lookahead_tokens

    # ---------------------------------------------------------------- lookups
    def get_cached_block(
        self, block_hash: BlockHash, kv_cache_group_ids: Sequence[int] = (0,)
    ) -> list[KVCacheBlock] | None:
        """One cached block per group for ``block_hash``, or None if any group misses.

        No side effects: ``ref_cnt`` and the free queue are unchanged (a hit is pinned only
        by a later ``touch``).
        """
        out = []
        for group_id in kv_cache_group_ids:
            key = make_block_hash_with_group_id(block_hash, group_id)
            block = self.cached_block_hash_to_block.get_one_block(key)
            if block is None:
                return None
            out.append(block)
        return out

    # ---------------------------------------------------------------- caching
    def cache_full_blocks(
        self,
        request: Request,
        blocks: Sequence[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int = 0,
        block_mask: Sequence[bool] | None = None,
        block_hashes: Sequence[bytes] | None = None,
    ) -> None:
        """Key blocks ``[num_cached_blocks, num_full_blocks)`` of ``blocks`` by
        ``block_hashes[i] ‖ group id`` and insert them into the map
        (docs/semantics.md#allocation-caching-freeing-and-events-with-several-groups).

        ``block_hashes`` is the request's hash list viewed at this group's block size
        (default: ``request.block_hashes``, the hash block size). Null blocks and blocks whose
        ``block_mask`` entry (aligned with the range) is False are skipped; a block already
        keyed so is left as it is (0.33's idempotent insert). Duplicates are not merged (a
        key may hold several blocks). A block whose primary key is a partial-block key is
        promoted: every key it carries is removed first (one ``BlockRemoved`` each, before
        this call's ``BlockStored``), as vLLM 0.33 does (``block_pool.py:286-297``).

        Events: ``vllm-0.33``, one ``BlockStored`` per call that caches a block or skips a
        null or masked one (then ``block_hashes == ()`` while ``token_ids`` still spans the
        whole range); ``vllm-0.10``, one per call that caches a block.

        Raises:
            KVCacheMisuseError: fewer hashes than ``num_full_blocks``; a 0.10 event whose
                parent is the null block or an uncached block.
        """
        if num_cached_blocks >= num_full_blocks:
            return
        if block_hashes is None:
            block_hashes = request.block_hashes
        if len(block_hashes) < num_full_blocks:
            raise KVCacheMisuseError(
                f"request {request.request_id!r} has {len(block_hashes)} block hashes at block "
                f"size {block_size}, cannot cache {num_full_blocks} full blocks")
        events = self.enable_kv_cache_events
        extra_keys = events and self.profile.extra_key_format == "tagged"
        new_hashes: list[bytes] = []
        new_extra_keys: list[object] = []
        # Hash lookahead's tokens per stored block (events only, so no cost without them).
        new_lookahead: list[tuple[int, ...]] | None = (
            [] if extra_keys and self.num_hash_lookahead_tokens else None)
        sparse = False  # a null or masked block was skipped
        suffix = group_id_suffix(kv_cache_group_id)  # once: this loop runs per full block
        for i in range(num_cached_blocks, num_full_blocks):
            block = blocks[i]
            if block.is_null or (block_mask is not None and not block_mask[i - num_cached_blocks]):
                sparse = True
                continue
            block_hash = block_hashes[i]
            key = BlockHashWithGroupId(block_hash + suffix)
            current = block.block_hash
            if current is not None:
                if current == key:
                    continue  # already cached under this key
                if block.block_id in self.partial_block_hash_num_tokens:
                    self._emit_block_removed_events(self._remove_cached_block_hashes(block))
            block.block_hash = key  # raises if the block holds another (full) key
            self.cached_block_hash_to_block.insert(key, block)
            new_hashes.append(block_hash)
            if extra_keys:  # 0.10.2's BlockStored has no extra_keys field
                new_extra_keys.append(self._event_extra_keys(request, i, block_size))
                if new_lookahead is not None:
                    new_lookahead.append(self._lookahead_token_ids(request, (i + 1) * block_size))
        if events and (new_hashes or (sparse and not self.profile.event_parent_from_physical)):
            self.kv_event_queue.append(self._block_stored_event(
                request, blocks, num_cached_blocks, num_full_blocks, block_size,
                kv_cache_group_id, new_hashes, new_extra_keys, block_hashes,
                None if new_lookahead is None else tuple(new_lookahead)))

    def _block_stored_event(
        self,
        request: Request,
        blocks: Sequence[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        group_id: int,
        new_hashes: list[bytes],
        new_extra_keys: list[object],
        block_hashes: Sequence[bytes],
        lookahead_token_ids: tuple[tuple[int, ...], ...] | None = None,
    ) -> KVCacheEvent:
        parent: bytes | None = None
        if num_cached_blocks > 0:
            if self.profile.event_parent_from_physical:
                prev = blocks[num_cached_blocks - 1]
                if prev.is_null or prev.block_hash is None:
                    raise KVCacheMisuseError(
                        "vLLM 0.10.2 fails an assertion here (block_pool.py:150-154): the "
                        f"parent of block {num_cached_blocks} of request "
                        f"{request.request_id!r} (group {group_id}) is "
                        f"{'the null block' if prev.is_null else 'not cached'}; run this "
                        "layout with KV events off")
                parent = get_block_hash(prev.block_hash)
            else:
                # 0.33 uses the logical parent even when the physical one is the null block
                # (test_null_parent_block_hash).
                parent = block_hashes[num_cached_blocks - 1]
        lora = request.lora_request
        tagged = self.profile.extra_key_format == "tagged"
        # Only with lookahead: 0.10.2's wire factory takes no such keyword.
        more = ({} if lookahead_token_ids is None
                else {"lookahead_token_ids": lookahead_token_ids})
        return self.event_factory.BlockStored(  # type: ignore[no-any-return]
            block_hashes=tuple(new_hashes),
            parent_block_hash=parent,
            token_ids=tuple(
                request.all_token_ids[num_cached_blocks * block_size : num_full_blocks * block_size]
            ),
            block_size=block_size,
            lora_id=None if lora is None else lora.lora_int_id,
            medium="GPU",
            lora_name=(None if lora is None else lora.lora_name) if tagged else None,
            extra_keys=(tuple(new_extra_keys) or None) if tagged else None,
            group_idx=group_id,
            **more,
        )

    # ---------------------------------------------------------------- partial-block keys
    def cache_partial_block(
        self,
        request: Request,
        block: KVCacheBlock,
        num_tokens: int,
        kv_cache_group_id: int,
        block_size: int,
        hash_block_size: int,
        replace_existing_hashes: bool = False,
    ) -> BlockHashWithGroupId | None:
        """Make ``block`` reachable from the prefix boundary ``num_tokens`` inside it: key it
        by ``request.block_hashes[num_tokens // hash_block_size - 1] ‖ group id`` (vLLM 0.33's
        ``cache_partial_block``, ``block_pool.py:486-603``; docs/semantics.md#partial-block-keys).

        The key becomes the block's primary key when it has none, else a secondary key; a
        primary partial-block key covering fewer tokens is first replaced (every key of the
        block removed, one ``BlockRemoved`` each). Nothing changes for a key the block
        already carries. Events: one ``BlockStored`` per newly registered key, with
        ``block_size = hash_block_size``, the last ``hash_block_size`` tokens before the
        boundary and the hash before them as parent. ``replace_existing_hashes`` (a Mamba
        prefill checkpoint: the block's content was replaced): every key of the block is
        removed first (one ``BlockRemoved`` each) and the key is always registered anew, as
        its primary key covering ``num_tokens`` (a ``BlockStored`` even for a key it had).

        Returns:
            The key, or None for the null block (never keyed).

        Raises:
            KVCacheMisuseError: sizes that are not multiples of ``hash_block_size``, or a
                boundary beyond the request's hashes.
        """
        if block.is_null:
            return None
        num_hash_blocks = num_tokens // hash_block_size
        if (block_size % hash_block_size or num_tokens % hash_block_size
                or not 0 < num_hash_blocks <= len(request.block_hashes)):
            raise KVCacheMisuseError(
                f"cache_partial_block({request.request_id!r}, block {block.block_id}, "
                f"num_tokens={num_tokens}): needs block size {block_size} and num_tokens "
                f"multiples of the hash block size {hash_block_size}, within the request's "
                f"{len(request.block_hashes)} hashes")
        block_hash = request.block_hashes[num_hash_blocks - 1]
        key = make_block_hash_with_group_id(block_hash, kv_cache_group_id)
        already_cached = (block.block_hash == key
                          or self.cached_block_hash_to_block.contain(key, block.block_id))
        shorter = self.partial_block_hash_num_tokens.get(block.block_id)
        if replace_existing_hashes:
            self._emit_block_removed_events(self._remove_cached_block_hashes(block))
            already_cached = False
        elif not already_cached and shorter is not None and shorter < num_tokens:
            self._emit_block_removed_events(self._remove_cached_block_hashes(block))
        self._insert_partial_block_hash(key, block, num_tokens)
        if self.enable_kv_cache_events and not already_cached:
            self.kv_event_queue.append(self._partial_block_stored_event(
                request, block_hash, num_hash_blocks, hash_block_size, kv_cache_group_id))
        return key

    def _insert_partial_block_hash(self, key: BlockHashWithGroupId, block: KVCacheBlock,
                                   num_tokens: int) -> None:
        """Key ``block`` by ``key`` (primary if it has none, else secondary); a no-op for a
        key it already carries."""
        if block.block_hash == key or self.cached_block_hash_to_block.contain(key,
                                                                              block.block_id):
            return
        if block.block_hash is None:
            block.block_hash = key
            self.partial_block_hash_num_tokens[block.block_id] = num_tokens
        else:
            self.cached_block_hashes_by_block.setdefault(block.block_id, []).append(key)
        self.cached_block_hash_to_block.insert(key, block)

    def _partial_block_stored_event(self, request: Request, block_hash: bytes,
                                    num_hash_blocks: int, hash_block_size: int,
                                    group_id: int) -> KVCacheEvent:
        """0.33's ``BlockStored`` of a partial-block key: one hash, one hash block of tokens
        (the last before the boundary), ``block_size = hash_block_size``."""
        parent = request.block_hashes[num_hash_blocks - 2] if num_hash_blocks > 1 else None
        start = (num_hash_blocks - 1) * hash_block_size
        lora = request.lora_request
        tagged = self.profile.extra_key_format == "tagged"
        more = ({"lookahead_token_ids": (self._lookahead_token_ids(
            request, start + hash_block_size),)} if self.num_hash_lookahead_tokens else {})
        return self.event_factory.BlockStored(  # type: ignore[no-any-return]
            block_hashes=(block_hash,),
            parent_block_hash=parent,
            token_ids=tuple(request.all_token_ids[start : start + hash_block_size]),
            block_size=hash_block_size,
            lora_id=None if lora is None else lora.lora_int_id,
            medium="GPU",
            lora_name=(None if lora is None else lora.lora_name) if tagged else None,
            extra_keys=((self._event_extra_keys(request, num_hash_blocks - 1,
                                                hash_block_size),) if tagged else None),
            group_idx=group_id,
            **more,
        )

    def move_block_hashes(self, src_block: KVCacheBlock, dst_block: KVCacheBlock) -> None:
        """Re-point every cache key of ``src_block`` to ``dst_block`` (vLLM 0.33's
        ``move_block_hashes``, ``block_pool.py:688-704``): a Mamba group's copy-on-write for a
        running request, which keeps writing ``src_block`` while the prefix cache keeps its
        state in the private copy ``dst_block`` under the same keys. The keys stay live (no
        event); the first becomes ``dst_block``'s primary key, carrying the prefix length a
        primary partial-block key of ``src_block`` had, the others secondary keys.

        Raises:
            KVCacheMisuseError: ``dst_block`` already carries a key (vLLM asserts it).
        """
        if dst_block.block_hash is not None or dst_block.block_id in (
                self.cached_block_hashes_by_block):
            raise KVCacheMisuseError(
                f"move_block_hashes({src_block.block_id} -> {dst_block.block_id}): the "
                "destination already carries a cache key (vLLM asserts it has none)")
        num_tokens = self.partial_block_hash_num_tokens.get(src_block.block_id)
        for key in self._remove_cached_block_hashes(src_block):
            if dst_block.block_hash is None:
                dst_block.block_hash = key
                if num_tokens is not None:
                    self.partial_block_hash_num_tokens[dst_block.block_id] = num_tokens
            else:
                self.cached_block_hashes_by_block.setdefault(dst_block.block_id, []).append(key)
            self.cached_block_hash_to_block.insert(key, dst_block)

    def cache_keys_of(self, block: KVCacheBlock) -> list[BlockHashWithGroupId]:
        """Every cache key ``block`` carries: its primary key, then its secondary keys."""
        if block.block_hash is None:
            return []
        return [block.block_hash, *self.cached_block_hashes_by_block.get(block.block_id, ())]

    def _remove_cached_block_hashes(self, block: KVCacheBlock) -> list[BlockHashWithGroupId]:
        """Drop every key of ``block`` from the map (primary first) and reset its hash;
        returns the keys that were in the map (vLLM 0.33's ``_remove_cached_block_hashes``)."""
        keys = self.cache_keys_of(block)
        self.cached_block_hashes_by_block.pop(block.block_id, None)
        self.partial_block_hash_num_tokens.pop(block.block_id, None)
        block.reset_hash()
        pop = self.cached_block_hash_to_block.pop
        return [key for key in keys if pop(key, block.block_id) is not None]

    def _emit_block_removed_events(self, keys: Sequence[BlockHashWithGroupId]) -> None:
        """One ``BlockRemoved`` per removed key, in order (events on only)."""
        if not self.enable_kv_cache_events:
            return
        for key in keys:
            self.kv_event_queue.append(
                self.event_factory.BlockRemoved(block_hashes=(get_block_hash(key),),
                                                medium="GPU", group_idx=get_group_id(key)))

    def _event_extra_keys(self, request: Request, block_idx: int, block_size: int) -> object:
        """The untagged extra keys of one block, as 0.33's BlockStored publishes them: over
        the block and, with hash lookahead, its lookahead tokens (the hash's window)."""
        start = block_idx * block_size
        keys, _ = generate_block_hash_extra_keys(
            request, start, start + block_size + self.num_hash_lookahead_tokens, 0, self.profile
        )
        return to_event_extra_keys(keys)

    def _lookahead_token_ids(self, request: Request, block_end: int) -> tuple[int, ...]:
        """The tokens after ``block_end`` a lookahead hash covers (vLLM 0.33's
        ``_lookahead_token_ids``)."""
        return tuple(request.all_token_ids[block_end : block_end
                                           + self.num_hash_lookahead_tokens])

    # ---------------------------------------------------------------- allocation
    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop ``num_blocks`` blocks from the head of the free queue, in queue order.

        Each popped block is evicted from the prefix cache (every key it holds is removed,
        with one ``BlockRemoved`` per key) and gets ``ref_cnt = 1``.

        Raises:
            KVCacheMisuseError: ``"Cannot get n free blocks from the pool"`` when short; nothing
                changes.
        """
        if num_blocks < 0:
            raise KVCacheMisuseError(f"get_new_blocks({num_blocks}): count must be >= 0")
        if num_blocks > self.get_num_free_blocks():
            raise KVCacheMisuseError(f"Cannot get {num_blocks} free blocks from the pool")
        ret = self.free_block_queue.popleft_n(num_blocks)
        for block in ret:
            if self.enable_caching:
                self._maybe_evict_cached_block(block)
            assert block.ref_cnt == 0, f"block {block.block_id} popped with ref_cnt {block.ref_cnt}"
            block.ref_cnt = 1
        return ret

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        """Drop every key of ``block`` from the map (one ``BlockRemoved`` each, primary
        first) and reset its hash; True if one was in the map."""
        key = block.block_hash
        if key is None:
            return False
        if self.partial_block_hash_num_tokens or self.cached_block_hashes_by_block:
            # Some block carries a partial-block key (a coarse full-attention group).
            removed = self._remove_cached_block_hashes(block)
            self._emit_block_removed_events(removed)
            return bool(removed)
        block.reset_hash()
        if self.cached_block_hash_to_block.pop(key, block.block_id) is None:
            return False
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(
                self.event_factory.BlockRemoved(block_hashes=(get_block_hash(key),),
                                                medium="GPU", group_idx=get_group_id(key))
            )
        return True

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Pin prefix-cache hits: remove each free block from the queue, then ``ref_cnt += 1``.

        ``vllm-0.33`` skips null blocks; ``vllm-0.10`` increments the null block's ``ref_cnt``
        (and never dequeues it, as it is never enqueued).
        """
        for block in blocks:
            if block.is_null:
                if self.profile.touch_null_ref_cnt:
                    block.ref_cnt += 1
                continue
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference from each block, in the given order (a request frees its
        blocks in reverse, so its last block comes first).

        Blocks that reach ``ref_cnt == 0`` are enqueued per the profile's ``free_order``.

        Raises:
            KVCacheMisuseError: a block listed twice in one call, or freed while its
                ``ref_cnt`` is already 0 (vLLM would corrupt its queue); nothing changes.
        """
        blocks = list(ordered_blocks)
        seen: set[int] = set()
        for block in blocks:
            if block.is_null:
                continue
            if block.block_id in seen:
                raise KVCacheMisuseError(
                    f"block {block.block_id} is listed twice in one free_blocks call; "
                    "free each block once per reference"
                )
            seen.add(block.block_id)
            if block.ref_cnt <= 0:
                raise KVCacheMisuseError(
                    f"double free: block {block.block_id} has ref_cnt {block.ref_cnt}"
                )
        self._drop_references(blocks)

    def _drop_references(self, blocks: Sequence[KVCacheBlock]) -> None:
        """One reference dropped per entry of ``blocks``, in order; those reaching
        ``ref_cnt == 0`` enqueued per the profile's ``free_order`` (checked by the caller)."""
        freed: list[KVCacheBlock] = []
        for block in blocks:
            if block.is_null:
                if self.profile.touch_null_ref_cnt:
                    block.ref_cnt -= 1  # 0.10.2 decrements it but never enqueues it
                continue
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                freed.append(block)
        if self.profile.free_order == "append_all":
            self.free_block_queue.append_n(freed)
            return
        # head_tail_split: unhashed (or caching off) to the head for LIFO reuse, cached
        # blocks to the tail so the LRU order of real cache entries is kept.
        evict_first = [b for b in freed if b.block_hash is None or not self.enable_caching]
        evict_last = [b for b in freed if b.block_hash is not None and self.enable_caching]
        self.free_block_queue.prepend_n(evict_first)
        self.free_block_queue.append_n(evict_last)

    def free_retained_blocks(self, ordered_blocks: Sequence[KVCacheBlock]) -> None:
        """``free_blocks`` for the blocks a copy-on-write retained
        (``KVCacheManager.take_kv_cache_block_copies``: ``[src, dst, src, dst, ...]``), which
        vLLM 0.33's scheduler hands to its ``BlockPool.free_blocks`` at the end of a step
        (``sched/scheduler.py:1698-1706``, ``_free_cow_retained_blocks``): one reference
        dropped per occurrence, in order, blocks reaching ``ref_cnt == 0`` enqueued as
        ``free_blocks`` enqueues them. Unlike ``free_blocks`` a block may be listed more than
        once (two requests that hit the same source block in one step), as vLLM's
        ``free_blocks`` allows.

        Raises:
            KVCacheMisuseError: a block listed more often than it has references; nothing
                changes.
        """
        counts: dict[int, int] = {}
        for block in ordered_blocks:
            if block.is_null:
                continue
            counts[block.block_id] = counts.get(block.block_id, 0) + 1
            if counts[block.block_id] > block.ref_cnt:
                raise KVCacheMisuseError(
                    f"free_retained_blocks: block {block.block_id} is listed "
                    f"{counts[block.block_id]} times but has ref_cnt {block.ref_cnt}")
        # Copies retain no null block: nothing here touches the null block's ref_cnt.
        self._drop_references([b for b in ordered_blocks if not b.is_null])

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop the cache keys of ``block_ids`` regardless of ``ref_cnt``; queue order is
        unchanged (0.33 only).

        Raises:
            KVCacheMisuseError: for an id outside ``[0, num_gpu_blocks)``; nothing changes.
        """
        ids = list(block_ids)
        bad = [i for i in ids if not 0 <= i < self.num_gpu_blocks]
        if bad:
            raise KVCacheMisuseError(
                f"evict_blocks: block ids {bad} outside [0, {self.num_gpu_blocks})"
            )
        for block_id in ids:
            self._maybe_evict_cached_block(self.blocks[block_id])

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash, keeping the free-queue order.

        Returns False (and changes nothing) unless every block but the null block is free.
        """
        num_used_blocks = self.num_gpu_blocks - self.get_num_free_blocks()
        if num_used_blocks != 1:
            return False
        self.cached_block_hash_to_block.clear()
        self.cached_block_hashes_by_block.clear()
        self.partial_block_hash_num_tokens.clear()
        for block in self.blocks:
            block.reset_hash()
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(self.event_factory.AllBlocksCleared())
        return True

    # ---------------------------------------------------------------- counts
    def get_num_free_blocks(self) -> int:
        """Free blocks, evictable cached blocks included."""
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """Fraction of usable blocks in use: ``1 - free / (N - 1)``; 0.0 when N == 1."""
        total = self.num_gpu_blocks - 1
        if total <= 0:
            return 0.0
        return 1.0 - self.get_num_free_blocks() / total

    def take_events(self) -> list[KVCacheEvent]:
        """Drain the event queue (always ``[]`` when events are disabled)."""
        events, self.kv_event_queue = self.kv_event_queue, []
        return events
