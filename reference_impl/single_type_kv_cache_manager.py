"""Per-group managers (vLLM ``v1/core/single_type_kv_cache_manager.py``): one per KV-cache
group of a ``KVCacheManager`` (one group or several), all over one shared ``BlockPool``
(docs/semantics.md#kv-cache-groups-hybrid-models).

State per request: ``req_to_blocks[rid]`` (the group's block table, null blocks included) and
``num_cached_block[rid]`` (blocks already hashed; its presence marks a running request). The
profile's ``hybrid_rules`` selects vLLM 0.33's (``"spec_groups"``) or 0.10.2's
(``"full_and_other"``) rules wherever they differ
(docs/semantics.md#allocation-caching-freeing-and-events-with-several-groups).

Contracts, with ``bs`` the group's block size:

* ``remove_skipped_blocks(rid, n)`` replaces the blocks of the ``n`` computed tokens that the
  attention no longer reads by the null block, walking from the highest index down and
  stopping at the first null, then frees them in one ``free_blocks`` call (highest index first);
* ``find_longest_cache_hit`` returns per group the hit blocks (nulls where the attention
  needs nothing) and the hit length in tokens
  (docs/semantics.md#hits-per-group-and-the-common-hit-length);
* ``get_num_blocks_to_allocate`` counts the free blocks the next allocation consumes
(docs/semantics.md#allocation-caching-freeing-and-events-with-several-groups);
* ``cache_blocks`` keys the blocks that became full by ``hash ‖ group id``
(docs/semantics.md#allocation-caching-freeing-and-events-with-several-groups);
* ``free`` frees the table reversed (0.33: leading nulls removed first).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvcheck.reference_impl.block import BlockHashWithGroupId, KVCacheBlock, group_id_suffix
from kvcheck.reference_impl.block_pool import BlockPool
from kvcheck.reference_impl.errors import KVCacheMisuseError
from kvcheck.reference_impl.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from kvcheck.reference_impl.profiles import ProfileBehaviour

if TYPE_CHECKING:
    from kvcheck.reference_impl.request import Request

#: One list of blocks per group (of the groups one hit search covers).
GroupBlocks = tuple[list[KVCacheBlock], ...]

__all__ = [
    "ChunkedLocalAttentionManager",
    "CrossAttentionManager",
    "FullAttentionManager",
    "MambaManager",
    "SingleTypeKVCacheManager",
    "SlidingWindowManager",
    "cdiv",
    "get_manager_class",
    "get_manager_for_kv_cache_spec",
    "resolve_block_hashes",
]


def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative ints."""
    return -(-a // b)


def resolve_block_hashes(hashes: Sequence[bytes], hash_block_size: int,
                         block_size: int) -> Sequence[bytes]:
    """The request's hashes (computed at ``hash_block_size``) viewed at ``block_size``: hash
    ``i`` of the coarse view is fine hash ``(i + 1) * k - 1`` with ``k = block_size //
    hash_block_size`` (vLLM's ``BlockHashListWithBlockSize``)."""
    if block_size == hash_block_size:
        return hashes
    if block_size % hash_block_size:
        raise KVCacheMisuseError(
            f"block size {block_size} is not a multiple of the hash block size "
            f"{hash_block_size}")
    k = block_size // hash_block_size
    return hashes[k - 1::k]


def replay_boundaries(num_prompt_tokens: int, scheduler_block_size: int,
                      use_eagle: bool) -> list[int]:
    """Positions a later request replaying a prompt can resume at (vLLM 0.33
    ``kv_cache_coordinator.replay_boundaries``): ``num_prompt_tokens - 1`` (a resend's cap);
    with EAGLE the aligned resend and extension positions, each one scheduler block lower
    (the block EAGLE matches and drops), at least 0, sorted and distinct."""
    if not use_eagle:
        return [num_prompt_tokens - 1]
    block = scheduler_block_size
    resend = (num_prompt_tokens - 1) // block * block
    extension = num_prompt_tokens // block * block
    return sorted({max(resend - block, 0), max(extension - block, 0)})


def mamba_prefill_checkpoint_position(num_tokens: int, hash_block_size: int,
                                      drop_eagle_block: bool,
                                      num_hash_lookahead_tokens: int = 0) -> int:
    """The reusable Mamba checkpoint boundary of a prefill of ``num_tokens`` (vLLM 0.33
    ``kv_cache_interface.get_mamba_prefill_checkpoint_position``):
    ``num_tokens - max(1, L)`` rounded down to the hash block (the last token is recomputed
    for its logits; with hash lookahead ``L`` the checkpoint's hash needs the ``L`` tokens
    after it); with EAGLE's drop, ``num_tokens`` rounded down, minus one hash block (EAGLE
    recomputes that block); at least 0."""
    if drop_eagle_block:
        return max(num_tokens // hash_block_size * hash_block_size - hash_block_size, 0)
    proof_limit = num_tokens - max(1, num_hash_lookahead_tokens)
    return max(proof_limit // hash_block_size * hash_block_size, 0)


def trim_null_head(blocks: list[KVCacheBlock]) -> list[KVCacheBlock]:
    """``blocks`` without its leading null blocks (vLLM 0.33 ``trim_null_head``); ``blocks``
    itself when it starts with a real block."""
    if not blocks or not blocks[0].is_null:
        return blocks
    i = 0
    while i < len(blocks) and blocks[i].is_null:
        i += 1
    return blocks[i:]


class SingleTypeKVCacheManager:
    """The block tables of one KV-cache group (see the module docstring).

    Args:
        kv_cache_spec: the group's spec.
        block_pool: the pool shared by every group.
        kv_cache_group_id: this group's index (its cache keys carry it).
        profile: the resolved profile.
        enable_caching: prefix caching on.
        scheduler_block_size: LCM of the groups' block sizes (0.33 hit alignment).

    Attributes set by the coordinator after construction (what ``cache_blocks`` reads):
        hash_block_size: block size of the request's hashes (default: this group's).
        retention_interval: 0.33 ``prefix_cache_retention_interval`` (None: dense).
        shared_prefix_boundary: the coordinator's request id -> 0.33 shared-prefix boundary
            of the request's last lookup.
    """

    #: Whether the coordinator sizes this group by the request's encoder tokens
    #: (``CrossAttentionManager``) rather than by the decoder's tokens.
    uses_encoder_tokens = False
    #: Whether the group's allocation also reads the main model's token count (lookahead
    #: excluded; ``MambaManager``): the coordinator then runs ``get_num_blocks_to_allocate_main``
    #: and ``allocate_new_blocks_main``.
    uses_main_model_tokens = False
    #: Whether the hit search can stop on a hash-block boundary inside one of this group's
    #: blocks (vLLM 0.33's ``supports_fine_grained_hash_lookup``: full attention and Mamba);
    #: ``find_longest_partial_cache_hit`` is that search.
    supports_fine_grained_hash_lookup = False
    #: vLLM 0.33's per-request admission cap in blocks (``KVCacheManager`` sets it from
    #: ``admission_cap``): what ``get_num_admission_blocks`` counts at most for the full
    #: sequence; None (full attention, Mamba, cross attention): no cap.
    max_admission_blocks_per_request: int | None = None
    #: vLLM 0.33's ``records_new_block_ids``: this group's fresh blocks are recorded for the
    #: worker to zero (``KVCacheManager(needs_kv_cache_zeroing=True)`` turns it on for the
    #: attention kinds: ``record_new_block_ids``); off, nothing is recorded and the
    #: allocation methods are the plain ones.
    records_new_block_ids = False
    #: Set for the length of one ``allocate_slots`` whose caller named this group in
    #: ``skip_zeroing_group_ids``: the external tokens' blocks an asynchronous load writes
    #: are not recorded (vLLM's ``record_for_zeroing=False``).
    skip_external_zeroing = False

    def __init__(self, kv_cache_spec: KVCacheSpec, block_pool: BlockPool,
                 kv_cache_group_id: int, profile: ProfileBehaviour, enable_caching: bool,
                 scheduler_block_size: int) -> None:
        self.kv_cache_spec = kv_cache_spec
        self.block_size = kv_cache_spec.block_size
        self.block_pool = block_pool
        self.kv_cache_group_id = kv_cache_group_id
        self.profile = profile
        self.v033 = profile.hybrid_rules == "spec_groups"
        self.enable_caching = enable_caching
        self.scheduler_block_size = scheduler_block_size
        self.cache_hit_alignment_tokens = scheduler_block_size
        self.null_block = block_pool.null_block
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[str, int] = {}
        self.hash_block_size = self.block_size
        self.retention_interval: int | None = None
        self.shared_prefix_boundary: dict[str, int] = {}
        #: Whether this group's hits drop the EAGLE/MTP block (set by the coordinator, vLLM's
        #: ``use_eagle`` of a manager): 0.33's sliding-window ``reachable_block_mask`` and
        #: the full-attention partial-block key read it.
        self.use_eagle = False
        #: Whether the model runs EAGLE at all (the coordinator's ``use_eagle``, set on every
        #: group): vLLM 0.33 computes the replay boundaries once per request from it
        #: (``bool(drop_eagle_group_ids)``), for flagged and unflagged groups alike.
        self.replay_eagle = False
        #: 0.33 copy-on-write: request id -> (table index, source block) of a hit that ends
        #: inside a block, redirected to a private block by the next allocation (vLLM's
        #: ``_partial_hit_reqs``); only layouts with a Mamba group record one.
        self._partial_hit_reqs: dict[str, tuple[int, KVCacheBlock]] = {}
        #: 0.33 copy-on-write: (source, destination) pairs made since the last
        #: ``take_pending_cow_copies`` (vLLM's ``_pending_cow_copies``).
        self._pending_cow_copies: list[tuple[KVCacheBlock, KVCacheBlock]] = []

    # ------------------------------------------------------------------ skipping
    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Leading tokens the attention no longer reads after ``num_computed_tokens``."""
        return 0

    def _first_useful_block_v010(self, request_id: str, num_computed_tokens: int) -> int:
        return 0

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Null out (and free, highest index first) the blocks before the attention window."""
        if self.v033:
            skipped = self.get_num_skipped_tokens(num_computed_tokens)
            if skipped <= 0:
                return
            blocks = self.req_to_blocks.get(request_id)
            if blocks is None:
                return
            end = min(skipped // self.block_size, len(blocks))
        else:
            blocks = self.req_to_blocks.get(request_id)
            if blocks is None:
                return
            end = min(self._first_useful_block_v010(request_id, num_computed_tokens),
                      len(blocks))
        freed: list[KVCacheBlock] = []
        for i in range(end - 1, -1, -1):
            if blocks[i].is_null:
                break
            freed.append(blocks[i])
            blocks[i] = self.null_block
        if freed:
            self.block_pool.free_blocks(freed)

    # ------------------------------------------------------------------ hits
    def find_longest_cache_hit(self, block_hashes: Sequence[bytes], max_length: int,
                               group_ids: Sequence[int], alignment_tokens: int,
                               drop_eagle_block: bool = False) -> tuple[GroupBlocks, int]:
        """Per group of ``group_ids`` (all with this spec) the hit blocks, and the hit length
        in tokens; ``block_hashes`` are already viewed at this group's block size."""
        raise NotImplementedError

    def find_longest_partial_cache_hit(self, block_hashes: Sequence[bytes], max_length: int,
                                       group_ids: Sequence[int], hash_block_size: int,
                                       drop_eagle_block: bool = False,
                                       ) -> tuple[GroupBlocks, int]:
        """vLLM 0.33's fine-grained hit search (``find_longest_cache_hit`` with
        ``alignment_tokens = hash_block_size`` below the block size): the hit may end on any
        hash-block boundary, inside a block; ``block_hashes`` are the request's own (at
        ``hash_block_size``). Only for a class with ``supports_fine_grained_hash_lookup``."""
        raise KVCacheMisuseError(
            f"{type(self).__name__} has no fine-grained hit search (vLLM 0.33's "
            "supports_fine_grained_hash_lookup is False for it)")

    # ------------------------------------------------------------------ copy-on-write
    def record_partial_local_hit(self, request_id: str,
                                 new_computed_blocks: Sequence[KVCacheBlock],
                                 num_local_computed_tokens: int,
                                 num_external_computed_tokens: int) -> None:
        """The last step of 0.33's ``add_local_computed_blocks`` (``:319-325``), run after it:
        a local hit that ends inside a block (``num_local_computed_tokens % block_size``) with
        hit blocks left once the window's skipped ones are dropped records its last hit block
        at index ``num_local_computed_tokens // block_size`` for the copy-on-write of the next
        ``allocate_new_blocks_main``, and caps ``num_cached_block`` at that index so the
        private copy is cached again once full."""
        bs = self.block_size
        if not num_local_computed_tokens % bs:
            return
        skipped = self.get_num_skipped_tokens(
            num_local_computed_tokens + num_external_computed_tokens) // bs
        hits = new_computed_blocks[skipped:] if skipped > 0 else new_computed_blocks
        if not hits:
            return
        block_idx = num_local_computed_tokens // bs
        self._partial_hit_reqs[request_id] = (block_idx, hits[-1])
        self.num_cached_block[request_id] = block_idx

    def _apply_cow(self, request_id: str, block_idx: int, source_block: KVCacheBlock,
                   cow_block: KVCacheBlock) -> None:
        """Redirect a partial hit to the private block ``cow_block`` (vLLM 0.33's
        ``_apply_cow``, ``:455-475``): the table entry ``block_idx`` becomes ``cow_block``,
        the copy ``(source_block, cow_block)`` is queued, and both stay retained until the
        copies are taken and released: ``source_block`` keeps the reference the hit took,
        ``cow_block`` takes one more beyond the table's."""
        blocks = self.req_to_blocks[request_id]
        assert block_idx < len(blocks) and blocks[block_idx] is source_block
        assert not source_block.is_null and source_block.ref_cnt > 0
        blocks[block_idx] = cow_block
        self._pending_cow_copies.append((source_block, cow_block))
        cow_block.ref_cnt += 1

    def record_new_block_ids(self) -> None:
        """Record this group's fresh blocks from now on, for the worker to zero (vLLM 0.33's
        ``_record_new_block_ids``, set from ``needs_kv_cache_zeroing`` for an attention
        spec): each block ``allocate_new_blocks`` or ``allocate_external_computed_blocks``
        takes from the pool is appended to ``new_block_ids`` (the external ones unless
        ``skip_external_zeroing``), and so is a copy-on-write block
        (``allocate_new_blocks_main``); hits are adopted, never taken, so never recorded.
        The recording wraps the class's methods on this instance only, so a manager without
        zeroing runs the plain methods (the hot path pays nothing)."""
        self.records_new_block_ids = True
        #: The recorded block ids, drained by ``take_new_block_ids``.
        self.new_block_ids: list[int] = []
        cls = type(self)

        def allocate_new_blocks(request_id: str, num_tokens: int,
                                ) -> list[KVCacheBlock]:
            new = cls.allocate_new_blocks(self, request_id, num_tokens)
            if new:
                self.new_block_ids.extend(b.block_id for b in new)
            return new

        def allocate_external_computed_blocks(request_id: str, num_local_computed_tokens: int,
                                              num_external_computed_tokens: int) -> None:
            held = len(self.req_to_blocks.get(request_id, ()))
            cls.allocate_external_computed_blocks(self, request_id, num_local_computed_tokens,
                                                  num_external_computed_tokens)
            if not self.skip_external_zeroing:  # appended after the adopted hits and nulls
                self.new_block_ids.extend(
                    b.block_id for b in self.req_to_blocks.get(request_id, ())[held:])

        self.allocate_new_blocks = allocate_new_blocks  # type: ignore[method-assign]
        self.allocate_external_computed_blocks = (  # type: ignore[method-assign]
            allocate_external_computed_blocks)

    def take_new_block_ids(self) -> list[int]:
        """Drain the block ids recorded since the last call (vLLM 0.33's
        ``take_new_block_ids``); ``[]`` for a group that records none."""
        if not self.records_new_block_ids:
            return []
        ids, self.new_block_ids = self.new_block_ids, []
        return ids

    def take_pending_cow_copies(self) -> list[tuple[KVCacheBlock, KVCacheBlock]]:
        """Drain the (source, destination) copies queued since the last call, in the order
        they were made (vLLM 0.33's ``take_pending_cow_copies``)."""
        copies, self._pending_cow_copies = self._pending_cow_copies, []
        return copies

    def take_pending_boundary_state_offloads(self) -> list[tuple[str, int, KVCacheBlock, int]]:
        """Drain the boundary-state hand-offs for a KV connector, ``(request_id, group_id,
        block, boundary_tokens)`` (vLLM 0.33's ``take_pending_boundary_state_offloads``):
        only a Mamba "align" group makes any (``MambaManager``)."""
        return []

    def finalize_partial_tail_offload(self, request_id: str, num_computed_tokens: int,
                                      num_in_flight_tokens: int = 0,
                                      ) -> tuple[int, KVCacheBlock, int] | None:
        """A finishing request's producer partial tail, ``(group_id, block,
        boundary_tokens)``, or None (vLLM 0.33's ``finalize_partial_tail_offload``): only a
        Mamba "align" group has one (``MambaManager``)."""
        return None

    # ------------------------------------------------------------------ allocation
    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int,
                                   new_computed_blocks: Sequence[KVCacheBlock],
                                   total_computed_tokens: int) -> int:
        """Free blocks this group consumes to give the request ``num_tokens`` slots: new
        blocks plus hits that sit in the free queue now
        (docs/semantics.md#allocation-caching-freeing-and-events-with-several-groups)."""
        num_required = cdiv(num_tokens, self.block_size)
        held = len(self.req_to_blocks.get(request_id, ()))
        if not self.v033:
            evictable = sum(1 for b in new_computed_blocks if b.ref_cnt == 0 and not b.is_null)
            return num_required - len(new_computed_blocks) - held + evictable
        if request_id in self.num_cached_block:
            return max(num_required - held, 0)
        skipped_blocks = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        num_new = max(num_required - max(skipped_blocks, len(new_computed_blocks) + held), 0)
        skip_hits = max(0, skipped_blocks - held)
        evictable = sum(1 for b in new_computed_blocks[skip_hits:]
                        if b.ref_cnt == 0 and not b.is_null)
        return num_new + evictable

    def admission_cap(self, max_in_flight_tokens: int | None, max_model_len: int | None,
                      spec_block_size: int) -> int | None:
        """This group's ``max_admission_blocks_per_request`` (vLLM 0.33
        ``KVCacheSpec.max_admission_blocks_per_request``, given to the managers of the
        recycling kinds only): None here, no cap.

        ``spec_block_size`` is the group's own block size, *before* decode context
        parallelism scales it: vLLM 0.33 computes the cap on the spec
        (``get_manager_for_kv_cache_spec``), whose ``block_size`` is unscaled, and the
        manager applies it to its scaled blocks (``block_size * dcp_world_size``)."""
        return None

    def get_num_admission_blocks(self, request_id: str, num_tokens: int,
                                 new_computed_blocks: Sequence[KVCacheBlock],
                                 total_computed_tokens: int, num_local_computed_tokens: int,
                                 prefill_end: int = 0) -> int:
        """What ``get_num_blocks_to_allocate_main`` counts for the request's full sequence of
        ``num_tokens`` (vLLM 0.33's ``apply_admission_cap=True``): the required blocks
        clamped at ``max_admission_blocks_per_request`` (``min(n, cap * bs)`` tokens have
        ``min(cdiv(n, bs), cap)`` blocks), and nothing recorded."""
        cap = self.max_admission_blocks_per_request
        if cap is not None:
            num_tokens = min(num_tokens, cap * self.block_size)
        return self.get_num_blocks_to_allocate_main(
            request_id, num_tokens, new_computed_blocks, total_computed_tokens, num_tokens,
            num_local_computed_tokens, prefill_end)

    def add_local_computed_blocks(self, request_id: str,
                                  new_computed_blocks: Sequence[KVCacheBlock],
                                  num_local_computed_tokens: int,
                                  num_external_computed_tokens: int = 0) -> None:
        """0.33: adopt the hits of a new request: the leading ones the window skips (after
        local + external computed tokens) are dropped and re-padded with nulls, the rest
        touched (nulls are never touched)."""
        blocks = self.req_to_blocks.setdefault(request_id, [])
        assert not blocks, f"request {request_id!r} already holds blocks in this group"
        skipped = self.get_num_skipped_tokens(
            num_local_computed_tokens + num_external_computed_tokens) // self.block_size
        hits = list(new_computed_blocks[skipped:]) if skipped > 0 else list(new_computed_blocks)
        if self.enable_caching:
            self.block_pool.touch(hits)
        blocks.extend([self.null_block] * skipped)
        blocks.extend(hits)
        self.num_cached_block[request_id] = len(blocks)

    def allocate_external_computed_blocks(self, request_id: str, num_local_computed_tokens: int,
                                          num_external_computed_tokens: int) -> None:
        """0.33: fresh blocks (no hash until ``cache_blocks``) for the external (KV-connector)
        tokens the window still reads, appended after the adopted hits and nulls: the table
        then covers ``cdiv(local + external, block_size)`` blocks. Runs only after every
        group adopted its hits (vLLM PR #44409: one group's external blocks must not evict
        another group's untouched hits)."""
        total = num_local_computed_tokens + num_external_computed_tokens
        skipped = self.get_num_skipped_tokens(total)
        if skipped > 0:  # external tokens the window already dropped need no block
            num_external_computed_tokens = min(total - skipped, num_external_computed_tokens)
        if num_external_computed_tokens <= 0:
            return
        blocks = self.req_to_blocks[request_id]
        num_new = max(0, cdiv(total, self.block_size) - len(blocks))
        blocks.extend(self.block_pool.get_new_blocks(num_new))

    def save_new_computed_blocks(self, request_id: str,
                                 new_computed_blocks: Sequence[KVCacheBlock]) -> None:
        """0.10.2: append the hits of a new request as returned (nulls included; the
        manager touched them before)."""
        if request_id in self.num_cached_block:
            assert not new_computed_blocks, "a running request gets no new hits"
            return
        blocks = self.req_to_blocks.setdefault(request_id, [])
        assert not blocks, f"request {request_id!r} already holds blocks in this group"
        blocks.extend(new_computed_blocks)
        self.num_cached_block[request_id] = len(new_computed_blocks)

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        """Pop blocks from the queue head until the table covers ``num_tokens`` slots."""
        blocks = self.req_to_blocks.setdefault(request_id, [])
        num_new = cdiv(num_tokens, self.block_size) - len(blocks)
        if num_new <= 0:
            return []
        new = self.block_pool.get_new_blocks(num_new)
        blocks.extend(new)
        return new

    # ------------------------------------------------------------------ caching
    def reachable_boundaries(self, request: Request) -> list[int]:
        """The token positions whose state a sparse-retention group (sliding window, Mamba)
        keeps cached (vLLM 0.33 ``SingleTypeKVCacheManager.cache_blocks``, ``:508-520``): the
        prompt's replay boundaries (``replay_boundaries``) and the request's shared-prefix
        boundary; with EAGLE also the boundary one block below the latter."""
        boundaries = replay_boundaries(request.num_prompt_tokens, self.scheduler_block_size,
                                       self.replay_eagle)
        shared_prefix_boundary = self.shared_prefix_boundary.get(request.request_id, 0)
        if shared_prefix_boundary:
            boundaries.append(shared_prefix_boundary)
            if self.use_eagle:
                # A sibling diverging right after the junction has no block past it to
                # drop, so its hit lands one block lower.
                boundaries.append(shared_prefix_boundary - self.block_size)
        return boundaries

    def reachable_block_mask(self, request: Request, start_block: int,
                             end_block: int) -> list[bool] | None:
        """Which blocks of ``[start_block, end_block)`` a later hit can use (None: all)."""
        return None

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache the blocks that became full within ``num_tokens`` tokens, keyed by the
        request's hashes viewed at this group's block size (vLLM's
        ``SingleTypeKVCacheManager.cache_blocks``)."""
        num_cached = self.num_cached_block.get(request.request_id, 0)
        block_hashes = resolve_block_hashes(request.block_hashes, self.hash_block_size,
                                            self.block_size)
        num_full = min(num_tokens, len(block_hashes) * self.block_size) // self.block_size
        if num_cached >= num_full:
            return
        mask = self.reachable_block_mask(request, num_cached, num_full) if self.v033 else None
        self.block_pool.cache_full_blocks(
            request, self.req_to_blocks[request.request_id], num_cached, num_full,
            self.block_size, self.kv_cache_group_id, mask, block_hashes)
        self.num_cached_block[request.request_id] = num_full

    def get_num_common_prefix_blocks(self, request_id: str, num_running_requests: int) -> int:
        """Leading blocks of the request's table held by every running request (vLLM 0.10.2;
        0 for the attention types whose blocks are dropped as the window moves)."""
        return 0

    def get_num_blocks_to_allocate_main(self, request_id: str, num_tokens: int,
                                        new_computed_blocks: Sequence[KVCacheBlock],
                                        total_computed_tokens: int,
                                        num_tokens_main_model: int,
                                        num_local_computed_tokens: int,
                                        prefill_end: int = 0) -> int:
        """``get_num_blocks_to_allocate`` given also the main model's tokens
        (``computed + new``, without lookahead; ``MambaManager`` reads it) and the local
        computed tokens (``num_computed_tokens`` + hits): a hit ending inside a block
        reserves one block more, the copy-on-write block (vLLM 0.33 ``:260-266``).
        ``prefill_end`` (only ``MambaManager`` reads it): see
        ``KVCacheCoordinator.get_num_blocks_to_allocate_main``."""
        num_blocks = self.get_num_blocks_to_allocate(request_id, num_tokens,
                                                     new_computed_blocks, total_computed_tokens)
        if new_computed_blocks and num_local_computed_tokens % self.block_size:
            num_blocks += 1
        return num_blocks

    def allocate_new_blocks_main(self, request_id: str, num_tokens: int,
                                 num_tokens_main_model: int) -> list[KVCacheBlock]:
        """``allocate_new_blocks`` given also the main model's tokens; a recorded partial hit
        first takes one block from the queue head as its copy-on-write block
        (``_apply_cow``), returned first (vLLM 0.33 ``:386-410``)."""
        if self._partial_hit_reqs and request_id in self._partial_hit_reqs:
            block_idx, source_block = self._partial_hit_reqs.pop(request_id)
            cow_block = self.block_pool.get_new_blocks(1)[0]
            self._apply_cow(request_id, block_idx, source_block, cow_block)
            if self.records_new_block_ids:  # the private copy is fresh: zeroed, then copied
                self.new_block_ids.append(cow_block.block_id)
            return [cow_block, *self.allocate_new_blocks(request_id, num_tokens)]
        return self.allocate_new_blocks(request_id, num_tokens)

    def new_step_starts(self) -> None:
        """A scheduler step begins (vLLM 0.33 ``new_step_starts``): nothing for most kinds."""

    # ------------------------------------------------------------------ release
    def free(self, request_id: str) -> None:
        """Free the table reversed in one ``free_blocks`` call (0.33: leading nulls first
        removed; 0.10.2 passes them, which decrements the null block's ``ref_cnt``)."""
        blocks = self.req_to_blocks.pop(request_id, [])
        self.num_cached_block.pop(request_id, None)
        if self.v033:
            blocks = trim_null_head(blocks)
        self.block_pool.free_blocks(reversed(blocks))


class FullAttentionManager(SingleTypeKVCacheManager):
    """Full attention: nothing is skipped, no null block is ever held; hits are the longest
    cached prefix.

    Its methods are the one-group hot path (every request of a single-group model runs
    through them): they skip the generic skip-aware arithmetic, which is 0 here, and look a
    single group's keys up without building per-block lists.

    A group whose block is larger than the hash block (a hybrid model under vLLM 0.33) also
    registers the prompt's partial-block key (docs/semantics.md#partial-block-keys): setting
    ``hash_block_size`` below the block size binds ``cache_blocks`` of that instance to
    ``cache_blocks_with_partial_tail_block``, so the one-group path pays nothing for it (a
    subclass changes that path through ``_cache_partial_tail_block``).
    """

    supports_fine_grained_hash_lookup = True

    def __init__(self, kv_cache_spec: KVCacheSpec, block_pool: BlockPool,
                 kv_cache_group_id: int, profile: ProfileBehaviour, enable_caching: bool,
                 scheduler_block_size: int) -> None:
        super().__init__(kv_cache_spec, block_pool, kv_cache_group_id, profile,
                         enable_caching, scheduler_block_size)
        self._key_suffix = group_id_suffix(kv_cache_group_id)

    @property
    def hash_block_size(self) -> int:
        """Block size of the request's hashes (set by the coordinator; default: this
        group's)."""
        return self._hash_block_size

    @hash_block_size.setter
    def hash_block_size(self, hash_block_size: int) -> None:
        # Never vars(self) here: a materialised __dict__ slows every attribute read of the
        # instance (CPython's inline values), the one-group hot path's included.
        was_coarse = getattr(self, "_hash_block_size", self.block_size) < self.block_size
        self._hash_block_size = hash_block_size
        if hash_block_size < self.block_size:
            self.cache_blocks = (  # type: ignore[method-assign]
                self.cache_blocks_with_partial_tail_block)
        elif was_coarse:
            del self.cache_blocks

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Nothing is skipped in full attention."""

    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int,
                                   new_computed_blocks: Sequence[KVCacheBlock],
                                   total_computed_tokens: int) -> int:
        """The generic count with no skipped tokens: ``cdiv(num_tokens, bs) - hits - held``
        (clamped at 0 by ``clamp_blocks_to_allocate``, 0.33) plus the hits in the free
        queue."""
        num_new = (-(-num_tokens // self.block_size) - len(new_computed_blocks)
                   - len(self.req_to_blocks.get(request_id, ())))
        if num_new < 0 and self.profile.clamp_blocks_to_allocate:
            num_new = 0
        if not new_computed_blocks:  # every decode step: nothing to count
            return num_new
        return num_new + sum(1 for b in new_computed_blocks if b.ref_cnt == 0 and not b.is_null)

    def add_local_computed_blocks(self, request_id: str,
                                  new_computed_blocks: Sequence[KVCacheBlock],
                                  num_local_computed_tokens: int,
                                  num_external_computed_tokens: int = 0) -> None:
        """0.33: adopt a new request's hits as they are (nothing is skipped), touched."""
        blocks = self.req_to_blocks.setdefault(request_id, [])
        assert not blocks, f"request {request_id!r} already holds blocks in this group"
        if self.enable_caching:
            self.block_pool.touch(new_computed_blocks)
        blocks.extend(new_computed_blocks)
        self.num_cached_block[request_id] = len(blocks)

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        blocks = self.req_to_blocks.setdefault(request_id, [])
        num_new = -(-num_tokens // self.block_size) - len(blocks)
        if num_new <= 0:
            return []
        new = self.block_pool.get_new_blocks(num_new)
        blocks.extend(new)
        return new

    def find_longest_cache_hit(self, block_hashes: Sequence[bytes], max_length: int,
                               group_ids: Sequence[int], alignment_tokens: int,
                               drop_eagle_block: bool = False) -> tuple[GroupBlocks, int]:
        """The longest run of cached blocks from the start, within ``max_length`` and (0.33)
        rounded down to ``alignment_tokens``. ``drop_eagle_block`` (EAGLE/MTP): the hit then
        drops its last block (0.10.2 pops it; 0.33 subtracts ``min(alignment_tokens, bs)``
        tokens before the rounding, ``single_type_kv_cache_manager.py:829-838``)."""
        bs = self.block_size
        if drop_eagle_block:
            found, found_length = self.find_longest_cache_hit(block_hashes, max_length,
                                                              group_ids, bs)
            return self._drop_eagle_block(found, found_length, alignment_tokens)
        if len(group_ids) == 1:
            # BlockPool.get_cached_block(block_hash, group_ids) for one group, unrolled: this
            # loop runs once per prompt block of every admission.
            suffix = (self._key_suffix if group_ids[0] == self.kv_cache_group_id
                      else group_id_suffix(group_ids[0]))
            lookup = self.block_pool.cached_block_hash_to_block.get_one_block
            blocks: list[KVCacheBlock] = []
            for block_hash in block_hashes[:max_length // bs]:
                block = lookup(BlockHashWithGroupId(block_hash + suffix))
                if block is None:
                    break
                blocks.append(block)
            computed: GroupBlocks = (blocks,)
        else:
            computed = tuple([] for _ in group_ids)
            for block_hash in block_hashes[:max_length // bs]:
                hit = self.block_pool.get_cached_block(block_hash, group_ids)  # type: ignore[arg-type]
                if hit is None:
                    break
                for out, block in zip(computed, hit, strict=True):
                    out.append(block)
        hit_length = len(computed[0]) * bs
        if self.v033 and alignment_tokens != bs:
            hit_length -= hit_length % alignment_tokens
            num_blocks = cdiv(hit_length, bs)
            for out in computed:
                del out[num_blocks:]
        return computed, hit_length

    def find_longest_partial_cache_hit(self, block_hashes: Sequence[bytes], max_length: int,
                                       group_ids: Sequence[int], hash_block_size: int,
                                       drop_eagle_block: bool = False,
                                       ) -> tuple[GroupBlocks, int]:
        """vLLM 0.33's fine-grained full-attention search (``:743-838``): the longest run of
        cached full blocks (keys at the block size), then the first block past it probed at
        its inner hash boundaries, highest first, for a partial-block key; the hit then ends
        there, inside that block, which is the last hit block. ``drop_eagle_block``: then one
        hash block less (the blocks trimmed to the shorter hit)."""
        bs = self.block_size
        k = bs // hash_block_size
        lookup = self.block_pool.get_cached_block
        computed: GroupBlocks = tuple([] for _ in group_ids)
        for block_hash in block_hashes[k - 1::k][:max_length // bs]:
            hit = lookup(block_hash, group_ids)  # type: ignore[arg-type]
            if hit is None:
                break
            for out, block in zip(computed, hit, strict=True):
                out.append(block)
        hit_length = len(computed[0]) * bs
        first_partial_idx = len(computed[0]) * k
        max_partial_idx = min(first_partial_idx + k - 1, max_length // hash_block_size,
                              len(block_hashes))
        for fine_idx in range(max_partial_idx - 1, first_partial_idx - 1, -1):
            hit = lookup(block_hashes[fine_idx], group_ids)  # type: ignore[arg-type]
            if hit is None:
                continue
            for out, block in zip(computed, hit, strict=True):
                out.append(block)
            hit_length = (fine_idx + 1) * hash_block_size
            break
        if drop_eagle_block:
            return self._drop_eagle_block(computed, hit_length, hash_block_size)
        return computed, hit_length

    def _drop_eagle_block(self, computed: GroupBlocks, hit_length: int,
                          alignment_tokens: int) -> tuple[GroupBlocks, int]:
        """EAGLE's drop on an unrounded full-attention hit (vLLM 0.33 ``:829-838``: minus
        ``min(alignment_tokens, bs)`` tokens, then down to ``alignment_tokens``, blocks
        trimmed to ``cdiv(hit, bs)``; 0.10.2 ``:282-284``: the last block popped)."""
        if hit_length > 0:
            bs = self.block_size
            if self.v033:
                hit_length -= min(alignment_tokens, bs)
                hit_length -= hit_length % alignment_tokens
            else:
                hit_length -= bs
            num_blocks = cdiv(hit_length, bs)
            for out in computed:
                del out[num_blocks:]
        return computed, hit_length

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        # At the hash block size (an instance of a coarser group runs
        # cache_blocks_with_partial_tail_block instead): the keys are the request's own
        # hashes and there is no null block and no mask: no hash view to build.
        rid = request.request_id
        num_cached = self.num_cached_block.get(rid, 0)
        bs = self.block_size
        num_full = min(num_tokens, len(request.block_hashes) * bs) // bs
        if num_cached >= num_full:
            return
        self.block_pool.cache_full_blocks(request, self.req_to_blocks[rid], num_cached,
                                          num_full, bs, self.kv_cache_group_id)
        self.num_cached_block[rid] = num_full

    def cache_blocks_with_partial_tail_block(self, request: Request, num_tokens: int) -> None:
        """vLLM 0.33's ``FullAttentionManager.cache_blocks`` for a block larger than the hash
        block (``single_type_kv_cache_manager.py:840-857``): the full blocks within
        ``num_tokens`` keyed at this group's block size, then, on every call, the prompt's
        partial-block key (``_cache_partial_tail_block``)."""
        SingleTypeKVCacheManager.cache_blocks(self, request, num_tokens)
        self._cache_partial_tail_block(request, num_tokens)

    def _cache_partial_tail_block(self, request: Request, num_tokens: int) -> None:
        """Key the block holding the prompt's last hash boundary ``b = min((num_prompt_tokens
        - 1) // hbs, len(block_hashes)) * hbs`` by the hash at ``b`` (vLLM 0.33's
        ``_cache_partial_tail_block``, ``:859-897``; with EAGLE ``num_prompt_tokens`` in place of
        ``num_prompt_tokens - 1``): only that boundary,
        never the others inside a block; nothing when ``b`` is 0, past ``num_tokens`` (the
        hybrid coordinator rounds it down to the scheduler block, so the block is full and
        keyed already), block-aligned, or in a block the request does not hold."""
        hbs = self.hash_block_size
        # A resend hits at most num_prompt_tokens - 1 tokens, but an EAGLE lookup reads the
        # whole prompt before dropping a hash block (vLLM 0.33 :870-877).
        token_limit = request.num_prompt_tokens - (0 if self.use_eagle else 1)
        boundary = min(token_limit // hbs, len(request.block_hashes)) * hbs
        if boundary == 0 or boundary > num_tokens or boundary % self.block_size == 0:
            return
        blocks = self.req_to_blocks.get(request.request_id, ())
        block_idx = boundary // self.block_size
        if block_idx >= len(blocks):
            return
        self.block_pool.cache_partial_block(request, blocks[block_idx], boundary,
                                            self.kv_cache_group_id, self.block_size, hbs)

    def get_num_common_prefix_blocks(self, request_id: str, num_running_requests: int) -> int:
        n = 0
        for block in self.req_to_blocks.get(request_id, ()):
            if block.ref_cnt != num_running_requests:
                break
            n += 1
        return n

    def free(self, request_id: str) -> None:
        """Free the table reversed, last block first (no null head to trim)."""
        blocks = self.req_to_blocks.pop(request_id, [])
        self.num_cached_block.pop(request_id, None)
        self.block_pool.free_blocks(reversed(blocks))


class SlidingWindowManager(SingleTypeKVCacheManager):
    """Sliding window ``w``: tokens before ``n - w + 1`` are skipped; a hit needs a run of
    ``cdiv(w - 1, bs)`` cached blocks, searched right to left."""

    def __init__(self, kv_cache_spec: SlidingWindowSpec, block_pool: BlockPool,
                 kv_cache_group_id: int, profile: ProfileBehaviour, enable_caching: bool,
                 scheduler_block_size: int) -> None:
        super().__init__(kv_cache_spec, block_pool, kv_cache_group_id, profile,
                         enable_caching, scheduler_block_size)
        self.sliding_window = kv_cache_spec.sliding_window
        self.contiguous_blocks = cdiv(self.sliding_window - 1, self.block_size)
        #: Multi-module MTP (vLLM 0.33): tokens below the window whose blocks stay held (the
        #: re-prefillable tail), so blocks are freed that many tokens later; hits unchanged.
        self.extra_retained_tokens = kv_cache_spec.extra_retained_tokens

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return max(0, num_computed_tokens - self.sliding_window + 1 - self.extra_retained_tokens)

    def admission_cap(self, max_in_flight_tokens: int | None, max_model_len: int | None,
                      spec_block_size: int) -> int | None:
        """vLLM 0.33 ``SlidingWindowSpec.max_admission_blocks_per_request``: the window's
        ``w - 1`` tokens, the MTP tail and the in-flight tokens, at most ``max_model_len``,
        plus one block (the window need not start at a block boundary). In blocks of the
        spec's unscaled ``spec_block_size``: under DCP vLLM 0.33 divides by the spec's block
        size, not the manager's scaled one, so the cap is ``dcp_world_size`` times looser
        (``kv_cache_interface.py:918-944``)."""
        if max_in_flight_tokens is None:
            return None
        num_tokens = self.sliding_window - 1 + self.extra_retained_tokens + max_in_flight_tokens
        if max_model_len is not None:
            num_tokens = min(num_tokens, max_model_len)
        return cdiv(num_tokens, spec_block_size) + 1

    def _first_useful_block_v010(self, request_id: str, num_computed_tokens: int) -> int:
        return (num_computed_tokens - self.sliding_window + 1) // self.block_size

    def find_longest_cache_hit(self, block_hashes: Sequence[bytes], max_length: int,
                               group_ids: Sequence[int], alignment_tokens: int,
                               drop_eagle_block: bool = False) -> tuple[GroupBlocks, int]:
        """The rightmost run of ``cdiv(w - 1, bs)`` cached blocks within ``max_length`` (else
        the run from the start), nulls before it. ``drop_eagle_block`` (EAGLE/MTP): the run
        needs one block more and its last block is then popped (0.33 re-aligns after the pop;
        vLLM 0.33 ``:957-1063``, 0.10.2 ``:312-372``)."""
        bs = self.block_size
        need = self.contiguous_blocks + (1 if drop_eagle_block else 0)
        max_num_blocks = max_length // bs
        null = self.null_block
        computed = tuple([null] * max_num_blocks for _ in group_ids)
        run = 0
        found = False
        for i in range(max_num_blocks - 1, -1, -1):
            hit = self.block_pool.get_cached_block(block_hashes[i], group_ids)  # type: ignore[arg-type]
            if hit is None:
                run = 0
                continue
            if (self.v033 and run == 0 and bs != alignment_tokens
                    and ((i if drop_eagle_block else i + 1) * bs) % alignment_tokens != 0):
                continue  # 0.33: a run must end (after EAGLE's pop) on an aligned boundary
            for out, block in zip(computed, hit, strict=True):
                out[i] = block
            run += 1
            if run >= need:
                for out in computed:
                    del out[i + run:]
                found = True
                break
        if not found:
            for out in computed:
                del out[run:]
            if self.v033:
                while bs != alignment_tokens and len(computed[0]) * bs % alignment_tokens:
                    for out in computed:
                        out.pop()
        if drop_eagle_block and computed[0]:
            for out in computed:
                out.pop()
            if self.v033:
                while bs != alignment_tokens and len(computed[0]) * bs % alignment_tokens:
                    for out in computed:
                        out.pop()
        return computed, len(computed[0]) * bs

    def reachable_block_mask(self, request: Request, start_block: int,
                             end_block: int) -> list[bool] | None:
        """0.33 ``reachable_block_mask``
        (docs/semantics.md#allocation-caching-freeing-and-events-with-several-groups): the
        reachable boundaries are the prompt's replay boundaries (``replay_boundaries``) and
        the request's shared-prefix boundary. With EAGLE (``use_eagle``) a hit needs one block
        more, and its run's right edge is the block past the boundary (``shift`` 1); the
        boundary one block below the shared prefix's is reachable too (vLLM 0.33
        ``:509-520, 1066-1144``)."""
        retention_interval = self.retention_interval
        alignment = self.cache_hit_alignment_tokens
        bs = self.block_size
        if alignment % bs != 0:
            return None
        use_eagle = self.use_eagle
        need = self.contiguous_blocks + (1 if use_eagle else 0)
        shift = 1 if use_eagle else 0
        mask = [False] * (end_block - start_block)
        segment = (alignment if retention_interval is None
                   else (None if retention_interval == 0 else retention_interval))
        if segment is not None:
            per_segment = segment // bs
            if need >= per_segment:
                return None
            for i in range(start_block, end_block):
                if i >= shift and (i - shift) % per_segment >= per_segment - need:
                    mask[i - start_block] = True
        if retention_interval is not None:
            for boundary in self.reachable_boundaries(request):
                end = (boundary // alignment * alignment) // bs + shift
                for j in range(max(start_block, end - need), min(end_block, end)):
                    mask[j - start_block] = True
        return mask


class ChunkedLocalAttentionManager(SingleTypeKVCacheManager):
    """Chunked local attention ``c``: tokens of finished chunks are skipped; the hit search
    pads the finished chunks with nulls without looking them up."""

    def __init__(self, kv_cache_spec: ChunkedLocalAttentionSpec, block_pool: BlockPool,
                 kv_cache_group_id: int, profile: ProfileBehaviour, enable_caching: bool,
                 scheduler_block_size: int) -> None:
        super().__init__(kv_cache_spec, block_pool, kv_cache_group_id, profile,
                         enable_caching, scheduler_block_size)
        self.attention_chunk_size = kv_cache_spec.attention_chunk_size

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return num_computed_tokens // self.attention_chunk_size * self.attention_chunk_size

    def admission_cap(self, max_in_flight_tokens: int | None, max_model_len: int | None,
                      spec_block_size: int) -> int | None:
        """vLLM 0.33 ``ChunkedLocalAttentionSpec.max_admission_blocks_per_request``: one
        attention chunk plus the in-flight tokens, at most ``max_model_len``, in blocks of
        the spec's unscaled ``spec_block_size`` (as the sliding window's)."""
        if max_in_flight_tokens is None:
            return None
        num_tokens = self.attention_chunk_size + max_in_flight_tokens
        if max_model_len is not None:
            num_tokens = min(num_tokens, max_model_len)
        return cdiv(num_tokens, spec_block_size)

    def _first_useful_block_v010(self, request_id: str, num_computed_tokens: int) -> int:
        first = self.get_num_skipped_tokens(num_computed_tokens) // self.block_size
        num_cached = self.num_cached_block.get(request_id, 0)
        if num_cached > 0:
            first = min(first, num_cached - 1)  # 0.10.2 keeps the last cached block
        return first

    def find_longest_cache_hit(self, block_hashes: Sequence[bytes], max_length: int,
                               group_ids: Sequence[int], alignment_tokens: int,
                               drop_eagle_block: bool = False) -> tuple[GroupBlocks, int]:
        bs = self.block_size
        if self.v033 and bs != alignment_tokens:
            raise KVCacheMisuseError(
                "chunked local attention needs every group to have its block size "
                f"({bs}) equal to the hit alignment ({alignment_tokens}): vLLM 0.33 asserts "
                "it (single_type_kv_cache_manager.py:1329-1341)")
        start = max_length // self.attention_chunk_size * self.attention_chunk_size
        start_block = start // bs
        computed = tuple([self.null_block] * start_block for _ in group_ids)
        for i in range(start_block, max_length // bs):
            hit = self.block_pool.get_cached_block(block_hashes[i], group_ids)  # type: ignore[arg-type]
            if hit is None:
                break
            for out, block in zip(computed, hit, strict=True):
                out.append(block)
        return computed, len(computed[0]) * bs


class CrossAttentionManager(SingleTypeKVCacheManager):
    """Cross attention (``CrossAttentionSpec``): the request's encoder tokens get one static
    allocation, ``cdiv(num_encoder_tokens, block_size)`` blocks, in the ``allocate_slots``
    call that schedules the encoder input (the coordinator passes ``num_encoder_tokens`` here
    in place of the decoder's token count); nothing is skipped, hit, cached or shared, and
    the blocks are freed with the request.

    A later step passes ``num_encoder_tokens = 0``: vLLM 0.33 then needs no block for this
    group (``max(0 - held, 0)``), while 0.10.2's ``get_num_blocks_to_allocate`` counts
    ``0 - held``, a negative number that lowers the whole step's need by the blocks this
    group holds (``single_type_kv_cache_manager.py:59-86``, no clamp): the base class's
    arithmetic, kept as vLLM has it.

    Only valid with prefix caching off (``KVCacheManager`` refuses a cross-attention group
    with caching on): vLLM's ``find_longest_cache_hit`` raises ``NotImplementedError`` and
    ``cache_blocks`` raises ``ValueError`` (0.33 ``:2138-2196``, 0.10.2 ``:606-654``).
    """

    #: The coordinator passes ``num_encoder_tokens`` to this group instead of the decoder's
    #: token count (vLLM's ``isinstance(manager, CrossAttentionManager)`` test).
    uses_encoder_tokens = True

    def find_longest_cache_hit(self, block_hashes: Sequence[bytes], max_length: int,
                               group_ids: Sequence[int], alignment_tokens: int,
                               drop_eagle_block: bool = False) -> tuple[GroupBlocks, int]:
        raise KVCacheMisuseError("a cross-attention group never hits: vLLM's "
                                 "CrossAttentionManager does not support caching")

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        raise KVCacheMisuseError("a cross-attention group caches nothing (vLLM: 'Should not "
                                 "be called as prefix caching is disabled.')")

    def add_local_computed_blocks(self, request_id: str,
                                  new_computed_blocks: Sequence[KVCacheBlock],
                                  num_local_computed_tokens: int,
                                  num_external_computed_tokens: int = 0) -> None:
        # vLLM asserts the hits are empty and records nothing (0.33 ``:2141-2150``).
        assert not new_computed_blocks, "a cross-attention group gets no prefix-cache hits"

    def allocate_external_computed_blocks(self, request_id: str, num_local_computed_tokens: int,
                                          num_external_computed_tokens: int) -> None:
        return  # no external KV loads into cross attention (0.33 ``:2152-2160``)


class MambaManager(SingleTypeKVCacheManager):
    """Mamba state blocks (``MambaSpec``; vLLM 0.33 ``single_type_kv_cache_manager.py``
    ``MambaManager``, ``:1428-2136``; 0.10.2 ``:529-603``).

    vLLM 0.10.2: one table per request sized like full attention's plus
    ``num_speculative_blocks`` extra blocks (``num_tokens + block_size *
    num_speculative_blocks`` slots, lookahead included); nothing skipped, freed early, hit
    or cached (0.10.2 runs Mamba models with prefix caching off; ``KVCacheManager``
    refuses it on).

    vLLM 0.33, ``n`` computed tokens skip ``n - 1`` (only the last token's state is read):

    * mode ``"none"`` (prefix caching off): the generic skip-aware arithmetic on ``num_tokens
      + block_size * num_speculative_blocks`` slots; skipped blocks are nulled and freed
      from the highest index down to the first null;
    * mode ``"align"``: the table has ``cdiv(num_tokens_main_model, block_size) +
      num_speculative_blocks`` entries (lookahead ignored, ``num_tokens_main_model =
      computed + new``), all but the last ``1 + num_speculative_blocks`` nulls except the
      states still awaiting retirement; a running request takes at most 1 new block per
      step (a new one ``1 + num_speculative_blocks``), and the speculative blocks a step
      leaves behind move to the table's end (their index becomes a null: the table is not
      append-only). ``remove_skipped_blocks`` frees the non-null blocks below the skipped
      boundary (nulls are skipped, not a stop), from the retirement cursor up, and the
      state block of two allocations ago (``last_state_block_idx``). The hit search looks
      right to left for ONE cached block whose end is a multiple of the hit alignment and
      pads it with nulls. A block cached in this step cannot be hit in this step:
      ``get_num_blocks_to_allocate`` then answers ``num_gpu_blocks + 1`` so the request
      waits for the next step (``new_step_starts`` lifts it).

    Fine-grained partial hash hits (0.33, an "align" block larger than the hash block, when
    the coordinator turns them on and searches this group with
    ``find_longest_partial_cache_hit``; docs/semantics.md#fine-grained-partial-hits):
    the hit search looks right to left at every hash-block boundary
    (``find_longest_partial_cache_hit``); a new request's hit ending inside a block gets a
    private copy-on-write block in its table (the base class's ``_apply_cow``), and
    ``cache_blocks`` keys the running state block at the prompt's last hash boundary
    (``_cache_partial_tail_block``) when a step ends exactly there, inside a block: the
    request's next allocation then copies that state to a new block, moves the block's keys
    onto the copy (``BlockPool.move_block_hashes``) and keeps writing its own block.

    Prefill checkpoint blocks (0.33, "align", ``MambaSpec.num_prefill_checkpoint_blocks > 0``;
    docs/semantics.md#mamba-prefill-checkpoints): an allocation whose chunk ``[start, end)``
    can export the state at its checkpoint position ``p``
    (``mamba_prefill_checkpoint_position(end, cache_hit_alignment_tokens, ...)``; the rule is
    ``_needs_internal_checkpoint``) reserves one block more, at table index ``cdiv(end,
    block_size) - 2`` (a new block where a null would be, or a speculative block kept in
    place), remembered in ``_checkpoints``; ``cache_blocks`` then re-keys that block at ``p``
    (every key it had removed first) when ``p`` is the prompt's checkpoint, a retained
    boundary or the shared-prefix boundary, and else drops its keys (a transient state).
    Under ``prefix_cache_retention_interval == 0`` only the chunk reaching the prefill end
    reserves one (``prefill_end``).

    Sparse retention (0.33, ``retention_interval`` not None): ``reachable_block_mask`` keeps
    one state per retention segment (0: none) plus the states at the reachable boundaries.

    Boundary-state hand-offs for a KV connector (0.33, "align";
    docs/semantics.md#boundary-state-hand-offs): each state block ``cache_blocks`` keys, at
    its key's boundary (``_offer_cached_states``, after ``_cache_partial_tail_block`` as in
    vLLM), and a producer's copy of its own partial tail (``_offer_producer_tail``), drained
    by ``take_pending_boundary_state_offloads``; a freed request's not drained yet are
    dropped; ``finalize_partial_tail_offload`` hands a tail not copied yet from the table
    when the request finishes exactly at it.

    The shared-prefix checkpoint (0.33, ``shared_prefix_checkpoint``: the ``KVCacheManager``'s
    ``enable_mamba_shared_prefix_checkpoint``, which vLLM narrows to EAGLE layouts with
    fine-grained hits and no re-prefillable tail): ``_cache_partial_tail_block`` also keys the
    state at the request's shared-prefix boundary when the chunk being cached ends there,
    inside the prompt (docs/semantics.md#the-shared-prefix-checkpoint). Hash lookahead
    (``num_hash_lookahead_tokens``, the pool's) moves the checkpoint and tail boundaries down
    to leave the hash's ``L`` tokens (``mamba_prefill_checkpoint_position``).
    ``_cache_partial_tail_block`` runs after every "align" ``cache_blocks``, as in vLLM: without
    fine-grained hits, a checkpoint or EAGLE's checkpoint shift it keys nothing (its boundary
    is a whole block, keyed already), but with the shift under sparse retention it keys the
    prompt's tail state that the mask left out.
    """

    uses_main_model_tokens = True
    supports_fine_grained_hash_lookup = True

    def __init__(self, kv_cache_spec: MambaSpec, block_pool: BlockPool,
                 kv_cache_group_id: int, profile: ProfileBehaviour, enable_caching: bool,
                 scheduler_block_size: int) -> None:
        super().__init__(kv_cache_spec, block_pool, kv_cache_group_id, profile,
                         enable_caching, scheduler_block_size)
        self.mamba_cache_mode = kv_cache_spec.mamba_cache_mode
        self.align = self.v033 and self.mamba_cache_mode == "align"
        self.num_speculative_blocks = kv_cache_spec.num_speculative_blocks
        #: Slots per speculative block outside "align" mode: the block size, but the spec's
        #: unscaled one under vLLM 0.10.2 with DCP (``KVCacheManager`` sets it there).
        self.speculative_block_tokens = self.block_size
        #: 0.33: keys of the blocks cached in this step (``new_step_starts`` clears it).
        self.cached_blocks_this_step: set[bytes] = set()
        #: align: request id -> index of the state block of two allocations ago.
        self.last_state_block_idx: dict[str, int] = {}
        #: align: request id -> blocks below this index are retired (nulled and freed).
        self.num_retired_blocks: dict[str, int] = {}
        #: align: requests that went through ``allocate_new_blocks`` once.
        self.allocated_block_reqs: set[str] = set()
        #: 0.33: Mamba checkpoints follow EAGLE's replay boundary (the coordinator sets it
        #: when the manager runs with ``use_eagle``; vLLM ``drop_eagle_checkpoint_block``).
        self.drop_eagle_checkpoint_block = False
        #: 0.33 ``enable_mamba_shared_prefix_checkpoint``, narrowed and set by the
        #: ``KVCacheManager`` (vLLM's ``shared_prefix_checkpoint``): also key the state at the
        #: request's shared-prefix boundary (``_cache_partial_tail_block``).
        self.shared_prefix_checkpoint = False
        #: 0.33 "align" with ``num_prefill_checkpoint_blocks > 0``: allocations may reserve a
        #: prefill checkpoint block (vLLM ``has_prefill_checkpoint_blocks``).
        self.has_prefill_checkpoint_blocks = (
            self.align and kv_cache_spec.num_prefill_checkpoint_blocks > 0)
        self.prefill_checkpoint_alignment = kv_cache_spec.prefill_checkpoint_alignment
        #: request id -> (checkpoint position, table index of its block) of the request's
        #: last allocation count (vLLM ``_checkpoints``); read by ``cache_blocks``.
        self._checkpoints: dict[str, tuple[int, int]] = {}
        #: align: the boundary states handed to a KV connector, not drained yet
        #: (``(request_id, group_id, block, boundary_tokens)``; vLLM 0.33's
        #: ``_pending_boundary_state_offloads``).
        self._pending_boundary_state_offloads: list[tuple[str, int, KVCacheBlock, int]] = []
        #: align: request id -> (its state block, the prompt's last hash boundary) for a
        #: request that keyed its own partial tail (a producer) and has not copied it yet.
        self._producer_partial_tail_reqs: dict[str, tuple[KVCacheBlock, int]] = {}

    # ------------------------------------------------------------------ skipping
    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return num_computed_tokens - 1

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        if not self.v033:
            return  # 0.10.2: a request holds its blocks until it is freed
        if not self.align:
            super().remove_skipped_blocks(request_id, num_computed_tokens)
            return
        blocks = self.req_to_blocks.get(request_id)
        if blocks is None:
            return
        bs = self.block_size
        skipped = num_computed_tokens - 1
        if skipped > 0:
            first = self.num_retired_blocks.get(request_id, 0)
            last = min(skipped // bs, len(blocks))
            if first < last:
                freed: list[KVCacheBlock] = []
                # Prefill leaves null gaps between states awaiting retirement: skip them.
                for i in range(last - 1, first - 1, -1):
                    if blocks[i].is_null:
                        continue
                    freed.append(blocks[i])
                    blocks[i] = self.null_block
                if freed:
                    self.block_pool.free_blocks(freed)
                self.num_retired_blocks[request_id] = last
        last_state = self.last_state_block_idx.get(request_id)
        if (last_state is not None and last_state < cdiv(num_computed_tokens, bs) - 1
                and not blocks[last_state].is_null):
            self.block_pool.free_blocks([blocks[last_state]])
            blocks[last_state] = self.null_block

    # ------------------------------------------------------------------ hits
    def find_longest_cache_hit(self, block_hashes: Sequence[bytes], max_length: int,
                               group_ids: Sequence[int], alignment_tokens: int,
                               drop_eagle_block: bool = False) -> tuple[GroupBlocks, int]:
        computed: GroupBlocks = tuple([] for _ in group_ids)
        if not self.v033:
            return computed, 0  # 0.10.2: "Prefix caching is not supported for mamba now."
        bs = self.block_size
        if alignment_tokens < bs:
            raise KVCacheMisuseError(
                f"a Mamba block ({bs} tokens) hit at a finer alignment ({alignment_tokens}) is "
                "vLLM 0.33's fine-grained partial hash hit: search it with "
                "find_longest_partial_cache_hit and the request's own hashes")
        # Right to left; the first cached block whose end is aligned is the whole hit.
        for i in range(min(max_length // bs, len(block_hashes)) - 1, -1, -1):
            hit = self.block_pool.get_cached_block(block_hashes[i], group_ids)  # type: ignore[arg-type]
            if hit is None:
                continue
            if bs != alignment_tokens and (i + 1) * bs % alignment_tokens:
                continue
            for out, block in zip(computed, hit, strict=True):
                out.extend([self.null_block] * i)
                out.append(block)
            return computed, (i + 1) * bs
        return computed, 0

    def find_longest_partial_cache_hit(self, block_hashes: Sequence[bytes], max_length: int,
                                       group_ids: Sequence[int], hash_block_size: int,
                                       drop_eagle_block: bool = False,
                                       ) -> tuple[GroupBlocks, int]:
        """vLLM 0.33's fine-grained Mamba search (``:1494-1514``): right to left over every
        hash-block boundary up to ``max_length``; the first cached key (a full block's or a
        partial-block key) is the whole hit, its block at index ``boundary_idx // (block_size
        // hash_block_size)`` after that many nulls."""
        k = self.block_size // hash_block_size
        computed: GroupBlocks = tuple([] for _ in group_ids)
        lookup = self.block_pool.get_cached_block
        for fine_idx in range(min(max_length // hash_block_size, len(block_hashes)) - 1,
                              -1, -1):
            hit = lookup(block_hashes[fine_idx], group_ids)  # type: ignore[arg-type]
            if hit is None:
                continue
            block_idx = fine_idx // k
            for out, block in zip(computed, hit, strict=True):
                out.extend([self.null_block] * block_idx)
                out.append(block)
            return computed, (fine_idx + 1) * hash_block_size
        return computed, 0

    # ------------------------------------------------------------------ allocation
    def _hit_cached_this_step(self, new_computed_blocks: Sequence[KVCacheBlock]) -> bool:
        return bool(new_computed_blocks) and (
            new_computed_blocks[-1].block_hash in self.cached_blocks_this_step)

    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int,
                                   new_computed_blocks: Sequence[KVCacheBlock],
                                   total_computed_tokens: int) -> int:
        return self.get_num_blocks_to_allocate_main(request_id, num_tokens,
                                                    new_computed_blocks,
                                                    total_computed_tokens, num_tokens,
                                                    total_computed_tokens)

    def get_num_admission_blocks(self, request_id: str, num_tokens: int,
                                 new_computed_blocks: Sequence[KVCacheBlock],
                                 total_computed_tokens: int, num_local_computed_tokens: int,
                                 prefill_end: int = 0) -> int:
        """The full-sequence count, uncapped; the prefill checkpoint it reserves is left
        unrecorded (vLLM 0.33 records ``_checkpoints`` only without ``apply_admission_cap``,
        ``:1776``)."""
        if not self.has_prefill_checkpoint_blocks:
            return super().get_num_admission_blocks(
                request_id, num_tokens, new_computed_blocks, total_computed_tokens,
                num_local_computed_tokens, prefill_end)
        recorded = self._checkpoints.get(request_id)
        try:
            return super().get_num_admission_blocks(
                request_id, num_tokens, new_computed_blocks, total_computed_tokens,
                num_local_computed_tokens, prefill_end)
        finally:
            if recorded is None:
                self._checkpoints.pop(request_id, None)
            else:
                self._checkpoints[request_id] = recorded

    def get_num_blocks_to_allocate_main(self, request_id: str, num_tokens: int,
                                        new_computed_blocks: Sequence[KVCacheBlock],
                                        total_computed_tokens: int,
                                        num_tokens_main_model: int,
                                        num_local_computed_tokens: int,
                                        prefill_end: int = 0) -> int:
        """0.33 first refuses a hit on a block cached in this step: ``num_gpu_blocks + 1``,
        more than any pool has free (``:1703-1711``). In "align" mode a copy-on-write to come
        (a hit ending inside a block, or this request's own partial-block key of the last
        step) needs one block more, and lifts the per-step cap by one (``:1748-1792``); so
        does a prefill checkpoint (``_needs_internal_checkpoint``), recorded in
        ``_checkpoints`` (or dropped from it) by this count, as vLLM's is (``:1756-1790``)."""
        if self._hit_cached_this_step(new_computed_blocks):
            return self.block_pool.num_gpu_blocks + 1
        if not self.align:
            num_tokens += self.speculative_block_tokens * self.num_speculative_blocks
            return super().get_num_blocks_to_allocate(request_id, num_tokens,
                                                      new_computed_blocks,
                                                      total_computed_tokens)
        num_required = cdiv(num_tokens_main_model, self.block_size) + self.num_speculative_blocks
        # Not clamped at 0, as vLLM has it: rejected drafts can leave more entries than needed.
        num_new = (num_required - len(new_computed_blocks)
                   - len(self.req_to_blocks.get(request_id, ())))
        has_partial_hit = bool(
            (new_computed_blocks and num_local_computed_tokens % self.block_size)
            or (self._partial_hit_reqs and request_id in self._partial_hit_reqs))
        if has_partial_hit:
            num_new = max(num_new, 0) + 1
        checkpoint_block = 0
        if self.has_prefill_checkpoint_blocks:
            checkpoint_block = self._reserve_checkpoint(
                request_id, total_computed_tokens, num_tokens_main_model, prefill_end)
        elif self._checkpoints:
            self._checkpoints.pop(request_id, None)
        if num_new > 0:
            cap = 1 + has_partial_hit + checkpoint_block
            if request_id not in self.allocated_block_reqs:
                cap += self.num_speculative_blocks
            num_new = min(num_new, cap)
        return num_new + sum(1 for b in new_computed_blocks if b.ref_cnt == 0 and not b.is_null)

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        return self.allocate_new_blocks_main(request_id, num_tokens, num_tokens)

    def allocate_new_blocks_main(self, request_id: str, num_tokens: int,
                                 num_tokens_main_model: int) -> list[KVCacheBlock]:
        """Returns what vLLM returns: in align mode the table's entries from its previous
        end on, the null padding and relocated speculative blocks included.

        A recorded partial hit (0.33, ``:1823-1921``) takes one block more, popped first: a
        new request's hit block is replaced in its table by that copy-on-write block
        (``_apply_cow``, returned first); a running request (its own partial-block key of the
        last step) keeps writing its block, whose keys move to the copy
        (``BlockPool.move_block_hashes``): the source takes one more reference for the copy,
        the copy is held by that copy alone, and its key counts as cached in this step."""
        if not self.align:
            speculative = self.speculative_block_tokens * self.num_speculative_blocks
            return super().allocate_new_blocks(request_id, num_tokens + speculative)
        spec = self.num_speculative_blocks
        blocks = self.req_to_blocks.setdefault(request_id, [])
        num_required = cdiv(num_tokens_main_model, self.block_size) + spec
        partial_hit = self._partial_hit_reqs.get(request_id) if self._partial_hit_reqs else None
        checkpoint = int(bool(self._checkpoints) and request_id in self._checkpoints)
        if num_required <= len(blocks) and partial_hit is None and not checkpoint:
            self.allocated_block_reqs.add(request_id)
            return []
        prev_len = len(blocks)
        allocated = request_id in self.allocated_block_reqs
        if allocated:  # the running state sits before the speculative blocks
            self.last_state_block_idx[request_id] = prev_len - 1 - spec
        elif prev_len > 0:  # a new request's last hit block holds the hit state
            self.last_state_block_idx[request_id] = prev_len - 1
        num_skipped = num_required - spec - 1
        # A prefill checkpoint keeps the entry before the last state block: its block (a new
        # one, or a speculative block left in place) receives the checkpoint's state.
        if prev_len < num_skipped:
            blocks.extend([self.null_block] * (num_skipped - checkpoint - prev_len))
        if allocated:
            for i in range(prev_len - spec, prev_len):
                if i >= num_skipped - checkpoint:
                    break
                self._relocate_speculative_block(blocks, i)
        num_new = max(num_required - len(blocks), 0)
        if partial_hit is not None:
            num_new += 1
        assert num_new <= 1 + (partial_hit is not None) + checkpoint + (0 if allocated else spec)
        new = self.block_pool.get_new_blocks(num_new)
        returned = blocks[prev_len:]
        if partial_hit is not None:
            self._copy_on_write(request_id, blocks, partial_hit, new[0], allocated, returned)
            new = new[1:]
            self._partial_hit_reqs.pop(request_id, None)
        blocks.extend(new)
        self.allocated_block_reqs.add(request_id)
        returned.extend(new)
        return returned

    def _copy_on_write(self, request_id: str, blocks: list[KVCacheBlock],
                       partial_hit: tuple[int, KVCacheBlock], cow_block: KVCacheBlock,
                       allocated: bool, returned: list[KVCacheBlock]) -> None:
        block_idx, source_block = partial_hit
        if allocated:
            # A running request's table is append-only on the worker: it keeps writing
            # source_block, the prefix cache keeps the copy (vLLM 0.33 :1884-1915).
            assert blocks[block_idx] is source_block
            self.block_pool.move_block_hashes(source_block, cow_block)
            self._pending_cow_copies.append((source_block, cow_block))
            source_block.ref_cnt += 1
            self._offer_producer_tail(request_id, source_block, cow_block)
            if cow_block.block_hash is not None:
                self.cached_blocks_this_step.add(cow_block.block_hash)
        else:
            self._apply_cow(request_id, block_idx, source_block, cow_block)
            returned.insert(0, cow_block)

    def _relocate_speculative_block(self, blocks: list[KVCacheBlock], i: int) -> None:
        block = blocks[i]
        if block.is_null or block.ref_cnt != 1 or block.block_hash is not None:
            raise KVCacheMisuseError(
                f"speculative Mamba block {block.block_id} is shared or cached and cannot move "
                "(vLLM 0.33 asserts speculative blocks are exclusively owned and unhashed)")
        blocks.append(block)
        blocks[i] = self.null_block

    # ------------------------------------------------------------------ caching
    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache the full blocks (nulls skipped; under sparse retention those
        ``reachable_block_mask`` keeps) and, 0.33, remember their keys as cached in this step;
        in "align" mode, between the two, the prefill checkpoint or the prompt's last hash
        boundary (``_cache_partial_tail_block``)."""
        rid = request.request_id
        before = self.num_cached_block.get(rid, 0)
        super().cache_blocks(request, num_tokens)
        after = self.num_cached_block.get(rid, 0)
        if self.align:
            partial_key = self._cache_partial_tail_block(request, num_tokens)
            if partial_key is not None:
                self.cached_blocks_this_step.add(partial_key)
        if after > before and self.v033:
            blocks = self.req_to_blocks[rid]
            for block in blocks[before:after]:
                if not block.is_null and block.block_hash is not None:
                    self.cached_blocks_this_step.add(block.block_hash)
            if self.align:
                self._offer_cached_states(rid, blocks, before, after)

    def reachable_block_mask(self, request: Request, start_block: int,
                             end_block: int) -> list[bool] | None:
        """0.33's sparse Mamba state retention (``MambaManager.reachable_block_mask``,
        ``:1549-1606``): None (every state) without a retention interval, else the segment
        states and the states at the request's reachable boundaries
        (``reachable_boundaries``)."""
        if self.retention_interval is None:
            return None
        return self._retention_mask(start_block, end_block, self.reachable_boundaries(request))

    def _retention_mask(self, start_block: int, end_block: int,
                        boundaries: Sequence[int]) -> list[bool] | None:
        """Which state blocks of ``[start_block, end_block)`` sparse retention keeps: with
        ``retention_interval = r > 0`` the block ending each multiple of ``r`` (None: every
        block, when ``r`` is at most one block), and the block ending at each of
        ``boundaries`` rounded down to the hit alignment (a Mamba hit needs exactly that one
        state; no window, no EAGLE shift: draft models have no Mamba layers)."""
        bs = self.block_size
        alignment = self.cache_hit_alignment_tokens
        mask = [False] * (end_block - start_block)
        if self.retention_interval:
            per_segment = self.retention_interval // bs
            if per_segment <= 1:
                return None
            first = (start_block + per_segment) // per_segment * per_segment - 1
            for i in range(first - start_block, len(mask), per_segment):
                mask[i] = True
        for boundary in boundaries:
            boundary_block = boundary // alignment * alignment // bs - 1
            if start_block <= boundary_block < end_block:
                mask[boundary_block - start_block] = True
        return mask

    # ------------------------------------------------------------------ prefill checkpoints
    def _reserve_checkpoint(self, request_id: str, query_start: int, query_end: int,
                            prefill_end: int) -> int:
        """The prefill checkpoint of an allocation of the chunk ``[query_start, query_end)``
        (vLLM 0.33 ``:1756-1784``): its position ``p`` is the last reusable boundary before
        ``query_end`` at the hit alignment (``mamba_prefill_checkpoint_position``); when
        ``_needs_internal_checkpoint`` holds, ``(p, cdiv(query_end, block_size) - 2)`` is
        recorded in ``_checkpoints`` and 1 returned (one block more), else the request's
        entry is dropped and 0 returned."""
        position = mamba_prefill_checkpoint_position(
            query_end, self.cache_hit_alignment_tokens, self.drop_eagle_checkpoint_block,
            self.block_pool.num_hash_lookahead_tokens)
        if position > 0 and self._needs_internal_checkpoint(request_id, query_start,
                                                            query_end, position, prefill_end):
            self._checkpoints[request_id] = (position, cdiv(query_end, self.block_size) - 2)
            return 1
        self._checkpoints.pop(request_id, None)
        return 0

    def _needs_internal_checkpoint(self, request_id: str, query_start: int, query_end: int,
                                   position: int, prefill_end: int) -> bool:
        """vLLM 0.33's ``_needs_internal_checkpoint`` (``:1659-1690``) with
        ``is_mamba_prefill_checkpoint_valid`` (``kv_cache_interface.py:1189-1210``): the
        chunk reaches ``prefill_end`` (0 unless retention 0), the backend can export the
        state at ``position`` inside it (an alignment is declared; the chunk starts on a hash
        block; the checkpoint's column ``cdiv(query_end, bs) - 2`` is past the initial
        state's ``(query_start - 1) // bs``; at least one hash block after ``query_start``,
        before ``query_end``, on the alignment grid from ``query_start``), and that column
        holds no state yet: past the table, a null, or one of a running request's
        speculative blocks."""
        alignment = self.prefill_checkpoint_alignment
        if alignment is None or query_end < prefill_end:
            return False
        bs = self.block_size
        hbs = self.hash_block_size
        column = cdiv(query_end, bs) - 2
        if not (query_start % hbs == 0 and column > (query_start - 1) // bs
                and query_start + hbs <= position
                and query_start < position < query_end
                and (position - query_start) % alignment == 0 and column >= 0):
            return False
        blocks = self.req_to_blocks.get(request_id, ())
        return (column >= len(blocks) or blocks[column].is_null
                or (request_id in self.allocated_block_reqs
                    and column >= len(blocks) - self.num_speculative_blocks))

    def _cache_checkpoint_block(self, request: Request) -> bytes | None:
        """``cache_blocks`` after an allocation that reserved a prefill checkpoint (vLLM 0.33
        ``:2035-2081``): the checkpoint block (index ``i`` of ``_checkpoints``) holds the state
        at position ``p``. When ``p`` is the prompt's checkpoint (``p`` for
        ``num_prompt_tokens``), a block boundary that retention keeps (``_retention_mask``
        without reachable boundaries; always kept without a retention interval) or the
        request's shared-prefix boundary, the block is keyed at ``p``, every key it had
        (the full key ``cache_full_blocks`` just gave it) removed first
        (``cache_partial_block(..., replace_existing_hashes=True)``), unless its key already
        covers ``p``; otherwise its keys are dropped (a transient state: the slot is
        reused). Returns the new key, or None."""
        rid = request.request_id
        position, idx = self._checkpoints[rid]
        blocks = self.req_to_blocks[rid]
        assert 0 <= idx < len(blocks)
        block = blocks[idx]
        is_prompt_checkpoint = position == mamba_prefill_checkpoint_position(
            request.num_prompt_tokens, self.cache_hit_alignment_tokens,
            self.drop_eagle_checkpoint_block, self.block_pool.num_hash_lookahead_tokens)
        is_retained_checkpoint = False
        bs = self.block_size
        if position % bs == 0:
            block_idx = position // bs - 1
            retained = (None if self.retention_interval is None
                        else self._retention_mask(block_idx, block_idx + 1, ()))
            is_retained_checkpoint = retained is None or retained[0]
        if (not is_prompt_checkpoint and not is_retained_checkpoint
                and position != self.shared_prefix_boundary.get(rid, 0)):
            self.block_pool._maybe_evict_cached_block(block)
            return None
        if self._block_hash_num_tokens(block, idx) == position:
            return None
        return self.block_pool.cache_partial_block(request, block, position,
                                                   self.kv_cache_group_id, bs,
                                                   self.hash_block_size,
                                                   replace_existing_hashes=True)

    def _cache_partial_tail_block(self, request: Request, num_tokens: int) -> bytes | None:
        """vLLM 0.33's Mamba ``_cache_partial_tail_block`` (``:2028-2135``): after an
        allocation that reserved a prefill checkpoint, ``_cache_checkpoint_block``; otherwise,
        when ``num_tokens`` is exactly the prompt's last hash boundary
        (``mamba_prefill_checkpoint_position``: ``(num_prompt_tokens - max(1, L)) // hbs *
        hbs``, with EAGLE ``num_prompt_tokens // hbs * hbs - hbs``), key the state block
        holding it (index ``cdiv(num_tokens, block_size) - 1``; not a null, not already keyed
        at that length) by the hash there (``BlockPool.cache_partial_block``); with
        ``shared_prefix_checkpoint`` also when ``num_tokens`` is the request's shared-prefix
        boundary and ``num_computed_tokens < num_tokens <= num_prompt_tokens``. A boundary
        inside the block records the request for a copy-on-write in its next allocation and
        caps ``num_cached_block`` at that index. Returns the key, or None."""
        if self._checkpoints and request.request_id in self._checkpoints:
            return self._cache_checkpoint_block(request)
        hbs = self.hash_block_size
        if num_tokens <= 0 or num_tokens % hbs:
            return None
        if num_tokens != mamba_prefill_checkpoint_position(
                request.num_prompt_tokens, hbs, self.drop_eagle_checkpoint_block,
                self.block_pool.num_hash_lookahead_tokens) and not (
                # The junction, where a sibling resumes: only inside the prompt chunk being
                # computed (vLLM 0.33 :2093-2105); in decode the state block is mutated in
                # place and matches its key only after that step's forward.
                self.shared_prefix_checkpoint
                and num_tokens == self.shared_prefix_boundary.get(request.request_id, 0)
                and request.num_computed_tokens < num_tokens <= request.num_prompt_tokens):
            return None
        bs = self.block_size
        block_idx = cdiv(num_tokens, bs) - 1
        rid = request.request_id
        blocks = self.req_to_blocks.get(rid, ())
        if block_idx >= len(blocks):
            return None
        source_block = blocks[block_idx]
        if source_block.is_null or self._block_hash_num_tokens(source_block,
                                                               block_idx) == num_tokens:
            return None
        key = self.block_pool.cache_partial_block(request, source_block, num_tokens,
                                                  self.kv_cache_group_id, bs, hbs)
        if key is not None and num_tokens % bs:
            self._partial_hit_reqs[rid] = (block_idx, source_block)
            self.num_cached_block[rid] = block_idx
            # A producer: its next step's forward overwrites this state, the copy keeps it.
            self._producer_partial_tail_reqs[rid] = (source_block, num_tokens)
        return key

    def _block_hash_num_tokens(self, block: KVCacheBlock, block_idx: int) -> int | None:
        """vLLM's ``block.block_hash_num_tokens`` of ``block``, found at index ``block_idx``
        of a table of this group: the prefix a primary partial-block key covers, else
        ``(block_idx + 1) * block_size`` for a full key (keys are positional: a block is only
        ever keyed, or hit, at its own index); None without a key."""
        if block.block_hash is None:
            return None
        num_tokens = self.block_pool.partial_block_hash_num_tokens.get(block.block_id)
        return (block_idx + 1) * self.block_size if num_tokens is None else num_tokens

    def new_step_starts(self) -> None:
        self.cached_blocks_this_step.clear()

    # ------------------------------------------------------------------ connector hand-offs
    def _offer_cached_states(self, rid: str, blocks: Sequence[KVCacheBlock], before: int,
                             after: int) -> None:
        """Offer each state block ``cache_blocks`` just keyed (``blocks[before:after]``,
        nulls and unkeyed blocks skipped) at its key's exact boundary (vLLM 0.33
        ``:2003-2025``): a full block's ``(index + 1) * block_size``."""
        for idx in range(before, after):
            block = blocks[idx]
            if block.is_null or block.block_hash is None:
                continue
            boundary = self._block_hash_num_tokens(block, idx)
            assert boundary is not None
            self._pending_boundary_state_offloads.append(
                (rid, self.kv_cache_group_id, block, boundary))

    def _offer_producer_tail(self, rid: str, source_block: KVCacheBlock,
                             cow_block: KVCacheBlock) -> None:
        """A running request's copy of its own partial tail (``_copy_on_write``): if it was
        the producer of that key, offer the copy at the key's boundary (vLLM 0.33
        ``:1895-1911``; the copy fills ``cow_block`` before the forward overwrites
        ``source_block``)."""
        producer_tail = self._producer_partial_tail_reqs.pop(rid, None)
        if producer_tail is not None:
            marker_block, boundary_tokens = producer_tail
            assert marker_block is source_block
            self._pending_boundary_state_offloads.append(
                (rid, self.kv_cache_group_id, cow_block, boundary_tokens))

    def take_pending_boundary_state_offloads(self) -> list[tuple[str, int, KVCacheBlock, int]]:
        """Drain the hand-offs made since the last call, in the order they were made (see
        ``KVCacheManager.take_boundary_state_offloads``)."""
        pending, self._pending_boundary_state_offloads = (
            self._pending_boundary_state_offloads, [])
        return pending

    def finalize_partial_tail_offload(self, request_id: str, num_computed_tokens: int,
                                      num_in_flight_tokens: int = 0,
                                      ) -> tuple[int, KVCacheBlock, int] | None:
        """A finishing producer's partial tail, offered from its own table block when no
        later token was computed (``num_computed_tokens`` is the boundary) and none is in
        flight (asynchronous scheduling: an in-flight step may still write past it; vLLM
        0.33 ``:1936-1950``). Consumed either way."""
        if not self.align:
            return None
        producer_tail = self._producer_partial_tail_reqs.pop(request_id, None)
        if producer_tail is None:
            return None
        source_block, boundary_tokens = producer_tail
        if num_in_flight_tokens != 0 or num_computed_tokens != boundary_tokens:
            return None
        return self.kv_cache_group_id, source_block, boundary_tokens

    def _drop_boundary_state_offloads(self, request_id: str) -> None:
        """The request's blocks go back to the pool: its producer tail and its hand-offs not
        drained yet are dropped (vLLM 0.33's ``pop_blocks_for_free``, ``:1952-1968``)."""
        self._producer_partial_tail_reqs.pop(request_id, None)
        if self._pending_boundary_state_offloads:
            self._pending_boundary_state_offloads = [
                entry for entry in self._pending_boundary_state_offloads
                if entry[0] != request_id]

    # ------------------------------------------------------------------ release
    def free(self, request_id: str) -> None:
        if self.align:
            self._drop_boundary_state_offloads(request_id)
        self._checkpoints.pop(request_id, None)
        self._partial_hit_reqs.pop(request_id, None)
        self.allocated_block_reqs.discard(request_id)
        self.last_state_block_idx.pop(request_id, None)
        self.num_retired_blocks.pop(request_id, None)
        super().free(request_id)


def get_manager_class(spec: KVCacheSpec) -> type[SingleTypeKVCacheManager]:
    """The manager class for ``spec``'s kind (vLLM's ``KVCacheSpecRegistry``).

    Raises:
        KVCacheMisuseError: a spec kind the reference does not model.
    """
    if isinstance(spec, SlidingWindowSpec):
        return SlidingWindowManager
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return ChunkedLocalAttentionManager
    if isinstance(spec, FullAttentionSpec):
        return FullAttentionManager
    if isinstance(spec, CrossAttentionSpec):
        return CrossAttentionManager
    if isinstance(spec, MambaSpec):
        return MambaManager
    raise KVCacheMisuseError(f"no manager for KV-cache spec {spec!r}")


def get_manager_for_kv_cache_spec(spec: KVCacheSpec, block_pool: BlockPool, group_id: int,
                                  profile: ProfileBehaviour, enable_caching: bool,
                                  scheduler_block_size: int) -> SingleTypeKVCacheManager:
    """A manager of ``get_manager_class(spec)`` for group ``group_id``.

    Raises:
        KVCacheMisuseError: a spec kind the reference does not model.
    """
    cls: type = get_manager_class(spec)
    manager: SingleTypeKVCacheManager = cls(spec, block_pool, group_id, profile,
                                            enable_caching, scheduler_block_size)
    return manager
