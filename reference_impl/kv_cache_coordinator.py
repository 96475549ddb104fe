"""Coordinators over the per-group managers of a ``KVCacheManager``, one group or several
(vLLM ``v1/core/kv_cache_coordinator.py``;
docs/semantics.md#allocation-caching-freeing-and-events-with-several-groups).

All groups share one ``BlockPool`` (block 0 = null). The coordinator runs each step's work
group by group, in group order, and reconciles the groups' prefix-cache hits into one hit
length:

* ``KVCacheCoordinatorNoPrefixCache`` (caching off): any groups; never hits;
* ``UnitaryKVCacheCoordinator``: one group; its own hit search; the one-group hot path
  (a single-group model's steps go straight to its per-group manager);
* ``HybridKVCacheCoordinator``: several groups. ``vllm-0.33``: groups with equal specs form
  one spec group, full attention first; a fixed point shrinks the hit length until every spec
  group accepts it. ``vllm-0.10``: exactly one full spec and one other spec, full hit first,
  then the other type within it.

``vllm-0.33`` fine-grained partial hash hits (``partial_hash_hits_enabled``;
docs/semantics.md#fine-grained-partial-hits): with a Mamba "align" group whose block is larger
than the hash block, and every other group able to stop inside a block or at the hash block,
hits land on hash-block boundaries (``cache_hit_alignment_tokens = hash_block_size``), blocks
are cached up to the exact token count, and a hit ending inside a block is copied on write by
the next allocation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvcheck.reference_impl.block import KVCacheBlock
from kvcheck.reference_impl.block_pool import BlockPool
from kvcheck.reference_impl.errors import KVCacheMisuseError
from kvcheck.reference_impl.kv_cache_interface import FullAttentionSpec, KVCacheSpec, MambaSpec
from kvcheck.reference_impl.profiles import ProfileBehaviour
from kvcheck.reference_impl.single_type_kv_cache_manager import (
    MambaManager,
    SingleTypeKVCacheManager,
    cdiv,
    get_manager_class,
    get_manager_for_kv_cache_spec,
    resolve_block_hashes,
)

if TYPE_CHECKING:
    from kvcheck.reference_impl.events import KVEventFactory
    from kvcheck.reference_impl.request import Request

__all__ = [
    "HybridKVCacheCoordinator",
    "KVCacheCoordinator",
    "KVCacheCoordinatorNoPrefixCache",
    "UnitaryKVCacheCoordinator",
    "get_kv_cache_coordinator",
    "partial_hash_hits_enabled",
]

#: One list of blocks per group.
GroupBlocks = tuple[list[KVCacheBlock], ...]


def partial_hash_hits_enabled(specs: Sequence[KVCacheSpec], hash_block_size: int,
                              dcp_world_size: int = 1) -> bool:
    """Whether vLLM 0.33 turns fine-grained partial hash hits on for these groups, prefix
    caching on and several groups given (``kv_cache_utils.partial_hash_hits_enabled`` with the
    managers' classes, as ``HybridKVCacheCoordinator`` calls it, ``kv_cache_coordinator.py:
    706-717``): some Mamba group in mode "align" has a block larger than ``hash_block_size``
    (at least as large under decode context parallelism, ``dcp_world_size > 1``: DCP scales
    the attention blocks, not the Mamba one, so a Mamba block equal to the hash block is still
    finer than them), and every other group's manager can stop a hit inside a block (full
    attention, Mamba) or has the hash block as its block (a sliding window or chunked local
    group of another block size turns them off). ``specs`` are DCP-scaled already
    (``dcp_kv_cache_specs``) and ``hash_block_size`` is the manager's
    (``KVCacheManager.hash_block_size``, the gcd of the block sizes). vLLM 0.10.2 has no such
    hits; ``KVCacheManager.enable_partial_hash_hits`` is the answer for a built manager,
    profile and caching included."""
    if not any(isinstance(spec, MambaSpec) and spec.mamba_cache_mode == "align"
               and (spec.block_size >= hash_block_size if dcp_world_size > 1
                    else spec.block_size > hash_block_size) for spec in specs):
        return False
    return all(get_manager_class(spec).supports_fine_grained_hash_lookup
               or spec.block_size == hash_block_size for spec in specs)


class KVCacheCoordinator:
    """The per-group managers over one pool, driven in group order.

    Args:
        specs: one spec per group, in group order.
        num_blocks: pool size, null block included.
        profile: the resolved profile.
        enable_caching / enable_kv_cache_events: as for ``BlockPool``.
        scheduler_block_size: LCM of the group block sizes (0.33's hit alignment).
        hash_block_size: block size of the request's hashes.
        retention_interval: 0.33 ``prefix_cache_retention_interval`` (None: dense).
        kv_event_factory: the pool's ``event_factory`` (None: the reference's dataclasses).
        use_eagle: EAGLE/MTP speculative decoding: the hits of the groups in
            ``eagle_group_ids`` drop their last block (every group when none is flagged, as
            vLLM falls back), and 0.33's Mamba checkpoints follow EAGLE's replay boundary
            (every Mamba group, flagged or not, as vLLM 0.33 does).
        eagle_group_ids: vLLM 0.33's groups flagged ``is_eagle_group`` (empty: none).
        num_prefill_lookahead: vLLM 0.33's multi-module MTP prefill lookahead ``K``: the last
            ``K - 1`` computed tokens may be re-prefilled, so they are not cached yet
            (``num_reprefillable_tokens``; see ``get_num_cacheable_tokens``).
        num_hash_lookahead_tokens: vLLM 0.33's hash lookahead ``L``, handed to the pool as
            vLLM's coordinator builds its ``BlockPool`` (its events carry the tokens after
            each block, and the Mamba checkpoints read it).

    Attributes:
        enable_partial_hash_hits: vLLM 0.33's fine-grained partial hash hits are on (only a
            ``HybridKVCacheCoordinator`` turns them on; ``partial_hash_hits_enabled``).
        cache_hit_alignment_tokens: hits land on multiples of this: the hash block size with
            fine-grained hits, else the scheduler block size.
        skips_blocks: whether some group's attention drops blocks as a request advances
            (sliding window, chunked local, Mamba); when False, ``remove_skipped_blocks`` has
            nothing to do and the manager does not call it.
        has_encoder_groups: whether a cross-attention group is sized by the request's
            encoder tokens.
        has_main_model_groups: whether some group (Mamba) also reads the main model's token
            count (``KVCacheManager`` then allocates through ``get_num_blocks_to_allocate_main``
            and ``allocate_new_blocks_main``).
    """

    def __init__(self, specs: Sequence[KVCacheSpec], num_blocks: int, *,
                 profile: ProfileBehaviour, enable_caching: bool, enable_kv_cache_events: bool,
                 scheduler_block_size: int, hash_block_size: int,
                 retention_interval: int | None,
                 kv_event_factory: KVEventFactory | None = None,
                 use_eagle: bool = False, num_prefill_lookahead: int = 0,
                 eagle_group_ids: frozenset[int] = frozenset(),
                 num_hash_lookahead_tokens: int = 0) -> None:
        self.specs = tuple(specs)
        self.v033 = profile.hybrid_rules == "spec_groups"
        self.enable_caching = enable_caching
        self.scheduler_block_size = scheduler_block_size
        self.hash_block_size = hash_block_size
        self.retention_interval = retention_interval if self.v033 else None
        self.block_pool = BlockPool(num_blocks, enable_caching, enable_kv_cache_events,
                                    profile=profile, event_factory=kv_event_factory,
                                    num_hash_lookahead_tokens=num_hash_lookahead_tokens)
        self.single_type_managers: tuple[SingleTypeKVCacheManager, ...] = tuple(
            get_manager_for_kv_cache_spec(spec, self.block_pool, i, profile, enable_caching,
                                          scheduler_block_size)
            for i, spec in enumerate(self.specs))
        self.skips_blocks = not all(isinstance(s, FullAttentionSpec) for s in self.specs)
        #: Whether some group is sized by the request's encoder tokens (cross attention).
        self.has_encoder_groups = any(m.uses_encoder_tokens for m in self.single_type_managers)
        #: Whether some group reads the main model's token count (Mamba).
        self.has_main_model_groups = any(m.uses_main_model_tokens
                                         for m in self.single_type_managers)
        #: request id -> 0.33's ``shared_prefix_boundary`` of its last lookup (vLLM's
        #: scheduler stores it on the request); only the hybrid hit search records one.
        self.shared_prefix_boundary: dict[str, int] = {}
        self.enable_partial_hash_hits = False
        self.cache_hit_alignment_tokens = scheduler_block_size
        for manager in self.single_type_managers:
            manager.hash_block_size = hash_block_size
            manager.retention_interval = self.retention_interval
            manager.shared_prefix_boundary = self.shared_prefix_boundary
        #: EAGLE/MTP: some group's hits drop their last block.
        self.use_eagle = use_eagle
        #: The groups whose hits drop (vLLM 0.33's ``drop_eagle_group_ids``): the flagged
        #: ones, every group when none is (vLLM's fallback); empty without ``use_eagle``.
        self.drop_eagle_group_ids: frozenset[int] = (
            (eagle_group_ids or frozenset(range(len(self.specs)))) if use_eagle
            else frozenset())
        #: Multi-module MTP: the trailing computed tokens left uncached (vLLM 0.33's
        #: ``num_reprefillable_tokens``, ``num_prefill_lookahead - 1``).
        self.num_reprefillable_tokens = max(0, num_prefill_lookahead - 1)
        if use_eagle:
            for i, manager in enumerate(self.single_type_managers):
                # A hybrid 0.33 coordinator widens this to every member of a dropping spec
                # group (HybridKVCacheCoordinator.__init__).
                manager.use_eagle = i in self.drop_eagle_group_ids
                manager.replay_eagle = True
                if self.v033 and isinstance(manager, MambaManager):
                    # vLLM 0.33 kv_cache_coordinator.py:177-181: Mamba checkpoints match
                    # EAGLE's attention replay boundary.
                    manager.drop_eagle_checkpoint_block = True

    # ------------------------------------------------------------------ helpers
    def group_hashes(self, request: Request, group_id: int) -> Sequence[bytes]:
        """The request's hashes viewed at group ``group_id``'s block size."""
        return resolve_block_hashes(request.block_hashes, self.hash_block_size,
                                    self.specs[group_id].block_size)

    def empty_blocks(self) -> GroupBlocks:
        """A fresh empty list per group."""
        return tuple([] for _ in self.specs)

    def is_running(self, request_id: str) -> bool:
        """Whether the request holds blocks or adopted hits in any group."""
        return any(request_id in m.num_cached_block or m.req_to_blocks.get(request_id)
                   for m in self.single_type_managers)

    # ------------------------------------------------------------------ steps
    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        for manager in self.single_type_managers:
            manager.remove_skipped_blocks(request_id, num_computed_tokens)

    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int,
                                   new_computed_blocks: Sequence[Sequence[KVCacheBlock]],
                                   total_computed_tokens: int,
                                   num_encoder_tokens: int = 0) -> int:
        """Free blocks the allocation consumes, summed over the groups; a cross-attention
        group is sized by ``num_encoder_tokens`` (no hits, nothing computed), as vLLM's
        coordinator does."""
        if self.has_encoder_groups:
            return sum(
                manager.get_num_blocks_to_allocate(request_id, num_encoder_tokens, (), 0)
                if manager.uses_encoder_tokens else
                manager.get_num_blocks_to_allocate(request_id, num_tokens, hits,
                                                   total_computed_tokens)
                for manager, hits in zip(self.single_type_managers, new_computed_blocks,
                                         strict=True))
        return sum(
            manager.get_num_blocks_to_allocate(request_id, num_tokens, hits,
                                               total_computed_tokens)
            for manager, hits in zip(self.single_type_managers, new_computed_blocks,
                                     strict=True))

    def get_num_blocks_to_allocate_main(self, request_id: str, num_tokens: int,
                                        new_computed_blocks: Sequence[Sequence[KVCacheBlock]],
                                        total_computed_tokens: int,
                                        num_tokens_main_model: int,
                                        num_local_computed_tokens: int,
                                        prefill_end: int = 0) -> int:
        """``get_num_blocks_to_allocate`` for a layout with a Mamba group: every group also
        gets the main model's token count (``computed + new``, lookahead excluded) and the
        local computed tokens (a hit ending inside a block reserves its copy-on-write
        block). ``prefill_end``: where the request's prefill ends (the manager's
        ``max(num_prompt_tokens, num_tokens - 1)``), passed on only under
        ``retention_interval == 0``, where a Mamba group reserves a prefill checkpoint block
        only for the chunk reaching it (vLLM 0.33 ``kv_cache_coordinator.py:237-238``);
        otherwise 0: every chunk may take one."""
        if self.retention_interval != 0:
            prefill_end = 0
        return sum(
            manager.get_num_blocks_to_allocate_main(request_id, num_tokens, hits,
                                                    total_computed_tokens,
                                                    num_tokens_main_model,
                                                    num_local_computed_tokens, prefill_end)
            for manager, hits in zip(self.single_type_managers, new_computed_blocks,
                                     strict=True))

    def get_num_admission_blocks(self, request_id: str, num_tokens: int,
                                 new_computed_blocks: Sequence[Sequence[KVCacheBlock]],
                                 total_computed_tokens: int, num_local_computed_tokens: int,
                                 num_encoder_tokens: int = 0, prefill_end: int = 0) -> int:
        """Free blocks the request's full sequence of ``num_tokens`` needs, each group's
        count clamped at its admission cap (vLLM 0.33 ``get_num_blocks_to_allocate(...,
        apply_admission_cap=True)``, the ``full_sequence_must_fit`` gate); nothing recorded.
        A cross-attention group counts its encoder tokens, as in
        ``get_num_blocks_to_allocate``; ``prefill_end`` as in
        ``get_num_blocks_to_allocate_main``."""
        if self.retention_interval != 0:
            prefill_end = 0
        return sum(
            manager.get_num_blocks_to_allocate(request_id, num_encoder_tokens, (), 0)
            if manager.uses_encoder_tokens else
            manager.get_num_admission_blocks(request_id, num_tokens, hits,
                                             total_computed_tokens, num_local_computed_tokens,
                                             prefill_end)
            for manager, hits in zip(self.single_type_managers, new_computed_blocks,
                                     strict=True))

    def allocate_new_blocks_main(self, request_id: str, num_tokens: int,
                                 num_tokens_main_model: int) -> GroupBlocks:
        """``allocate_new_blocks`` for a layout with a Mamba group, group by group."""
        return tuple(m.allocate_new_blocks_main(request_id, num_tokens, num_tokens_main_model)
                     for m in self.single_type_managers)

    def new_step_starts(self) -> None:
        """A scheduler step begins: every group forgets what it cached in the last one
        (vLLM 0.33 ``KVCacheCoordinator.new_step_starts``; only Mamba groups keep any)."""
        for manager in self.single_type_managers:
            manager.new_step_starts()

    def add_computed_blocks(self, request_id: str,
                            new_computed_blocks: Sequence[Sequence[KVCacheBlock]],
                            num_local_computed_tokens: int,
                            num_external_computed_tokens: int = 0) -> None:
        """Adopt a new request's hits in every group (each group touches its hits, in group
        order, before any new block is popped; 0.10.2 touches every group's hits first).

        0.33 with external (KV-connector) tokens: two phases, as vLLM PR #44409 has it: every
        group adopts (touches) its hits first, then every group takes fresh blocks for the
        external tokens, so no group's external blocks evict another group's hits. A running
        request gets neither (vLLM's coordinator returns at once)."""
        if self.v033:
            managers = self.single_type_managers
            if any(request_id in m.num_cached_block for m in managers):
                return
            for manager, hits in zip(managers, new_computed_blocks, strict=True):
                manager.add_local_computed_blocks(request_id, hits, num_local_computed_tokens,
                                                  num_external_computed_tokens)
                if self.has_main_model_groups:  # where allocate_new_blocks_main copies
                    manager.record_partial_local_hit(request_id, hits,
                                                     num_local_computed_tokens,
                                                     num_external_computed_tokens)
            if num_external_computed_tokens > 0:
                for manager in managers:
                    manager.allocate_external_computed_blocks(
                        request_id, num_local_computed_tokens, num_external_computed_tokens)
            return
        if self.enable_caching:
            for hits in new_computed_blocks:
                self.block_pool.touch(hits)
        for manager, hits in zip(self.single_type_managers, new_computed_blocks, strict=True):
            manager.save_new_computed_blocks(request_id, hits)

    def allocate_new_blocks(self, request_id: str, num_tokens: int,
                            num_encoder_tokens: int = 0) -> GroupBlocks:
        """New blocks per group up to ``num_tokens`` slots (a cross-attention group: up to
        ``num_encoder_tokens``), group by group."""
        return tuple(
            m.allocate_new_blocks(request_id,
                                  num_encoder_tokens if m.uses_encoder_tokens else num_tokens)
            for m in self.single_type_managers)

    def get_num_cacheable_tokens(self, num_tokens: int) -> int:
        """The prefix of ``num_tokens`` computed tokens that is cached: all but the
        re-prefillable tail (vLLM 0.33 ``KVCacheCoordinator.get_num_cacheable_tokens``)."""
        return max(0, num_tokens - self.num_reprefillable_tokens)

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache every group's newly full blocks, group by group."""
        if not self.enable_caching:
            return
        n = self.get_num_cacheable_tokens(num_tokens)
        for manager in self.single_type_managers:
            manager.cache_blocks(request, n)

    def free(self, request_id: str) -> None:
        self.shared_prefix_boundary.pop(request_id, None)
        for manager in self.single_type_managers:
            # vLLM's pop_blocks_for_free drops a copy-on-write not made yet.
            manager._partial_hit_reqs.pop(request_id, None)
            manager.free(request_id)

    def take_pending_cow_copies(self) -> list[tuple[KVCacheBlock, KVCacheBlock]]:
        """Every group's pending copy-on-write pairs, group by group, each group's in the
        order they were made; drained."""
        copies: list[tuple[KVCacheBlock, KVCacheBlock]] = []
        for manager in self.single_type_managers:
            if manager._pending_cow_copies:
                copies.extend(manager.take_pending_cow_copies())
        return copies

    def take_boundary_state_offloads(self) -> list[tuple[str, int, KVCacheBlock, int]]:
        """Every group's pending boundary-state hand-offs, group by group, each group's in
        the order they were made; drained (only Mamba "align" groups make any)."""
        offloads: list[tuple[str, int, KVCacheBlock, int]] = []
        for manager in self.single_type_managers:
            offloads.extend(manager.take_pending_boundary_state_offloads())
        return offloads

    def get_blocks(self, request_id: str) -> GroupBlocks:
        return tuple(list(m.req_to_blocks.get(request_id, ()))
                     for m in self.single_type_managers)

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return tuple([b.block_id for b in m.req_to_blocks.get(request_id, ())]
                     for m in self.single_type_managers)

    def get_num_common_prefix_blocks(self, request_id: str,
                                     num_running_requests: int) -> list[int]:
        return [m.get_num_common_prefix_blocks(request_id, num_running_requests)
                for m in self.single_type_managers]

    # ------------------------------------------------------------------ hits
    def find_longest_cache_hit(self, request: Request,
                               max_cache_hit_length: int) -> tuple[GroupBlocks, int]:
        """Per-group hits and the common hit length (no side effects on the pool)."""
        raise NotImplementedError

    def discard_cache_hit(self, request_id: str) -> None:
        """Forget what the request's last lookup recorded (a lookup that reads no cache)."""


class KVCacheCoordinatorNoPrefixCache(KVCacheCoordinator):
    """Caching off: any groups, never a hit."""

    def find_longest_cache_hit(self, request: Request,
                               max_cache_hit_length: int) -> tuple[GroupBlocks, int]:
        return self.empty_blocks(), 0


class UnitaryKVCacheCoordinator(KVCacheCoordinator):
    """One group: its own hit search, aligned to its block size. Each step goes straight to
    the one per-group manager (no per-group tuples built beyond the answer itself)."""

    def __init__(self, specs: Sequence[KVCacheSpec], num_blocks: int, *,
                 profile: ProfileBehaviour, enable_caching: bool, enable_kv_cache_events: bool,
                 scheduler_block_size: int, hash_block_size: int,
                 retention_interval: int | None,
                 kv_event_factory: KVEventFactory | None = None,
                 use_eagle: bool = False, num_prefill_lookahead: int = 0,
                 eagle_group_ids: frozenset[int] = frozenset(),
                 num_hash_lookahead_tokens: int = 0) -> None:
        if len(specs) != 1:
            raise KVCacheMisuseError(
                f"UnitaryKVCacheCoordinator needs exactly one group, got {len(specs)}")
        if enable_caching and hash_block_size != specs[0].block_size:
            raise KVCacheMisuseError(
                f"one group with caching: hash_block_size ({hash_block_size}) must equal the "
                f"group's block size ({specs[0].block_size}) (vLLM asserts it)")
        super().__init__(specs, num_blocks, profile=profile, enable_caching=enable_caching,
                         enable_kv_cache_events=enable_kv_cache_events,
                         scheduler_block_size=scheduler_block_size,
                         hash_block_size=hash_block_size, retention_interval=retention_interval,
                         kv_event_factory=kv_event_factory, use_eagle=use_eagle,
                         num_prefill_lookahead=num_prefill_lookahead,
                         eagle_group_ids=eagle_group_ids,
                         num_hash_lookahead_tokens=num_hash_lookahead_tokens)
        self._group_ids = (0,)
        self.use_manager(self.single_type_managers[0])
        if use_eagle:  # bound here so the hot path without EAGLE passes nothing more
            self.find_longest_cache_hit = (  # type: ignore[method-assign]
                self._find_longest_cache_hit_eagle)

    def use_manager(self, manager: SingleTypeKVCacheManager) -> None:
        """Route the one group's steps to ``manager``. The steps whose signature is the
        per-group manager's own are its bound methods, so a one-group model's hot path has
        no coordinator layer (call again after replacing the manager's class)."""
        self.manager = manager
        self.single_type_managers = (manager,)
        self.free = manager.free  # type: ignore[method-assign]
        if self.num_reprefillable_tokens:  # multi-module MTP: the tail is cached later
            self.cache_blocks = self._cache_blocks_finalized  # type: ignore[method-assign]
        else:
            self.cache_blocks = manager.cache_blocks  # type: ignore[method-assign]
        self.remove_skipped_blocks = manager.remove_skipped_blocks  # type: ignore[method-assign]

    def _cache_blocks_finalized(self, request: Request, num_tokens: int) -> None:
        """Multi-module MTP: cache the group's blocks up to ``num_tokens`` less the
        re-prefillable tail (vLLM 0.33's unitary coordinator, any ``use_eagle``)."""
        self.manager.cache_blocks(request, max(0, num_tokens - self.num_reprefillable_tokens))

    def empty_blocks(self) -> GroupBlocks:
        return ([],)

    def is_running(self, request_id: str) -> bool:
        m = self.manager
        return request_id in m.num_cached_block or bool(m.req_to_blocks.get(request_id))

    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int,
                                   new_computed_blocks: Sequence[Sequence[KVCacheBlock]],
                                   total_computed_tokens: int,
                                   num_encoder_tokens: int = 0) -> int:
        # One group with caching on: never a cross-attention group (KVCacheManager refuses
        # it), so num_encoder_tokens sizes nothing here.
        return self.manager.get_num_blocks_to_allocate(
            request_id, num_tokens, new_computed_blocks[0], total_computed_tokens)

    def add_computed_blocks(self, request_id: str,
                            new_computed_blocks: Sequence[Sequence[KVCacheBlock]],
                            num_local_computed_tokens: int,
                            num_external_computed_tokens: int = 0) -> None:
        hits = new_computed_blocks[0]
        if self.v033:
            manager = self.manager
            if request_id in manager.num_cached_block:
                return
            manager.add_local_computed_blocks(request_id, hits, num_local_computed_tokens,
                                              num_external_computed_tokens)
            if num_external_computed_tokens > 0:
                manager.allocate_external_computed_blocks(
                    request_id, num_local_computed_tokens, num_external_computed_tokens)
            return
        if self.enable_caching:
            self.block_pool.touch(hits)
        self.manager.save_new_computed_blocks(request_id, hits)

    def allocate_new_blocks(self, request_id: str, num_tokens: int,
                            num_encoder_tokens: int = 0) -> GroupBlocks:
        return (self.manager.allocate_new_blocks(request_id, num_tokens),)

    def get_blocks(self, request_id: str) -> GroupBlocks:
        return (list(self.manager.req_to_blocks.get(request_id, ())),)

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return ([b.block_id for b in self.manager.req_to_blocks.get(request_id, ())],)

    def find_longest_cache_hit(self, request: Request,
                               max_cache_hit_length: int) -> tuple[GroupBlocks, int]:
        manager = self.manager
        return manager.find_longest_cache_hit(
            request.block_hashes, max_cache_hit_length, self._group_ids, manager.block_size)

    def _find_longest_cache_hit_eagle(self, request: Request,
                                      max_cache_hit_length: int) -> tuple[GroupBlocks, int]:
        """``find_longest_cache_hit`` with EAGLE: the hit drops its last block (vLLM's
        unitary coordinator passes ``drop_eagle_block``; no margin: a resend is still capped
        at ``num_tokens - 1`` before the drop)."""
        manager = self.manager
        return manager.find_longest_cache_hit(
            request.block_hashes, max_cache_hit_length, self._group_ids, manager.block_size,
            drop_eagle_block=True)


class HybridKVCacheCoordinator(KVCacheCoordinator):
    """Several groups with caching (see the module docstring for the two rule sets)."""

    def __init__(self, specs: Sequence[KVCacheSpec], num_blocks: int, *,
                 profile: ProfileBehaviour, enable_caching: bool, enable_kv_cache_events: bool,
                 scheduler_block_size: int, hash_block_size: int,
                 retention_interval: int | None,
                 kv_event_factory: KVEventFactory | None = None,
                 use_eagle: bool = False, num_prefill_lookahead: int = 0,
                 eagle_group_ids: frozenset[int] = frozenset(),
                 dcp_world_size: int = 1, num_hash_lookahead_tokens: int = 0) -> None:
        super().__init__(specs, num_blocks, profile=profile, enable_caching=enable_caching,
                         enable_kv_cache_events=enable_kv_cache_events,
                         scheduler_block_size=scheduler_block_size,
                         hash_block_size=hash_block_size, retention_interval=retention_interval,
                         kv_event_factory=kv_event_factory, use_eagle=use_eagle,
                         num_prefill_lookahead=num_prefill_lookahead,
                         eagle_group_ids=eagle_group_ids,
                         num_hash_lookahead_tokens=num_hash_lookahead_tokens)
        # Spec groups: (spec, group ids), equal specs looked up together.
        self.spec_groups: list[tuple[KVCacheSpec, list[int]]] = []
        for i, spec in enumerate(self.specs):
            for sg_spec, ids in self.spec_groups:
                if sg_spec == spec:
                    ids.append(i)
                    break
            else:
                self.spec_groups.append((spec, [i]))
        if self.v033:
            # vLLM 0.33's SpecGroup.use_eagle: a spec group drops when any member is in
            # drop_eagle_group_ids, and then so does every member's manager (its cacheable
            # tokens, its sparse retention); computed after the sort below.
            self.spec_group_eagle: list[bool] = []
            bad = [s.block_size for s in self.specs if s.block_size % hash_block_size]
            if bad:
                raise KVCacheMisuseError(
                    f"every group's block size must be divisible by hash_block_size "
                    f"({hash_block_size}); got {bad} (vLLM 0.33 asserts it)")
            # Full attention first (stable).
            self.spec_groups.sort(key=lambda g: not isinstance(g[0], FullAttentionSpec))
            for _, ids in self.spec_groups:
                drops = not self.drop_eagle_group_ids.isdisjoint(ids)
                self.spec_group_eagle.append(drops)
                if drops:
                    for gid in ids:
                        self.single_type_managers[gid].use_eagle = True
            self.enable_partial_hash_hits = partial_hash_hits_enabled(
                self.specs, hash_block_size, dcp_world_size)
            if self.enable_partial_hash_hits:
                self.cache_hit_alignment_tokens = hash_block_size
                for manager in self.single_type_managers:
                    manager.cache_hit_alignment_tokens = hash_block_size
            return
        full = [g for g in self.spec_groups if isinstance(g[0], FullAttentionSpec)]
        other = [g for g in self.spec_groups if not isinstance(g[0], FullAttentionSpec)]
        if len(full) != 1 or len(other) != 1:
            raise KVCacheMisuseError(
                "vLLM 0.10.2's HybridKVCacheCoordinator assumes exactly one full-attention "
                f"spec and one other spec; got {len(full)} full and {len(other)} other "
                "(kv_cache_coordinator.py:286-350)")
        self.full_spec, self.full_ids = full[0]
        self.other_spec, self.other_ids = other[0]
        if self.other_spec.block_size % self.full_spec.block_size:
            raise KVCacheMisuseError(
                f"vLLM 0.10.2 asserts the other groups' block size ({self.other_spec.block_size}"
                f") is divisible by the full-attention block size ({self.full_spec.block_size})")
        if not (max(self.full_ids) < min(self.other_ids)
                or max(self.other_ids) < min(self.full_ids)):
            raise KVCacheMisuseError(
                "HybridKVCacheCoordinator assumes the full attention group ids and other "
                "attention group ids do not interleave (vLLM 0.10.2 raises ValueError)")

    def get_num_cacheable_tokens(self, num_tokens: int) -> int:
        """0.33's ``_align_cacheable``: rounded down to the scheduler block, where hits land,
        unless fine-grained hits are on (no rounding: rounding even to the hash block would
        key a Mamba state block at a boundary it no longer holds)."""
        if not self.v033 or self.enable_partial_hash_hits:
            return num_tokens
        return num_tokens // self.scheduler_block_size * self.scheduler_block_size

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache every group's newly full blocks, group by group; 0.33 with EAGLE, a group
        caches one of its blocks past the aligned boundary, the block a later EAGLE hit
        matches and drops (vLLM 0.33 ``get_num_cacheable_tokens``,
        ``kv_cache_coordinator.py:788-805``). Multi-module MTP: only EAGLE's groups leave the
        re-prefillable tail uncached, those tokens taken off before the aligned boundary and
        the block past it (without EAGLE vLLM 0.33's hybrid coordinator caches up to the
        aligned boundary whatever ``num_prefill_lookahead``). EAGLE's groups are the managers
        with ``use_eagle`` (those of a dropping spec group); the others cache as without."""
        if not self.enable_caching:
            return
        n = self.get_num_cacheable_tokens(num_tokens)
        if not (self.use_eagle and self.v033) or n == 0:
            for manager in self.single_type_managers:
                manager.cache_blocks(request, n)
            return
        finalized, n_finalized = num_tokens, n
        if self.num_reprefillable_tokens:
            finalized = max(0, num_tokens - self.num_reprefillable_tokens)
            n_finalized = self.get_num_cacheable_tokens(finalized)
        for manager in self.single_type_managers:
            if manager.use_eagle:
                manager.cache_blocks(request, min(finalized, n_finalized + manager.block_size))
            else:
                manager.cache_blocks(request, n)

    def find_longest_cache_hit(self, request: Request,
                               max_cache_hit_length: int) -> tuple[GroupBlocks, int]:
        """Per-group hits and the common hit length; records 0.33's shared-prefix boundary
        (the uncached common prefix's end, 0 when none) for ``cache_blocks``. A hit with
        every group's list empty is reported as no hit."""
        if self.v033:
            blocks, length, uncached = self._find_v033(request, max_cache_hit_length)
        else:
            blocks, length, uncached = self._find_v010(request, max_cache_hit_length)
        self.shared_prefix_boundary[request.request_id] = length + uncached if uncached else 0
        if not any(blocks):
            return self.empty_blocks(), 0
        return blocks, length

    def discard_cache_hit(self, request_id: str) -> None:
        self.shared_prefix_boundary.pop(request_id, None)

    def _search(self, spec: KVCacheSpec, ids: list[int], request: Request,
                max_length: int, drop_eagle_block: bool = False) -> tuple[GroupBlocks, int]:
        """One spec group's hit within ``max_length``. ``drop_eagle_block`` (EAGLE/MTP,
        never for Mamba, whose finder never drops): 0.33 first widens ``max_length`` by the
        drop unit (``eagle_proof_margin``: the hash block for a fine-grained search, else
        the group's block; at most the request's hashed tokens), so the drop lands back at
        the candidate length; 0.10.2 does not."""
        manager = self.single_type_managers[ids[0]]
        fine = (self.enable_partial_hash_hits and manager.supports_fine_grained_hash_lookup
                and manager.block_size > self.hash_block_size)
        if drop_eagle_block:
            if isinstance(spec, MambaSpec):
                drop_eagle_block = False
            elif self.v033:
                margin = self.hash_block_size if fine else manager.block_size
                max_length = min(max_length + margin,
                                 len(request.block_hashes) * self.hash_block_size)
        if fine:
            return manager.find_longest_partial_cache_hit(
                request.block_hashes, max_length, ids, self.hash_block_size,
                drop_eagle_block=drop_eagle_block)
        return manager.find_longest_cache_hit(
            self.group_hashes(request, ids[0]), max_length, ids,
            self.cache_hit_alignment_tokens, drop_eagle_block=drop_eagle_block)

    def _find_v010(self, request: Request, max_length: int) -> tuple[GroupBlocks, int, int]:
        eagle = self.use_eagle  # both searches drop (vLLM 0.10.2 passes use_eagle to each)
        full_hits, full_len = self._search(self.full_spec, self.full_ids, request, max_length,
                                           eagle)
        other_hits, hit_len = self._search(self.other_spec, self.other_ids, request, full_len,
                                           eagle)
        keep = hit_len // self.full_spec.block_size
        for blocks in full_hits:
            del blocks[keep:]
        out: list[list[KVCacheBlock]] = [[] for _ in self.specs]
        for ids, hits in ((self.full_ids, full_hits), (self.other_ids, other_hits)):
            for gid, blocks in zip(ids, hits, strict=True):
                out[gid] = blocks
        return tuple(out), hit_len, 0

    def _find_v033(self, request: Request,
                   max_cache_hit_length: int) -> tuple[GroupBlocks, int, int]:
        hit_length = max_cache_hit_length
        longest = 0
        by_group: list[list[KVCacheBlock] | None] = [None] * len(self.specs)
        length_by_group = [0] * len(self.specs)
        simple = (len(self.spec_groups) == 2
                  and isinstance(self.spec_groups[0][0], FullAttentionSpec))
        # EAGLE: spec groups whose drop is verified at the current candidate length; each
        # drops at most once per candidate (vLLM 0.33 kv_cache_coordinator.py:842-905).
        eagle = self.spec_group_eagle
        eagle_verified: set[int] = set()
        while True:
            curr = hit_length
            for idx, (spec, ids) in enumerate(self.spec_groups):
                first = ids[0]
                if isinstance(spec, FullAttentionSpec) and by_group[first] is not None:
                    curr = min(curr, length_by_group[first])
                    continue
                drop = eagle[idx] and idx not in eagle_verified
                hits, new_len = self._search(spec, ids, request, curr, drop)
                if drop:
                    eagle_verified.add(idx)
                elif new_len < curr:
                    eagle_verified.clear()
                curr = new_len
                for gid, blocks in zip(ids, hits, strict=True):
                    by_group[gid] = blocks
                    length_by_group[gid] = new_len
                longest = max(longest, curr)
            if curr >= hit_length:
                break
            hit_length = curr
            if simple:
                break
        for spec, ids in self.spec_groups:
            if not isinstance(spec, FullAttentionSpec):
                continue
            keep = cdiv(hit_length, spec.block_size)
            for gid in ids:
                group_blocks = by_group[gid]
                if group_blocks is not None:
                    del group_blocks[keep:]
        out = tuple(b if b is not None else [] for b in by_group)
        return out, hit_length, longest - hit_length


def get_kv_cache_coordinator(specs: Sequence[KVCacheSpec], num_blocks: int, *,
                             profile: ProfileBehaviour, enable_caching: bool,
                             enable_kv_cache_events: bool, scheduler_block_size: int,
                             hash_block_size: int, retention_interval: int | None,
                             kv_event_factory: KVEventFactory | None = None,
                             use_eagle: bool = False,
                             num_prefill_lookahead: int = 0,
                             eagle_group_ids: frozenset[int] = frozenset(),
                             dcp_world_size: int = 1,
                             num_hash_lookahead_tokens: int = 0) -> KVCacheCoordinator:
    """The coordinator vLLM picks: caching off → no prefix cache; one group → unitary;
    otherwise hybrid (``dcp_world_size``: only the hybrid one reads it, for its fine-grained
    hits; ``specs`` are DCP-scaled already)."""
    cls: type[KVCacheCoordinator]
    if not enable_caching:
        cls = KVCacheCoordinatorNoPrefixCache
    elif len(specs) == 1:
        cls = UnitaryKVCacheCoordinator
    else:
        return HybridKVCacheCoordinator(
            specs, num_blocks, profile=profile, enable_caching=enable_caching,
            enable_kv_cache_events=enable_kv_cache_events,
            scheduler_block_size=scheduler_block_size, hash_block_size=hash_block_size,
            retention_interval=retention_interval, kv_event_factory=kv_event_factory,
            use_eagle=use_eagle, num_prefill_lookahead=num_prefill_lookahead,
            eagle_group_ids=eagle_group_ids, dcp_world_size=dcp_world_size,
            num_hash_lookahead_tokens=num_hash_lookahead_tokens)
    return cls(specs, num_blocks, profile=profile, enable_caching=enable_caching,
               enable_kv_cache_events=enable_kv_cache_events,
               scheduler_block_size=scheduler_block_size, hash_block_size=hash_block_size,
               retention_interval=retention_interval, kv_event_factory=kv_event_factory,
               use_eagle=use_eagle, num_prefill_lookahead=num_prefill_lookahead,
               eagle_group_ids=eagle_group_ids,
               num_hash_lookahead_tokens=num_hash_lookahead_tokens)
