"""``KVCacheManager``: request-level block management for one full-attention group.

Token layout of one ``allocate_slots`` call (vLLM ``kv_cache_manager.py`` docstring)::

    | comp | new_comp |        new        | lookahead |
    comp      = request.num_computed_tokens (KV already held by the request)
    new_comp  = prefix-cache hits found by get_computed_blocks (whole blocks)
    new       = tokens computed in this step
    lookahead = speculative slots (never cached)

    slots needed  = min(comp + new_comp + new + lookahead, max_model_len)
    tokens cached = min(comp + new_comp + new, request.num_tokens)

The manager never advances ``request.num_computed_tokens``; the caller (a scheduler) does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvcheck.reference_impl.block import BlockHashWithGroupId, KVCacheBlock, group_id_suffix
from kvcheck.reference_impl.block_hasher import RequestBlockHasher
from kvcheck.reference_impl.block_pool import BlockPool
from kvcheck.reference_impl.errors import KVCacheMisuseError
from kvcheck.reference_impl.events import KVCacheEvent
from kvcheck.reference_impl.hashing import resolve_none_hash
from kvcheck.reference_impl.profiles import ProfileBehaviour, get_profile
from kvcheck.reference_impl.request import Request, RequestOptions

if TYPE_CHECKING:  # typing.Unpack is 3.11+; only mypy reads this annotation
    from typing_extensions import Unpack

__all__ = ["PYTHONHASHSEED_FROM_ENV", "KVCacheManager", "make_block_hasher"]

#: The key suffix of the one group a single-group manager has (``group_id_suffix(0)``).
_GROUP_0_SUFFIX = group_id_suffix(0)

#: ``pythonhashseed``'s default in the managers: take the NONE_HASH from the environment.
PYTHONHASHSEED_FROM_ENV = object()


def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative ints."""
    return -(-a // b)


def make_block_hasher(block_size: int, hash_algo: str, profile: ProfileBehaviour,
                      pythonhashseed: object = PYTHONHASHSEED_FROM_ENV,
                      none_hash: bytes | None = None) -> RequestBlockHasher:
    """The hasher of a manager's requests (``KVCacheManager``, ``HybridKVCacheManager``):
    hashes of ``block_size``-token blocks with ``hash_algo``; its NONE_HASH is ``none_hash``
    when given, else the one ``pythonhashseed`` gives, else the environment's."""
    if none_hash is None and pythonhashseed is not PYTHONHASHSEED_FROM_ENV:
        none_hash = resolve_none_hash(hash_algo, profile, pythonhashseed)  # type: ignore[arg-type]
    return RequestBlockHasher(block_size, hash_algo, profile=profile, none_hash=none_hash)


class KVCacheManager:
    """Allocation, prefix caching and freeing for requests over one ``BlockPool``.

    Args:
        num_blocks: blocks in the pool, the null block 0 included.
        block_size: tokens per block.
        max_model_len: cap on slots per request (None: no cap).
        enable_caching: prefix caching on/off.
        hash_algo: ``sha256`` (default), ``sha256_cbor``, ``xxhash``, ``xxhash_cbor``.
        profile: version profile (default ``vllm-0.33``).
        enable_kv_cache_events: record KV events (``take_events``).
        pythonhashseed: the PYTHONHASHSEED the NONE_HASH is derived from; by default the
            environment's. ``None`` means unset.
        none_hash: force a NONE_HASH (overrides ``pythonhashseed``).
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        max_model_len: int | None = None,
        enable_caching: bool = True,
        hash_algo: str = "sha256",
        profile: str | ProfileBehaviour | None = None,
        enable_kv_cache_events: bool = False,
        pythonhashseed: object = PYTHONHASHSEED_FROM_ENV,
        none_hash: bytes | None = None,
    ) -> None:
        if not isinstance(block_size, int) or block_size < 1:
            raise KVCacheMisuseError(f"block_size must be an int >= 1, got {block_size!r}")
        if max_model_len is not None and max_model_len < 1:
            raise KVCacheMisuseError(f"max_model_len must be >= 1 or None, got {max_model_len!r}")
        self.profile = get_profile(profile)
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(
            num_blocks, enable_caching, enable_kv_cache_events, profile=self.profile
        )
        # Built even with caching off so requests can still be hashed (vLLM builds it when a
        # KV connector needs hashes); the manager itself ignores hashes when caching is off.
        self.block_hasher = make_block_hasher(block_size, hash_algo, self.profile,
                                              pythonhashseed, none_hash)
        # request_id -> the request's blocks in logical order (the block table).
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # request_id -> how many leading blocks of the request are already cached.
        self.num_cached_block: dict[str, int] = {}

    # ---------------------------------------------------------------- convenience
    def make_request(self, request_id: str, prompt_token_ids: Sequence[int],
                     **kwargs: Unpack[RequestOptions]) -> Request:
        """A ``Request`` hashed with this manager's block size, algorithm and NONE_HASH."""
        return Request(request_id, prompt_token_ids, block_hasher=self.block_hasher, **kwargs)

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.get_num_free_blocks()

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    # ---------------------------------------------------------------- prefix cache
    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The longest cached prefix of whole blocks: ``(blocks, num_computed_tokens)``.

        The hit is capped at ``request.num_tokens - 1`` tokens: the last token is always
        recomputed to obtain logits, so a block-aligned prompt of n blocks hits at most n - 1.
        Returns ``([], 0)`` with caching off or when ``request.skip_reading_prefix_cache``.
        No side effects: ``ref_cnt`` and free-queue order are unchanged.
        (vLLM 0.33 returns a third element, the shared-prefix boundary, always derivable.)
        """
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return [], 0
        max_cache_hit_length = request.num_tokens - 1
        max_num_blocks = max_cache_hit_length // self.block_size
        computed: list[KVCacheBlock] = []
        # BlockPool.get_cached_block(block_hash, (0,)) for one group, unrolled: this loop runs
        # once per prompt block of every admission.
        lookup = self.block_pool.cached_block_hash_to_block.get_one_block
        suffix = _GROUP_0_SUFFIX
        for block_hash in request.block_hashes[:max_num_blocks]:
            hit = lookup(BlockHashWithGroupId(block_hash + suffix))
            if hit is None:
                break
            computed.append(hit)
        return computed, len(computed) * self.block_size

    # ---------------------------------------------------------------- allocation
    def get_num_blocks_to_allocate(
        self,
        request: Request,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
    ) -> int:
        """Free blocks this step consumes: new blocks plus hits that are currently free
        (touching them takes them out of the free queue)."""
        held = len(self.req_to_blocks.get(request.request_id, ()))
        num_required = cdiv(num_tokens, self.block_size)
        num_new = num_required - len(new_computed_blocks) - held
        if num_new < 0 and self.profile.clamp_blocks_to_allocate:
            num_new = 0
        if not new_computed_blocks:  # every decode step: nothing to count
            return num_new
        num_free_hits = sum(1 for b in new_computed_blocks if b.ref_cnt == 0 and not b.is_null)
        return num_new + num_free_hits

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: Sequence[KVCacheBlock] | None = None,
        num_lookahead_tokens: int = 0,
        delay_cache_blocks: bool = False,
    ) -> list[KVCacheBlock] | None:
        """Make room for ``num_new_tokens`` (plus hits and lookahead) and return only the
        newly allocated blocks, in block-table order.

        All-or-nothing: returns None and changes nothing (not even the hits' ``ref_cnt`` or
        queue positions) when the pool is short. Otherwise the hits are touched **before**
        new blocks are popped, so the request's own hits are never evicted for it, and the
        blocks that became full are cached.

        Raises:
            KVCacheMisuseError: negative counts, hits passed for a running request, or hits
                whose token count does not match ``len(new_computed_blocks) * block_size``.
            KVCacheMisuseError: nothing to allocate (``num_new_tokens == 0`` without hits; in
                ``vllm-0.10`` any ``num_new_tokens == 0``).
        """
        hits = list(new_computed_blocks) if new_computed_blocks else []
        if num_new_tokens < 0 or num_new_computed_tokens < 0 or num_lookahead_tokens < 0:
            # One comparison chain on the hot path; the loop only names the culprit.
            for name, value in (
                ("num_new_tokens", num_new_tokens),
                ("num_new_computed_tokens", num_new_computed_tokens),
                ("num_lookahead_tokens", num_lookahead_tokens),
            ):
                if value < 0:
                    raise KVCacheMisuseError(
                        f"allocate_slots({request.request_id!r}): {name} must be >= 0, got "
                        f"{value}"
                    )
        if num_new_computed_tokens != len(hits) * self.block_size:
            raise KVCacheMisuseError(
                f"allocate_slots({request.request_id!r}): num_new_computed_tokens="
                f"{num_new_computed_tokens} but {len(hits)} hit blocks of {self.block_size} "
                "tokens were passed; pass what get_computed_blocks returned"
            )
        if num_new_tokens == 0 and (
            self.profile.allocate_zero_new_tokens_raises_always or not hits
        ):
            raise KVCacheMisuseError("num_new_tokens must be greater than 0")
        is_running = request.request_id in self.num_cached_block
        if hits and is_running:
            raise KVCacheMisuseError(
                f"allocate_slots({request.request_id!r}): prefix-cache hits can only be added "
                "to a request that holds no blocks yet"
            )
        if hits and not self.enable_caching:
            raise KVCacheMisuseError("prefix-cache hits passed while caching is disabled")

        num_computed_tokens = request.num_computed_tokens + num_new_computed_tokens
        num_tokens_need_slot = num_computed_tokens + num_new_tokens + num_lookahead_tokens
        if self.max_model_len is not None:
            num_tokens_need_slot = min(num_tokens_need_slot, self.max_model_len)

        num_blocks_to_allocate = self.get_num_blocks_to_allocate(
            request, num_tokens_need_slot, hits
        )
        if num_blocks_to_allocate > self.block_pool.get_num_free_blocks():
            return None

        # Touch first: a hit sitting in the free queue must leave it before get_new_blocks
        # pops from the head, or this request could evict its own prefix
        # (test_computed_blocks_not_evicted).
        if hits and self.enable_caching:
            self.block_pool.touch(hits)
        req_blocks = self.req_to_blocks.setdefault(request.request_id, [])
        if not is_running:
            req_blocks.extend(hits)
            self.num_cached_block[request.request_id] = len(hits)

        num_new_blocks = cdiv(num_tokens_need_slot, self.block_size) - len(req_blocks)
        new_blocks: list[KVCacheBlock] = []
        if num_new_blocks > 0:
            new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
            req_blocks.extend(new_blocks)

        if self.enable_caching and not delay_cache_blocks:
            # Drafts and lookahead slots are never cached.
            num_tokens_to_cache = min(num_computed_tokens + num_new_tokens, request.num_tokens)
            self.cache_blocks(request, num_tokens_to_cache)
        return new_blocks

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache the request's blocks that became full within its first ``num_tokens``
        tokens; already-cached blocks are skipped."""
        num_cached = self.num_cached_block.get(request.request_id, 0)
        num_full = min(num_tokens, len(request.block_hashes) * self.block_size) // self.block_size
        if num_cached >= num_full:
            return
        self.block_pool.cache_full_blocks(
            request, self.req_to_blocks[request.request_id], num_cached, num_full,
            self.block_size, 0,
        )
        self.num_cached_block[request.request_id] = num_full

    # ---------------------------------------------------------------- release
    def free(self, request: Request | str) -> None:
        """Release every block of the request in reverse order (last block first), so its
        deepest cached block is evicted before its ancestors. Unknown requests are a no-op."""
        request_id = request if isinstance(request, str) else request.request_id
        blocks = self.req_to_blocks.pop(request_id, [])
        self.num_cached_block.pop(request_id, None)
        self.block_pool.free_blocks(reversed(blocks))

    def reset_prefix_cache(self) -> bool:
        """Drop every cached hash; False (nothing changed) while any block is in use."""
        return self.block_pool.reset_prefix_cache()

    # ---------------------------------------------------------------- queries
    def get_blocks(self, request_id: str) -> list[KVCacheBlock]:
        """The request's blocks in logical order (empty for an unknown request)."""
        return list(self.req_to_blocks.get(request_id, ()))

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table: physical block ids in logical (token) order."""
        return [b.block_id for b in self.req_to_blocks.get(request_id, ())]

    def get_num_common_prefix_blocks(self, request_id: str, num_running_requests: int) -> int:
        """``vllm-0.10``: leading blocks held by every running request (``ref_cnt ==
        num_running_requests``); ``vllm-0.33``: always 0 (cascade attention was removed)."""
        if not self.profile.live_common_prefix_blocks:
            return 0
        n = 0
        for block in self.req_to_blocks.get(request_id, ()):
            if block.ref_cnt != num_running_requests:
                break
            n += 1
        return n

    def take_events(self) -> list[KVCacheEvent]:
        """Drain the pool's KV events."""
        return self.block_pool.take_events()
