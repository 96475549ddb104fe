"""``HybridKVCacheManager``: vLLM's ``KVCacheManager`` over several KV-cache groups
(docs/semantics.md#kv-cache-sizing), for full-attention, sliding-window and chunked-local groups
sharing one block pool.

The single-group ``KVCacheManager`` stays the fast path for one full-attention group; this
class is the grouped form: hits, new blocks and block tables are one list per group (block 0
is the null block where a window or a finished chunk no longer needs a block). Token layout
of ``allocate_slots`` as in ``kv_cache_manager``.

Block sizes (0.33): ``scheduler_block_size = lcm`` of the group block sizes, ``hash_block_size
= gcd`` (caching on; ``scheduler_block_size`` with caching off); one group: both are its block
size. Request hashes are computed at ``hash_block_size``. 0.10.2: with caching on every group
has the same block size.

Order of effects in ``allocate_slots``: (1) nothing to compute → error; (2) every group drops
the blocks its window skipped (even if the allocation then fails); (3) capacity check over
all groups, None when short; (4) hits adopted, group by group; (5) new blocks popped, group by
group (group 0 takes the queue head first); (6) newly full blocks cached, group by group.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvcheck.reference_impl.block import KVCacheBlock
from kvcheck.reference_impl.errors import KVCacheMisuseError
from kvcheck.reference_impl.events import KVCacheEvent
from kvcheck.reference_impl.kv_cache_coordinator import (
    KVCacheCoordinator,
    get_kv_cache_coordinator,
)
from kvcheck.reference_impl.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    SlidingWindowSpec,
    get_kv_cache_spec_kind,
    get_kv_cache_spec_sliding_window,
)
from kvcheck.reference_impl.kv_cache_manager import PYTHONHASHSEED_FROM_ENV, make_block_hasher
from kvcheck.reference_impl.profiles import ProfileBehaviour, get_profile
from kvcheck.reference_impl.request import Request, RequestOptions
from kvcheck.reference_impl.single_type_kv_cache_manager import cdiv

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["HybridKVCacheManager", "resolve_kv_cache_block_sizes"]


def resolve_kv_cache_block_sizes(specs: Sequence[KVCacheSpec], enable_caching: bool,
                                 profile: ProfileBehaviour) -> tuple[int, int]:
    """``(scheduler_block_size, hash_block_size)`` for ``specs``
    (docs/semantics.md#kv-cache-sizing).

    Raises:
        KVCacheMisuseError: no group; 0.10.2 with caching and differing block sizes.
    """
    if not specs:
        raise KVCacheMisuseError("a grouped KV cache needs at least one group")
    sizes = [s.block_size for s in specs]
    if profile.hybrid_rules == "full_and_other":
        if enable_caching and len(set(sizes)) != 1:
            raise KVCacheMisuseError(
                f"vLLM 0.10.2 supports one block size with prefix caching, got {sizes} "
                "(kv_cache_manager.py:106-109: 'Only one block size is supported for now')")
        return math.lcm(*sizes), math.gcd(*sizes)
    scheduler = math.lcm(*sizes)
    if len(specs) == 1:
        return scheduler, scheduler
    return scheduler, (math.gcd(*sizes) if enable_caching else scheduler)


class HybridKVCacheManager:
    """Allocation, prefix caching and freeing over several KV-cache groups.

    Args:
        num_blocks: blocks in the shared pool, the null block 0 included.
        kv_cache_specs: one spec per group, in vLLM's group order.
        max_model_len: cap on slots per request (None: no cap).
        enable_caching: prefix caching on/off.
        hash_algo: as for ``KVCacheManager``.
        profile: ``vllm-0.33`` (default) or ``vllm-0.10``.
        enable_kv_cache_events: record KV events (``take_events``).
        pythonhashseed / none_hash: as for ``KVCacheManager``.
        prefix_cache_retention_interval: 0.33's ``KVCacheConfig`` field (ignored by 0.10).

    Raises:
        KVCacheMisuseError: the layout breaks one of vLLM's rules
        (docs/semantics.md#allocation-caching-freeing-and-events-with-several-groups): the message
        names it.
    """

    def __init__(
        self,
        num_blocks: int,
        kv_cache_specs: Sequence[KVCacheSpec],
        *,
        max_model_len: int | None = None,
        enable_caching: bool = True,
        hash_algo: str = "sha256",
        profile: str | ProfileBehaviour | None = None,
        enable_kv_cache_events: bool = False,
        pythonhashseed: object = PYTHONHASHSEED_FROM_ENV,
        none_hash: bytes | None = None,
        prefix_cache_retention_interval: int | None = None,
    ) -> None:
        if max_model_len is not None and max_model_len < 1:
            raise KVCacheMisuseError(f"max_model_len must be >= 1 or None, got {max_model_len!r}")
        self.profile = get_profile(profile)
        self.v033 = self.profile.hybrid_rules == "spec_groups"
        specs = tuple(kv_cache_specs)
        for spec in specs:
            if not isinstance(spec, KVCacheSpec):
                raise KVCacheMisuseError(f"not a KV-cache spec: {spec!r}")
        self.kv_cache_specs = specs
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.scheduler_block_size, self.hash_block_size = resolve_kv_cache_block_sizes(
            specs, enable_caching, self.profile)
        retention = prefix_cache_retention_interval if self.v033 else None
        if self.v033:
            self._validate_retention(retention)
        self._check_supported(specs, enable_caching, enable_kv_cache_events)
        self.coordinator: KVCacheCoordinator = get_kv_cache_coordinator(
            specs, num_blocks, profile=self.profile, enable_caching=enable_caching,
            enable_kv_cache_events=enable_kv_cache_events,
            scheduler_block_size=self.scheduler_block_size,
            hash_block_size=self.hash_block_size, retention_interval=retention)
        self.block_pool = self.coordinator.block_pool
        self.block_hasher = make_block_hasher(self.hash_block_size, hash_algo, self.profile,
                                              pythonhashseed, none_hash)
        #: Per group ``(kind, sliding_window)`` as 0.33's ``take_events`` annotates events.
        self.kv_cache_event_metadata: tuple[tuple[str, int | None], ...] = tuple(
            (get_kv_cache_spec_kind(s), get_kv_cache_spec_sliding_window(s)) for s in specs)
        # request id -> shared_prefix_boundary of its last get_computed_blocks (0.33; vLLM's
        # scheduler stores it on the request).
        self._shared_prefix_boundary: dict[str, int] = {}

    def _validate_retention(self, retention: int | None) -> None:
        if retention is None:
            return
        if not any(isinstance(s, SlidingWindowSpec) for s in self.kv_cache_specs):
            if retention == 0:
                return
            raise KVCacheMisuseError(
                "prefix_cache_retention_interval is set but this model has no sliding-window "
                "KV cache group, so retention has no effect (vLLM 0.33 raises ValueError)")
        if retention < 0 or retention % self.scheduler_block_size:
            raise KVCacheMisuseError(
                f"prefix_cache_retention_interval ({retention}) must be non-negative and a "
                f"multiple of scheduler_block_size ({self.scheduler_block_size})")

    def _check_supported(self, specs: tuple[KVCacheSpec, ...], enable_caching: bool,
                         events: bool) -> None:
        if self.v033 and enable_caching:
            coarse = [s.block_size for s in specs
                      if isinstance(s, FullAttentionSpec) and s.block_size > self.hash_block_size]
            if coarse:
                raise KVCacheMisuseError(
                    "a full-attention group whose block size exceeds the hash block size "
                    f"({self.hash_block_size}) registers partial-block cache keys in vLLM 0.33 "
                    "(_cache_partial_tail_block); the reference does not model them")
        if not self.v033 and enable_caching and events:
            risky = [s for s in specs if isinstance(s, ChunkedLocalAttentionSpec) or (
                isinstance(s, SlidingWindowSpec) and s.sliding_window - 1 < s.block_size)]
            if risky:
                raise KVCacheMisuseError(
                    "vLLM 0.10.2 fails an assertion (block_pool.py:150-154) when KV events are "
                    "on and a newly cached block's parent is the null block, which chunked "
                    "local attention and sliding windows with w - 1 < block_size reach; run "
                    f"{risky[0]!r} with enable_kv_cache_events=False")

    # ---------------------------------------------------------------- convenience
    def make_request(self, request_id: str, prompt_token_ids: Sequence[int],
                     **kwargs: Unpack[RequestOptions]) -> Request:
        """A ``Request`` hashed at the hash block size with this manager's NONE_HASH."""
        return Request(request_id, prompt_token_ids, block_hasher=self.block_hasher, **kwargs)

    @property
    def num_kv_cache_groups(self) -> int:
        return len(self.kv_cache_specs)

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.get_num_free_blocks()

    # ---------------------------------------------------------------- prefix cache
    def get_computed_blocks(self, request: Request,
                            ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        """Per-group hit blocks (nulls included) and the common hit length, capped at
        ``num_tokens - 1`` tokens. No side effects on the pool."""
        empty: tuple[list[KVCacheBlock], ...] = tuple([] for _ in self.kv_cache_specs)
        if not self.enable_caching or request.skip_reading_prefix_cache:
            self._shared_prefix_boundary.pop(request.request_id, None)
            return empty, 0
        blocks, length, uncached = self.coordinator.find_longest_cache_hit(
            request, request.num_tokens - 1)
        self._shared_prefix_boundary[request.request_id] = length + uncached if uncached else 0
        if not any(blocks):
            return empty, 0
        return blocks, length

    # ---------------------------------------------------------------- allocation
    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: Sequence[Sequence[KVCacheBlock]] | None = None,
        num_lookahead_tokens: int = 0,
    ) -> tuple[list[KVCacheBlock], ...] | None:
        """Slots for ``num_computed + num_new_computed + num_new (+ lookahead)`` tokens in
        every group; returns the newly allocated blocks per group, or None when the pool is
        short (the skipped blocks of step (2) stay freed, as in vLLM).

        Raises:
            KVCacheMisuseError: negative counts; hits of the wrong shape; hits for a running
                request; nothing to compute (0.33: no new and no computed tokens; 0.10: any
                ``num_new_tokens == 0``).
        """
        rid = request.request_id
        num_groups = len(self.kv_cache_specs)
        for name, value in (("num_new_tokens", num_new_tokens),
                            ("num_new_computed_tokens", num_new_computed_tokens),
                            ("num_lookahead_tokens", num_lookahead_tokens)):
            if value < 0:
                raise KVCacheMisuseError(
                    f"allocate_slots({rid!r}): {name} must be >= 0, got {value}")
        if self.v033:
            if num_new_tokens == 0 and num_new_computed_tokens == 0:
                raise KVCacheMisuseError(
                    "num_new_tokens must be greater than 0 when there are no computed tokens "
                    "to adopt")
        elif num_new_tokens == 0:
            raise KVCacheMisuseError("num_new_tokens must be greater than 0")
        hits: tuple[list[KVCacheBlock], ...] = tuple(
            list(g) for g in (new_computed_blocks or ()))
        if not hits:
            hits = tuple([] for _ in range(num_groups))
        if len(hits) != num_groups:
            raise KVCacheMisuseError(
                f"allocate_slots({rid!r}): {len(hits)} hit lists for {num_groups} groups")
        has_hits = any(hits)
        if has_hits and not self.enable_caching:
            raise KVCacheMisuseError("prefix-cache hits passed while caching is disabled")
        if has_hits and self.coordinator.is_running(rid):
            raise KVCacheMisuseError(
                f"allocate_slots({rid!r}): prefix-cache hits can only be added to a request "
                "that holds no blocks yet")
        for spec, group in zip(self.kv_cache_specs, hits, strict=True):
            if has_hits and len(group) * spec.block_size != num_new_computed_tokens:
                raise KVCacheMisuseError(
                    f"allocate_slots({rid!r}): num_new_computed_tokens="
                    f"{num_new_computed_tokens} but a group of block size {spec.block_size} "
                    f"got {len(group)} hit blocks; pass what get_computed_blocks returned")

        num_local_computed = request.num_computed_tokens + num_new_computed_tokens
        total_computed = num_local_computed
        num_tokens_need_slot = num_local_computed + num_new_tokens + num_lookahead_tokens
        if self.max_model_len is not None:
            total_computed = min(total_computed, self.max_model_len)
            num_tokens_need_slot = min(num_tokens_need_slot, self.max_model_len)

        coordinator = self.coordinator
        coordinator.remove_skipped_blocks(
            rid, total_computed if self.v033 else request.num_computed_tokens)
        need = coordinator.get_num_blocks_to_allocate(
            rid, num_tokens_need_slot, hits, num_local_computed)
        if need > self.block_pool.get_num_free_blocks():
            return None
        if self.v033:
            if has_hits:
                coordinator.add_computed_blocks(rid, hits, num_local_computed)
        else:
            coordinator.add_computed_blocks(rid, hits, num_local_computed)
        new_blocks = coordinator.allocate_new_blocks(rid, num_tokens_need_slot)
        if self.enable_caching:
            num_tokens_to_cache = min(total_computed + num_new_tokens, request.num_tokens)
            coordinator.cache_blocks(request, num_tokens_to_cache,
                                     self._shared_prefix_boundary.get(rid, 0))
        return new_blocks

    # ---------------------------------------------------------------- release
    def free(self, request: Request | str) -> None:
        """Release the request's blocks, group by group (each table reversed). Unknown
        requests are a no-op."""
        rid = request if isinstance(request, str) else request.request_id
        self._shared_prefix_boundary.pop(rid, None)
        self.coordinator.free(rid)

    def reset_prefix_cache(self) -> bool:
        """Drop every cached hash; False (nothing changed) while any block is in use."""
        return self.block_pool.reset_prefix_cache()

    # ---------------------------------------------------------------- queries
    def get_blocks(self, request_id: str) -> tuple[list[KVCacheBlock], ...]:
        """Per-group block tables (nulls included; empty lists for an unknown request)."""
        return self.coordinator.get_blocks(request_id)

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """Per-group block ids (0 = null block)."""
        return tuple([b.block_id for b in group] for group in self.get_blocks(request_id))

    def num_blocks_needed(self, num_tokens: int, group: int) -> int:
        """Blocks group ``group`` needs for ``num_tokens`` slots, nulls included."""
        return cdiv(num_tokens, self.kv_cache_specs[group].block_size)

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first broken law: ``ref_cnt`` of every non-null
        block equals its holders (request, group); a held block belongs to one group and its
        cache key names that group; free and held blocks are disjoint and cover the pool
        (null excluded); the null block is never queued (and, 0.33, keeps ``ref_cnt`` 0)."""
        pool = self.block_pool
        holders: dict[int, int] = {}
        owner: dict[int, int] = {}
        for gid, manager in enumerate(self.coordinator.single_type_managers):
            for rid, blocks in manager.req_to_blocks.items():
                for block in blocks:
                    if block.is_null:
                        continue
                    holders[block.block_id] = holders.get(block.block_id, 0) + 1
                    first = owner.setdefault(block.block_id, gid)
                    assert first == gid, (
                        f"one group per block: block {block.block_id} is held by groups "
                        f"{first} and {gid} (request {rid!r})")
        queued = [b.block_id for b in pool.free_block_queue]
        assert len(set(queued)) == len(queued), f"free queue lists a block twice: {queued}"
        assert 0 not in queued, "the null block is in the free queue"
        free = set(queued)
        for block in pool.blocks[1:]:
            held = holders.get(block.block_id, 0)
            assert block.ref_cnt == held, (
                f"ref_cnt: block {block.block_id} has ref_cnt {block.ref_cnt} but {held} "
                "holders")
            assert (held == 0) == (block.block_id in free), (
                f"free/held: block {block.block_id} held {held} times, queued "
                f"{block.block_id in free}")
            key = block.block_hash
            if key is not None and block.block_id in owner:
                gid = int.from_bytes(key[-4:], "big")
                assert gid == owner[block.block_id], (
                    f"cache key group: block {block.block_id} of group "
                    f"{owner[block.block_id]} is cached under group {gid}")
        if self.v033:
            assert pool.null_block.ref_cnt == 0, (
                f"null block ref_cnt {pool.null_block.ref_cnt} (0.33 never touches it)")

    def take_events(self) -> list[KVCacheEvent]:
        """Drain the pool's KV events (``kv_cache_event_metadata[group_idx]`` gives the
        ``(kind, sliding_window)`` 0.33 attaches to a ``BlockStored``)."""
        return self.block_pool.take_events()
