"""``KVCacheManager``: request-level block management over one or several KV-cache groups
(vLLM ``v1/core/kv_cache_manager.py``; docs/semantics.md#kv-cache-groups-hybrid-models).

One manager for every model, as in vLLM: the groups (full attention, sliding window, chunked
local attention, cross attention, Mamba) live one level down, in the coordinator's per-group
managers (``kv_cache_coordinator``), and every answer is one list per group even for one group
(vLLM's ``KVCacheBlocks``). A single full-attention group is the one-group case; its fast
paths are in ``UnitaryKVCacheCoordinator`` and ``FullAttentionManager``.

Token layout of one ``allocate_slots`` call (vLLM ``kv_cache_manager.py`` docstring)::

    | comp | new_comp |        new        | lookahead |
    comp      = request.num_computed_tokens (KV already held by the request)
    new_comp  = prefix-cache hits found by get_computed_blocks (whole blocks)
    new       = tokens computed in this step
    lookahead = speculative slots (never cached)

    slots needed  = min(comp + new_comp + new + lookahead, max_model_len)
    tokens cached = min(comp + new_comp + new, request.num_tokens)

Order of effects in ``allocate_slots``: (1) bad counts or nothing to compute → error;
(2) every group drops the blocks its window skipped (even if the allocation then fails);
(3) capacity check over all groups, None when short; (4) hits adopted (touched before any
new block is popped), group by group; (5) new blocks popped, group by group (group 0 takes
the queue head first); (6) newly full blocks cached, group by group.

Block sizes (0.33): ``scheduler_block_size = lcm`` of the group block sizes,
``hash_block_size = gcd`` (caching on; ``scheduler_block_size`` with caching off), or
``prefix_match_unit`` when set; one group: both are its block size. Request hashes are
computed at ``hash_block_size``. 0.10.2: with caching on every group has the same block size.

Decode context parallelism (``dcp_world_size = W > 1``): each rank holds every ``W``-th token
of a block, so one block of a sharded group covers ``block_size * W`` tokens of the request
(vLLM 0.33 ``resolve_dcp_kv_block_size``, ``SingleTypeKVCacheManager.block_size``; 0.10.2
``kv_cache_manager.py:113-118``). The manager works on the scaled specs (``dcp_kv_cache_specs``)
from the start: allocation, hashing, hits, the block sizes above. Sharded: every attention
kind under 0.33 (Mamba keeps its per-rank state), every kind under 0.10.2.

The manager never advances ``request.num_computed_tokens``; the caller (a scheduler) does.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from kvcheck.reference_impl.block import KVCacheBlock
from kvcheck.reference_impl.block_hasher import RequestBlockHasher
from kvcheck.reference_impl.errors import KVCacheMisuseError
from kvcheck.reference_impl.events import KVCacheEvent, KVEventFactory
from kvcheck.reference_impl.hashing import resolve_none_hash
from kvcheck.reference_impl.invariants import check_manager_invariants
from kvcheck.reference_impl.kv_cache_coordinator import (
    KVCacheCoordinator,
    get_kv_cache_coordinator,
)
from kvcheck.reference_impl.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
    kv_cache_event_metadata,
)
from kvcheck.reference_impl.profiles import ProfileBehaviour, get_profile
from kvcheck.reference_impl.request import Request, RequestOptions
from kvcheck.reference_impl.single_type_kv_cache_manager import MambaManager, cdiv

if TYPE_CHECKING:  # typing.Unpack is 3.11+; only mypy reads this annotation
    from typing_extensions import Unpack

__all__ = ["PYTHONHASHSEED_FROM_ENV", "KVCacheManager", "dcp_kv_cache_specs",
           "make_block_hasher", "resolve_kv_cache_block_sizes"]

#: ``pythonhashseed``'s default in the manager: take the NONE_HASH from the environment.
PYTHONHASHSEED_FROM_ENV = object()

#: One list of blocks per KV-cache group (vLLM's ``KVCacheBlocks.blocks``).
GroupBlocks = tuple[list[KVCacheBlock], ...]


def make_block_hasher(block_size: int, hash_algo: str, profile: ProfileBehaviour,
                      pythonhashseed: object = PYTHONHASHSEED_FROM_ENV,
                      none_hash: bytes | None = None,
                      num_lookahead_tokens: int = 0) -> RequestBlockHasher:
    """The hasher of a manager's requests: hashes of ``block_size``-token blocks with
    ``hash_algo`` and ``num_lookahead_tokens`` of hash lookahead; its NONE_HASH is
    ``none_hash`` when given, else the one ``pythonhashseed`` gives, else the environment's."""
    if none_hash is None and pythonhashseed is not PYTHONHASHSEED_FROM_ENV:
        none_hash = resolve_none_hash(hash_algo, profile, pythonhashseed)  # type: ignore[arg-type]
    return RequestBlockHasher(block_size, hash_algo, profile=profile, none_hash=none_hash,
                              num_lookahead_tokens=num_lookahead_tokens)


def dcp_kv_cache_specs(specs: Sequence[KVCacheSpec], dcp_world_size: int,
                       profile: ProfileBehaviour) -> tuple[KVCacheSpec, ...]:
    """``specs`` with each sharded group's block size times ``dcp_world_size`` (the tokens one
    block covers under decode context parallelism): vLLM 0.33 shards attention groups
    (``AttentionSpec.dcp_sharded``; ``MambaSpec`` is not), vLLM 0.10.2 scales every manager
    (``SingleTypeKVCacheManager.__init__``). ``specs`` itself when ``dcp_world_size == 1``."""
    if dcp_world_size == 1:
        return tuple(specs)
    v033 = profile.hybrid_rules == "spec_groups"
    return tuple(s if v033 and isinstance(s, MambaSpec)
                 else dataclasses.replace(s, block_size=s.block_size * dcp_world_size)
                 for s in specs)


def resolve_kv_cache_block_sizes(specs: Sequence[KVCacheSpec], enable_caching: bool,
                                 profile: ProfileBehaviour,
                                 prefix_match_unit: int | None = None) -> tuple[int, int]:
    """``(scheduler_block_size, hash_block_size)`` for ``specs`` (DCP-scaled already:
    ``dcp_kv_cache_specs``; docs/semantics.md#kv-cache-sizing), as vLLM 0.33's
    ``resolve_kv_cache_block_sizes`` (several groups with caching on and every Mamba group in
    mode "align": hashes at ``prefix_match_unit``, else the gcd).

    Raises:
        KVCacheMisuseError: no group; 0.10.2 with caching and differing block sizes; a
            ``prefix_match_unit`` vLLM rejects (ValueError there), or any under 0.10.2.
    """
    if not specs:
        raise KVCacheMisuseError("a KV cache needs at least one group")
    sizes = [s.block_size for s in specs]
    if profile.hybrid_rules == "full_and_other":
        if prefix_match_unit is not None:
            raise KVCacheMisuseError(
                "prefix_match_unit is a vLLM 0.33 CacheConfig field; vLLM 0.10.2 has none "
                "(its hashes are at the block size): leave it None under vllm-0.10")
        if enable_caching and len(set(sizes)) != 1:
            raise KVCacheMisuseError(
                f"vLLM 0.10.2 supports one block size with prefix caching, got {sizes} "
                "(kv_cache_manager.py:106-109: 'Only one block size is supported for now')")
        return math.lcm(*sizes), math.gcd(*sizes)
    scheduler = math.lcm(*sizes)
    if len(specs) == 1:
        if prefix_match_unit not in (None, scheduler) and enable_caching:
            raise KVCacheMisuseError(
                f"Invalid prefix_match_unit={prefix_match_unit}; with a single KV cache group, "
                f"prefix-cache hits land on the block size ({scheduler}). Unset it or set it "
                f"to {scheduler} (vLLM 0.33 resolve_kv_cache_block_sizes raises ValueError)")
        return scheduler, scheduler
    if not enable_caching or any(isinstance(s, MambaSpec) and s.mamba_cache_mode != "align"
                                 for s in specs):
        return scheduler, scheduler
    hashed = prefix_match_unit if prefix_match_unit is not None else math.gcd(*sizes)
    if any(size % hashed for size in sizes):
        raise KVCacheMisuseError(
            f"Invalid prefix_match_unit={hashed}; prefix-cacheable KV cache group block sizes "
            f"must be divisible by prefix_match_unit (group block sizes {sizes}; vLLM 0.33 "
            "resolve_kv_cache_block_sizes raises ValueError): use a divisor of their gcd "
            f"({math.gcd(*sizes)})")
    return scheduler, hashed


class KVCacheManager:
    """Allocation, prefix caching and freeing over one ``BlockPool`` shared by every
    KV-cache group.

    Args:
        num_blocks: blocks in the pool, the null block 0 included.
        block_size: one full-attention group of this many tokens per block (exactly one of
            ``block_size`` and ``kv_cache_specs``).
        kv_cache_specs: one spec per group, in vLLM's group order.
        max_model_len: cap on slots per request (None: no cap).
        enable_caching: prefix caching on/off.
        hash_algo: ``sha256`` (default), ``sha256_cbor``, ``xxhash``, ``xxhash_cbor``.
        profile: version profile (default ``vllm-0.33``).
        enable_kv_cache_events: record KV events (``take_events``).
        pythonhashseed: the PYTHONHASHSEED the NONE_HASH is derived from; by default the
            environment's. ``None`` means unset.
        none_hash: force a NONE_HASH (overrides ``pythonhashseed``).
        prefix_cache_retention_interval: 0.33's ``KVCacheConfig`` field (ignored by 0.10).
        kv_event_factory: what the pool builds its events with (``events.KVEventFactory``;
            None: the reference's dataclasses). ``kv_cache_event_metadata(specs)`` gives what a
            factory that annotates 0.33's ``BlockStored`` needs, before the manager exists.
        dcp_world_size: decode context parallel world size (vLLM's ``KVCacheManager``
            argument): a sharded group's block covers ``block_size * dcp_world_size`` tokens
            (``kv_cache_specs`` holds the scaled specs).
        prefix_match_unit: vLLM 0.33's ``CacheConfig.prefix_match_unit`` (None: the gcd of
            the group block sizes); ``KVCacheMisuseError`` under vllm-0.10, which has none.
        use_eagle: EAGLE/MTP speculative decoding (vLLM's ``KVCacheManager(use_eagle=...)``):
            a prefix-cache hit drops its last block so the drafting head's hidden state is
            recomputed, in every group (docs/semantics.md#prefix-cache-hits) or only in the
            flagged ones (``eagle_group_ids``).
        eagle_group_ids: vLLM 0.33's groups flagged ``KVCacheGroupSpec.is_eagle_group`` (those
            holding the drafter's layers): with ``use_eagle`` only their hits drop, and a spec
            group (equal specs, one search) drops when any member is flagged; empty (the
            default): every group, vLLM's fallback. The multi-module MTP check applies when
            any is flagged even without ``use_eagle`` (vLLM checks ``eagle_group_ids``).
            ``KVCacheMisuseError`` for an id out of range, or under vllm-0.10 (no flag).
        num_prefill_lookahead: vLLM 0.33's multi-module MTP prefill lookahead ``K``
            (``num_speculative_tokens``; EAGLE's is 1): with EAGLE and caching on it must not
            exceed ``scheduler_block_size`` (vLLM raises ValueError; here
            ``KVCacheMisuseError``). Above 1 the last ``K - 1`` computed tokens may be
            re-prefilled: they are cached only once more tokens are computed (one group: any
            ``use_eagle``; several: only with ``use_eagle``, as vLLM 0.33's hybrid coordinator
            does), and every sliding-window group keeps ``K - 1`` more tokens below its window
            (``SlidingWindowSpec.extra_retained_tokens``, set here as vLLM's KV-cache planning
            sets it) (docs/semantics.md#multi-module-mtp). Above 1 with ``use_eagle`` and
            caching on beside a Mamba "align" group and other groups: ``KVCacheMisuseError``
            (vLLM 0.33.0 keys stale Mamba states there; one Mamba group alone is modelled).
            0.10.2 has no such argument.
        num_hash_lookahead_tokens: vLLM 0.33's hash lookahead ``L``
            (``KVCacheManager(num_hash_lookahead_tokens=L)``, with the request hasher's
            ``get_request_block_hasher(..., L)``; docs/semantics.md#request-block-hashes): a
            block is hashed, so cached and hit, only once the ``L`` tokens after it exist, its
            ``BlockStored`` carries them, and Mamba checkpoints leave them after the boundary.
            ``KVCacheMisuseError`` under vllm-0.10 (no lookahead hashing), with caching off
            and with ``use_eagle`` (vLLM's config and scheduler never pass either: lookahead
            is off without prefix caching, and it clears EAGLE's drop), and above 1 without a
            full-attention group (vLLM 0.33.0 raises IndexError there).

    Raises:
        KVCacheMisuseError: both or neither of ``block_size`` / ``kv_cache_specs``; a bad
            block size or ``max_model_len``; a layout that breaks one of vLLM's rules
            (docs/semantics.md#allocation-caching-freeing-and-events-with-several-groups), or a
            Mamba layout vLLM refuses or the reference does not model (``_check_mamba``), a
            DCP layout vLLM asserts against (``_check_dcp``), a ``prefix_match_unit`` vLLM
            rejects: the message names it; a ``watermark`` or ``max_in_flight_tokens`` out
            of range, or given under vllm-0.10 (which has neither).

    Admission gates (vLLM 0.33; docs/semantics.md#admission-gates):
        watermark: ``SchedulerConfig.watermark``, a fraction in ``[0, 1)`` of ``num_blocks``:
            ``int(watermark * num_blocks)`` blocks an admission of a request that holds no
            blocks (waiting or preempted) must leave free while another request is scheduled
            (``allocate_slots(..., has_scheduled_reqs)``).
        max_in_flight_tokens: ``VllmConfig.max_in_flight_tokens`` (None: ``max_model_len``,
            vLLM's default): it sizes a sliding window's and a chunked-local group's
            admission cap (``SingleTypeKVCacheManager.max_admission_blocks_per_request``),
            which ``allocate_slots(..., full_sequence_must_fit=True)`` counts against.

    Worker-side block zeroing (vLLM 0.33; docs/semantics.md#worker-side-block-zeroing):
        needs_kv_cache_zeroing: ``KVCacheConfig.needs_kv_cache_zeroing``: every attention
            group (not a Mamba group) records the blocks it takes from the pool, drained by
            ``take_new_block_ids``. Refused under ``vllm-0.10``.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int | None = None,
        *,
        kv_cache_specs: Sequence[KVCacheSpec] | None = None,
        max_model_len: int | None = None,
        enable_caching: bool = True,
        hash_algo: str = "sha256",
        profile: str | ProfileBehaviour | None = None,
        enable_kv_cache_events: bool = False,
        pythonhashseed: object = PYTHONHASHSEED_FROM_ENV,
        none_hash: bytes | None = None,
        prefix_cache_retention_interval: int | None = None,
        kv_event_factory: KVEventFactory | None = None,
        dcp_world_size: int = 1,
        prefix_match_unit: int | None = None,
        use_eagle: bool = False,
        num_prefill_lookahead: int = 0,
        num_hash_lookahead_tokens: int = 0,
        watermark: float = 0.0,
        eagle_group_ids: Collection[int] = (),
        max_in_flight_tokens: int | None = None,
        enable_mamba_shared_prefix_checkpoint: bool = False,
        needs_kv_cache_zeroing: bool = False,
    ) -> None:
        if (block_size is None) == (kv_cache_specs is None):
            raise KVCacheMisuseError(
                "KVCacheManager takes exactly one of block_size (one full-attention group) "
                f"and kv_cache_specs (one spec per group); got block_size={block_size!r}, "
                f"kv_cache_specs={kv_cache_specs!r}")
        if max_model_len is not None and max_model_len < 1:
            raise KVCacheMisuseError(f"max_model_len must be >= 1 or None, got {max_model_len!r}")
        specs = ((FullAttentionSpec(block_size),) if block_size is not None
                 else tuple(kv_cache_specs or ()))
        for spec in specs:
            if not isinstance(spec, KVCacheSpec):
                raise KVCacheMisuseError(f"not a KV-cache spec: {spec!r}")
        self.profile = get_profile(profile)
        self.v033 = self.profile.hybrid_rules == "spec_groups"
        for name, value in (("dcp_world_size", dcp_world_size),
                            ("prefix_match_unit", prefix_match_unit)):
            if value is not None and (type(value) is not int or value < 1):
                raise KVCacheMisuseError(f"{name} must be an int >= 1, got {value!r}")
        self.dcp_world_size = dcp_world_size
        self._check_dcp(specs, enable_caching)
        unscaled_specs = tuple(specs)
        specs = dcp_kv_cache_specs(specs, dcp_world_size, self.profile)
        #: The groups' specs, block sizes scaled by DCP (``dcp_kv_cache_specs``).
        self.kv_cache_specs = specs
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.scheduler_block_size, self.hash_block_size = resolve_kv_cache_block_sizes(
            specs, enable_caching, self.profile, prefix_match_unit)
        #: Tokens per block of the scheduler's view (one group: its block size).
        self.block_size = self.scheduler_block_size
        retention = prefix_cache_retention_interval if self.v033 else None
        if self.v033:
            self._validate_retention(retention)
        self._check_cross_attention(enable_caching)
        self._check_mamba(enable_caching, retention)
        self._check_supported(enable_caching, enable_kv_cache_events)
        eagle_ids = self._check_eagle_group_ids(eagle_group_ids)
        self._check_eagle(use_eagle, enable_caching, num_prefill_lookahead,
                          eagle_ids=eagle_ids)
        self._check_hash_lookahead(num_hash_lookahead_tokens, use_eagle, enable_caching)
        #: EAGLE/MTP: hits drop their last block (in ``eagle_group_ids``, else every group).
        self.use_eagle = use_eagle
        #: vLLM 0.33's groups flagged ``is_eagle_group`` (empty: none flagged).
        self.eagle_group_ids = eagle_ids
        #: Multi-module MTP's prefill lookahead (0 or 1: none).
        self.num_prefill_lookahead = num_prefill_lookahead
        if num_prefill_lookahead > 1:
            # vLLM 0.33's kv_cache_planning tags every sliding window with the re-prefillable
            # tail (kv_cache_planning.py:1634-1640), caching on or off.
            specs = tuple(dataclasses.replace(s, extra_retained_tokens=num_prefill_lookahead - 1)
                          if isinstance(s, SlidingWindowSpec) else s for s in specs)
            self.kv_cache_specs = specs
        self.coordinator: KVCacheCoordinator = get_kv_cache_coordinator(
            specs, num_blocks, profile=self.profile, enable_caching=enable_caching,
            enable_kv_cache_events=enable_kv_cache_events,
            scheduler_block_size=self.scheduler_block_size,
            hash_block_size=self.hash_block_size, retention_interval=retention,
            kv_event_factory=kv_event_factory, use_eagle=use_eagle,
            num_prefill_lookahead=num_prefill_lookahead, eagle_group_ids=eagle_ids,
            dcp_world_size=dcp_world_size, num_hash_lookahead_tokens=num_hash_lookahead_tokens)
        if dcp_world_size > 1 and not self.v033:
            # vLLM 0.10.2's MambaManager scales its block by DCP like every manager but adds
            # its speculative slots at the spec's own block size (single_type_kv_cache_manager
            # .py:580-583, 596-598).
            for manager in self.coordinator.single_type_managers:
                if isinstance(manager, MambaManager):
                    manager.speculative_block_tokens = manager.block_size // dcp_world_size
        self.block_pool = self.coordinator.block_pool
        self._set_admission_gates(num_blocks, watermark, max_in_flight_tokens, unscaled_specs)
        # Built even with caching off so requests can still be hashed (vLLM builds it when a
        # KV connector needs hashes); the manager itself ignores hashes when caching is off.
        self.block_hasher = make_block_hasher(self.hash_block_size, hash_algo, self.profile,
                                              pythonhashseed, none_hash,
                                              num_hash_lookahead_tokens)
        #: Per group ``(kind, sliding_window)`` as 0.33's ``take_events`` annotates events.
        self.kv_cache_event_metadata = kv_cache_event_metadata(specs)
        #: vLLM 0.33's fine-grained partial hash hits are on (its coordinator's
        #: ``enable_partial_hash_hits``): hits land on hash-block boundaries and a hit ending
        #: inside a block is copied on write (``take_kv_cache_block_copies``).
        self.enable_partial_hash_hits = self.coordinator.enable_partial_hash_hits
        self._set_shared_prefix_checkpoint(enable_mamba_shared_prefix_checkpoint)
        self._set_block_zeroing(needs_kv_cache_zeroing)
        self._group_block_sizes = tuple(s.block_size for s in specs)
        # "No hits" for every group, immutable so it can be shared by every call.
        self._no_hits: tuple[tuple[KVCacheBlock, ...], ...] = ((),) * len(specs)

    def _set_shared_prefix_checkpoint(self, enable: bool) -> None:
        """vLLM 0.33's ``enable_mamba_shared_prefix_checkpoint`` (``KVCacheManager.__init__``
        ``:184-198``): kept only with an EAGLE group (flagged ``is_eagle_group``, or every
        group under ``use_eagle``: the coordinator's ``eagle_group_ids``), fine-grained hits
        on and no re-prefillable tail (``num_prefill_lookahead`` <= 1), else dropped without
        an error, as vLLM narrows it; kept, it sets every Mamba manager's
        ``shared_prefix_checkpoint``. vLLM 0.10.2 has no such argument: refused."""
        if type(enable) is not bool:
            raise KVCacheMisuseError(
                f"enable_mamba_shared_prefix_checkpoint must be True or False, got {enable!r}")
        if enable and not self.v033:
            raise KVCacheMisuseError(
                "enable_mamba_shared_prefix_checkpoint=True: vLLM 0.10.2 has no Mamba "
                "shared-prefix checkpoint (a vLLM 0.33 CacheConfig flag); leave it False or "
                "use profile vllm-0.33")
        coordinator = self.coordinator
        #: The narrowed flag (vLLM's ``KVCacheManager.mamba_shared_prefix_checkpoint``).
        self.mamba_shared_prefix_checkpoint = (
            enable and bool(self.eagle_group_ids or self.use_eagle)
            and coordinator.enable_partial_hash_hits
            and coordinator.num_reprefillable_tokens == 0)
        if self.mamba_shared_prefix_checkpoint:
            for manager in coordinator.single_type_managers:
                if isinstance(manager, MambaManager):
                    manager.shared_prefix_checkpoint = True

    def _set_block_zeroing(self, needs_kv_cache_zeroing: bool) -> None:
        """vLLM 0.33's ``needs_kv_cache_zeroing`` (``SingleTypeKVCacheManager.__init__``
        ``:114-120``): the groups whose spec is an attention spec (every kind here but Mamba)
        record their fresh blocks; vLLM 0.10.2 has no zeroing: refused."""
        if type(needs_kv_cache_zeroing) is not bool:
            raise KVCacheMisuseError(
                f"needs_kv_cache_zeroing must be True or False, got {needs_kv_cache_zeroing!r}")
        if needs_kv_cache_zeroing and not self.v033:
            raise KVCacheMisuseError(
                "needs_kv_cache_zeroing=True: vLLM 0.10.2 has no worker-side block zeroing "
                "(vLLM 0.33's KVCacheConfig.needs_kv_cache_zeroing); leave it False or use "
                "profile vllm-0.33")
        #: Whether fresh attention blocks are recorded for the worker to zero.
        self.needs_kv_cache_zeroing = needs_kv_cache_zeroing
        if needs_kv_cache_zeroing:
            for manager in self.coordinator.single_type_managers:
                if not isinstance(manager.kv_cache_spec, MambaSpec):
                    manager.record_new_block_ids()

    def _set_admission_gates(self, num_blocks: int, watermark: float,
                             max_in_flight_tokens: int | None,
                             unscaled_specs: Sequence[KVCacheSpec]) -> None:
        """``watermark_blocks`` and each group's admission cap (vLLM 0.33
        ``KVCacheManager.__init__``, ``get_manager_for_kv_cache_spec``) from the groups'
        specs before DCP scaled their blocks (``unscaled_specs``); vllm-0.10 has neither and
        refuses them."""
        if (type(watermark) not in (int, float) or not 0.0 <= watermark < 1.0):
            raise KVCacheMisuseError(
                f"watermark must be a float in [0, 1) (a fraction of the pool, vLLM's "
                f"SchedulerConfig.watermark), got {watermark!r}")
        if max_in_flight_tokens is not None and (type(max_in_flight_tokens) is not int
                                                 or max_in_flight_tokens < 1):
            raise KVCacheMisuseError(
                f"max_in_flight_tokens must be an int >= 1 or None, got "
                f"{max_in_flight_tokens!r}")
        if not self.v033 and (watermark or max_in_flight_tokens is not None):
            raise KVCacheMisuseError(
                f"watermark={watermark!r} / max_in_flight_tokens={max_in_flight_tokens!r}: "
                "vLLM 0.10.2's KVCacheManager has no admission gates (vLLM 0.33 added them); "
                "use profile vllm-0.33 or leave them at 0.0 / None")
        #: Blocks a waiting or preempted request's admission leaves free while another
        #: request is scheduled (vLLM 0.33: ``int(watermark * num_blocks)``).
        self.watermark_blocks = int(watermark * num_blocks)
        if self.watermark_blocks:
            # Every allocation may pay the watermark: all go through the gates, and the hot
            # path of a manager without one checks nothing more.
            self.allocate_slots = self._allocate_slots_watermarked  # type: ignore[method-assign]
        self.max_in_flight_tokens = max_in_flight_tokens
        if max_in_flight_tokens is None:
            max_in_flight_tokens = self.max_model_len
        for manager, spec in zip(self.coordinator.single_type_managers, unscaled_specs,
                                 strict=True):
            # The cap is the spec's, in its unscaled blocks (vLLM 0.33 computes it on the
            # KVCacheSpec before the manager scales the block by DCP).
            manager.max_admission_blocks_per_request = manager.admission_cap(
                max_in_flight_tokens, self.max_model_len, spec.block_size)

    def _validate_retention(self, retention: int | None) -> None:
        if retention is None:
            return
        if not any(isinstance(s, (SlidingWindowSpec, MambaSpec)) for s in self.kv_cache_specs):
            if retention == 0:
                return
            raise KVCacheMisuseError(
                "prefix_cache_retention_interval is set but this model has no sliding-window "
                "or Mamba KV cache group, so retention has no effect (vLLM 0.33 raises "
                "ValueError): set it to 0 or None")
        if retention < 0 or retention % self.scheduler_block_size:
            raise KVCacheMisuseError(
                f"prefix_cache_retention_interval ({retention}) must be non-negative and a "
                f"multiple of scheduler_block_size ({self.scheduler_block_size})")

    def _check_dcp(self, specs: Sequence[KVCacheSpec], enable_caching: bool) -> None:
        """Refuse the DCP layouts vLLM asserts against (at construction here; vLLM fails some
        only at the first cache lookup). A Mamba group is taken: unscaled under 0.33
        (``dcp_kv_cache_specs``), scaled under 0.10.2 with its speculative slots at the
        spec's own size (``MambaManager.speculative_block_tokens``)."""
        if self.dcp_world_size == 1:
            return
        if not enable_caching:
            return  # caching off: any groups (vLLM's no-prefix-cache coordinator)
        if not self.v033:
            if len(specs) > 1:
                raise KVCacheMisuseError(
                    f"dcp_world_size={self.dcp_world_size} with {len(specs)} KV-cache groups "
                    "and prefix caching on: vLLM 0.10.2's KVCacheManager asserts one group "
                    "(kv_cache_manager.py:113-114) and its HybridKVCacheCoordinator 'DCP not "
                    "support hybrid attn now.'; use one group or enable_caching=False")
        elif len(specs) > 1:
            bad = [s for s in specs if not isinstance(s, (FullAttentionSpec, MambaSpec))]
            if bad:
                raise KVCacheMisuseError(
                    f"dcp_world_size={self.dcp_world_size}: vLLM 0.33's "
                    "HybridKVCacheCoordinator asserts 'DCP with hybrid KV cache layouts only "
                    f"supports full-attention, Mamba, and replicated draft groups', got {bad[0]!r}"
                    "; use enable_caching=False or dcp_world_size=1")
        spec = next((s for s in specs if isinstance(
            s, (SlidingWindowSpec, ChunkedLocalAttentionSpec))), None)
        if spec is not None:  # one group here (the checks above took several)
            rule = "sliding window" if isinstance(spec, SlidingWindowSpec) else "chunked local"
            raise KVCacheMisuseError(
                f"dcp_world_size={self.dcp_world_size} with {spec!r} and prefix caching on: "
                f"vLLM's manager asserts 'DCP not support {rule} attn now.' at its first cache "
                "lookup (find_longest_cache_hit); use enable_caching=False or dcp_world_size=1")
        # A Mamba group with caching on: under 0.33 its manager is unsharded (its own
        # dcp_world_size is 1, so its lookup's 'DCP not support mamba now.' holds); 0.10.2 has
        # no Mamba prefix caching (refused by _check_mamba).

    def _check_hash_lookahead(self, num_hash_lookahead_tokens: int, use_eagle: bool,
                              enable_caching: bool) -> None:
        """``num_hash_lookahead_tokens``: an int >= 0; above 0 only under vLLM 0.33, with
        caching on and without ``use_eagle``, the only way vLLM's config and scheduler pass it
        (``config/vllm.py`` ``num_hash_lookahead_tokens``: 0 without prefix caching;
        ``sched/scheduler.py:342-360``: lookahead hashes clear EAGLE's drop)."""
        lookahead = num_hash_lookahead_tokens
        if type(lookahead) is not int or lookahead < 0:
            raise KVCacheMisuseError(
                f"num_hash_lookahead_tokens must be an int >= 0, got {lookahead!r}")
        if not lookahead:
            return
        if not self.v033:
            raise KVCacheMisuseError(
                f"num_hash_lookahead_tokens={lookahead}: vLLM 0.10.2 has no hash lookahead "
                "(its KVCacheManager and get_request_block_hasher take none); use 0 or a "
                "vllm-0.33 profile")
        if not enable_caching:
            raise KVCacheMisuseError(
                f"num_hash_lookahead_tokens={lookahead} with enable_caching=False: vLLM 0.33's "
                "config turns hash lookahead off without prefix caching "
                "(VllmConfig.num_hash_lookahead_tokens is 0); use 0")
        if use_eagle:
            raise KVCacheMisuseError(
                f"num_hash_lookahead_tokens={lookahead} with use_eagle=True: vLLM 0.33's "
                "scheduler passes use_eagle=False whenever it hashes with lookahead (the "
                "lookahead hashes already prove the drafter's token, sched/scheduler.py:342-"
                "360); use one or the other")
        if lookahead > 1 and not any(isinstance(s, FullAttentionSpec)
                                     for s in self.kv_cache_specs):
            raise KVCacheMisuseError(
                f"num_hash_lookahead_tokens={lookahead} with prefix caching on and no "
                "full-attention group: vLLM 0.33.0's coordinators search the first group up "
                "to num_tokens - 1 tokens, past the request's last lookahead hash, and a "
                "sliding-window, chunked-local or Mamba search indexes the missing hashes "
                "(IndexError in find_longest_cache_hit; a full-attention group, searched "
                "first, stops at the hashes and caps the others); use "
                "num_hash_lookahead_tokens <= 1 or a full-attention group")

    def _check_eagle_group_ids(self, eagle_group_ids: Collection[int]) -> frozenset[int]:
        """``eagle_group_ids`` as a set: group indices (ints in range), none under vllm-0.10,
        whose ``KVCacheGroupSpec`` has no ``is_eagle_group``."""
        ids = tuple(eagle_group_ids)
        bad = [i for i in ids if type(i) is not int or not 0 <= i < len(self.kv_cache_specs)]
        if bad:
            raise KVCacheMisuseError(
                f"eagle_group_ids {bad!r}: each must be a group index in "
                f"[0, {len(self.kv_cache_specs)})")
        if ids and not self.v033:
            raise KVCacheMisuseError(
                f"eagle_group_ids={sorted(ids)}: vLLM 0.10.2's KVCacheGroupSpec has no "
                "is_eagle_group (with use_eagle every group drops): pass none under vllm-0.10")
        return frozenset(ids)

    def _check_eagle(self, use_eagle: bool, enable_caching: bool,
                     num_prefill_lookahead: int, *,
                     eagle_ids: frozenset[int] = frozenset()) -> None:
        """EAGLE with prefix caching and a chunked local attention group that drops is
        refused: vLLM's ``ChunkedLocalAttentionManager.find_longest_cache_hit`` asserts
        ``drop_eagle_block is False`` ('Hybrid KV cache is not supported for eagle + chunked
        local attention', 0.33 ``single_type_kv_cache_manager.py:1333``, 0.10.2 ``:457``) on
        the first lookup. A chunked group drops when it is in vLLM 0.33's
        ``drop_eagle_group_ids`` (``eagle_ids``, the groups flagged ``is_eagle_group``, or
        every group when none is: then also under vLLM 0.10.2 and with one group) or shares
        its spec with a group that is (``SpecGroup.use_eagle``); an unflagged chunked group
        beside a flagged group of another spec never drops and runs as without EAGLE.
        ``num_prefill_lookahead``: an int >= 0, 0 or 1 under vLLM 0.10.2 (it has no such
        argument), and vLLM 0.33's check (``kv_cache_coordinator.py:150-159``): with EAGLE and
        caching on, at most ``scheduler_block_size`` (also when a group is flagged
        ``is_eagle_group``, vLLM checking ``eagle_group_ids``)."""
        if type(use_eagle) is not bool:
            raise KVCacheMisuseError(f"use_eagle must be a bool, got {use_eagle!r}")
        if type(num_prefill_lookahead) is not int or num_prefill_lookahead < 0:
            raise KVCacheMisuseError(
                f"num_prefill_lookahead must be an int >= 0, got {num_prefill_lookahead!r}")
        if num_prefill_lookahead and not self.v033:
            raise KVCacheMisuseError(
                "num_prefill_lookahead is a vLLM 0.33 KVCacheManager argument (multi-module "
                "MTP); vLLM 0.10.2 has none: use num_prefill_lookahead=0")
        if (enable_caching and (use_eagle or eagle_ids)
                and self.scheduler_block_size < num_prefill_lookahead):
            raise KVCacheMisuseError(
                "Multi-module MTP with prefix caching requires scheduler_block_size (="
                f"{self.scheduler_block_size}) >= num_speculative_tokens (="
                f"{num_prefill_lookahead}). (vLLM 0.33 raises ValueError: lower "
                "num_speculative_tokens or use larger blocks)")
        aligned = [s for s in self.kv_cache_specs
                   if isinstance(s, MambaSpec) and s.mamba_cache_mode == "align"]
        if (enable_caching and num_prefill_lookahead > 1 and aligned and use_eagle
                and len(self.kv_cache_specs) > 1):
            # Found by the multi-group differential: with the caching lag vLLM 0.33.0 keys
            # (and hands a KV connector) a Mamba state for num_computed - (K - 1) tokens from
            # a block that by then holds the state after more tokens. A stale state is not
            # behaviour to reproduce. One Mamba group alone keys only whole blocks (its hash
            # block is its block), which hold their state: modelled (vLLM 0.33.0 agrees).
            raise KVCacheMisuseError(
                f"num_prefill_lookahead={num_prefill_lookahead} with prefix caching and "
                f"use_eagle beside a Mamba 'align' group ({aligned[0]!r}) is not modelled: "
                "vLLM 0.33.0 caches the last num_prefill_lookahead - 1 computed tokens of "
                "EAGLE's groups later and then keys a Mamba state for fewer tokens than its "
                "block holds; use num_prefill_lookahead <= 1, mamba_cache_mode 'none', "
                "use_eagle=False or enable_caching=False")
        if not (use_eagle and enable_caching):
            return
        specs = self.kv_cache_specs
        # vLLM 0.33's drop_eagle_group_ids (0.10.2: every group), widened to spec groups.
        drops = (eagle_ids or range(len(specs))) if self.v033 else range(len(specs))
        dropping = {specs[i] for i in drops}
        chunked = [(i, s) for i, s in enumerate(specs)
                   if isinstance(s, ChunkedLocalAttentionSpec) and s in dropping]
        if chunked:
            i, spec = chunked[0]
            why = ("it is flagged is_eagle_group" if i in eagle_ids
                   else "a group of its spec is flagged is_eagle_group: one search"
                   if eagle_ids else "no group is flagged is_eagle_group: every group drops")
            raise KVCacheMisuseError(
                f"use_eagle=True with prefix caching and group {i} {spec!r}, whose hits drop "
                f"EAGLE's block ({why}): vLLM asserts 'Hybrid KV cache is not supported for "
                "eagle + chunked local attention' (ChunkedLocalAttentionManager."
                "find_longest_cache_hit); flag only groups of another spec is_eagle_group "
                "(vLLM 0.33), or use use_eagle=False or enable_caching=False for this layout")
        checkpointed = [s for s in self.kv_cache_specs
                        if isinstance(s, MambaSpec) and s.num_prefill_checkpoint_blocks]
        if checkpointed:
            # Found by the multi-group differential: EAGLE keys a checkpoint one block below
            # its table index, and a request hitting it makes vLLM 0.33.0 fail
            # ``assert block_idx < len(req_blocks)`` in MambaManager._apply_cow. A crash is
            # not behaviour to reproduce.
            raise KVCacheMisuseError(
                f"use_eagle=True with prefix caching and Mamba prefill checkpoint blocks "
                f"({checkpointed[0]!r}) is not modelled: vLLM 0.33.0 fails an assertion in "
                "MambaManager._apply_cow once a request hits a checkpoint EAGLE keyed below "
                "its table index; use use_eagle=False or num_prefill_checkpoint_blocks=0")

    def _check_cross_attention(self, enable_caching: bool) -> None:
        """A cross-attention group only with prefix caching off, as vLLM runs encoder-decoder
        models."""
        if enable_caching and any(isinstance(s, CrossAttentionSpec)
                                  for s in self.kv_cache_specs):
            raise KVCacheMisuseError(
                "a cross-attention KV-cache group needs prefix caching off "
                "(enable_caching=False): encoder-decoder models run without it (vLLM 0.33 "
                "ModelConfig.is_prefix_caching_supported, 0.10.2 config/__init__.py:3465 "
                "'Encoder-decoder models do not support chunked prefill nor prefix caching'), "
                "and vLLM's CrossAttentionManager raises NotImplementedError on a cache lookup")

    def _check_mamba(self, enable_caching: bool, retention: int | None) -> None:
        """Refuse the Mamba layouts vLLM refuses, and those the reference does not model,
        naming the rule."""
        mamba = [s for s in self.kv_cache_specs if isinstance(s, MambaSpec)]
        if not mamba:
            return
        if any(isinstance(s, CrossAttentionSpec) for s in self.kv_cache_specs):
            raise KVCacheMisuseError(
                "a Mamba group beside a cross-attention group is not modelled (no vLLM "
                "encoder-decoder model has Mamba layers)")
        if not self.v033:
            checkpoints = [s for s in mamba if s.num_prefill_checkpoint_blocks
                           or s.prefill_checkpoint_alignment is not None]
            if checkpoints:
                raise KVCacheMisuseError(
                    f"{checkpoints[0]!r}: num_prefill_checkpoint_blocks and "
                    "prefill_checkpoint_alignment are vLLM 0.33 MambaSpec fields; vLLM 0.10.2's "
                    "MambaSpec has neither (no Mamba prefix caching, no prefill checkpoints): "
                    "leave them at 0 and None")
            if any(s.mamba_cache_mode != "none" for s in mamba):
                raise KVCacheMisuseError(
                    "mamba_cache_mode is a vLLM 0.33 MambaSpec field; vLLM 0.10.2 has no "
                    "Mamba prefix caching (its behaviour is mode 'none')")
            if enable_caching:
                raise KVCacheMisuseError(
                    "vLLM 0.10.2 does not support prefix caching with Mamba layers: "
                    "gpu_model_runner.py:3706-3708 raises NotImplementedError('Prefix caching "
                    "is not supported for Mamba yet.'), and MambaModelConfig turns it off "
                    "(model_executor/models/config.py:308-311); use enable_caching=False")
            return
        if enable_caching:
            none = [s for s in mamba if s.mamba_cache_mode != "align"]
            if none:
                raise KVCacheMisuseError(
                    f"{none[0]!r} with prefix caching on: vLLM 0.33 asserts 'Mamba prefix "
                    "caching requires mamba_cache_mode=\'align\'' "
                    "(single_type_kv_cache_manager.py:1442-1444); its config sets 'align' "
                    "when caching is on and 'none' when off")

    def _check_supported(self, enable_caching: bool, events: bool) -> None:
        """Refuse a layout the reference does not reproduce (the message names why).

        A full-attention group whose block exceeds the hash block (0.33) is modelled: it
        registers partial-block keys (docs/semantics.md#partial-block-keys), looked up at the
        hash block when fine-grained partial hash hits are on (a Mamba "align" group larger
        than the hash block; docs/semantics.md#fine-grained-partial-hits).
        """
        specs = self.kv_cache_specs
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
        """A ``Request`` hashed at the hash block size with this manager's algorithm and
        NONE_HASH."""
        return Request(request_id, prompt_token_ids, block_hasher=self.block_hasher, **kwargs)

    @property
    def num_kv_cache_groups(self) -> int:
        return len(self.kv_cache_specs)

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.get_num_free_blocks()

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    # ---------------------------------------------------------------- prefix cache
    def get_computed_blocks(self, request: Request) -> tuple[GroupBlocks, int]:
        """The longest cached prefix: ``(hit blocks per group, num_computed_tokens)``.

        Every group's list covers the same common hit length (nulls where a window no
        longer needs a block); the hit is capped at ``request.num_tokens - 1`` tokens: the last
        token is always recomputed to obtain logits, so a block-aligned prompt of n blocks
        hits at most n - 1. Empty lists and 0 with caching off or when
        ``request.skip_reading_prefix_cache``. No side effects on the pool: ``ref_cnt`` and
        free-queue order are unchanged. (vLLM 0.33 returns a third element, the shared-prefix
        boundary, which the reference keeps in its coordinator.)
        """
        if not self.enable_caching or request.skip_reading_prefix_cache:
            self.coordinator.discard_cache_hit(request.request_id)
            return self.coordinator.empty_blocks(), 0
        return self.coordinator.find_longest_cache_hit(request, request.num_tokens - 1)

    # ---------------------------------------------------------------- allocation
    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: Sequence[Sequence[KVCacheBlock]] | None = None,
        num_lookahead_tokens: int = 0,
        delay_cache_blocks: bool = False,
        # Not keyword-only, though after delay_cache_blocks unlike vLLM (callers pass that one
        # by position): CPython does not specialize calls of functions with keyword-only
        # parameters, and this is the hot path.
        num_external_computed_tokens: int = 0,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        # None: vLLM's 0, and the ungated hot path (an identity test is the cheapest check).
        reserved_blocks: int | None = None,
        has_scheduled_reqs: bool = True,
    ) -> GroupBlocks | None:
        """Make room for ``num_new_tokens`` (plus hits, external tokens and lookahead) in
        every group and return only the newly allocated blocks, one list per group in
        block-table order.

        External (KV-connector) tokens, ``num_external_computed_tokens = E``
        (docs/semantics.md#external-kv-connector-tokens): ``vllm-0.33`` computes
        ``min(local + E, max_model_len)`` tokens, gives the external tokens fresh blocks
        after every group adopted its hits (two phases, vLLM PR #44409), with no hash until
        they are cached, and returns, as vLLM does, only the blocks after them (the external
        blocks are in ``get_blocks``); zero new tokens are legal when anything is computed.
        ``vllm-0.10`` adds E to ``num_new_tokens``, as 0.10.2's scheduler passes them (the
        external blocks are then among the returned ones). ``delay_cache_blocks`` (an
        asynchronous load) caches nothing in this call: ``cache_blocks`` does, later.

        Encoder tokens, ``num_encoder_tokens = E`` (an encoder-decoder model, in the call that
        schedules the request's encoder input; docs/semantics.md#cross-attention-groups): every
        cross-attention group's table is sized to ``cdiv(E, block_size)`` blocks, apart from
        the decoder's tokens; later calls pass 0 (0.10.2 then counts the cross-attention
        blocks held as a negative need, as it does).

        Mamba groups (``MambaSpec``): sized by ``num_tokens_main_model = computed + new`` in
        "align" mode (lookahead ignored), and what they return for this call is the table from
        its previous end on, null padding and relocated speculative blocks included, as vLLM
        returns it; call ``new_step_starts`` at the start of each scheduler step (vLLM 0.33's
        same-step refusal of a hit on a block cached in this step lifts then).

        ``new_computed_blocks`` is what ``get_computed_blocks`` returned (one list per group;
        None or empty: no hits). All-or-nothing: returns None when the pool is short, with
        nothing changed but the blocks a window skipped (as in vLLM): not the hits'
        ``ref_cnt`` nor queue positions. Otherwise the hits are touched **before** new blocks
        are popped, so the request's own hits are never evicted for it, and the blocks that
        became full are cached unless ``delay_cache_blocks``.

        Admission gates (vLLM 0.33's scheduler passes them for a waiting or preempted
        request; ``_allocate_gated``, docs/semantics.md#admission-gates):
        ``full_sequence_must_fit`` refuses (None) unless the request's full sequence fits,
        each group clamped at its admission cap; ``reserved_blocks`` free blocks stay for
        other in-flight sequences; ``has_scheduled_reqs``: whether another request runs this
        step, which (with a request holding no blocks) applies the constructor's watermark.

        Asynchronous scheduling (vLLM 0.33, docs/semantics.md#asynchronous-scheduling):
        ``vllm-0.33`` frees the blocks a window skips at ``max(0, computed -
        request.num_in_flight_tokens)`` tokens, not at the optimistic count.

        Raises:
            KVCacheMisuseError: negative counts; hits of the wrong shape (one list per group)
                or whose token count is not ``num_new_computed_tokens`` in every group; hits
                for a request that already holds blocks; hits with caching off; nothing to
                compute (``num_new_tokens == 0`` without hits; in ``vllm-0.10`` any
                ``num_new_tokens == 0``); ``num_encoder_tokens`` negative, or given to a
                model without a cross-attention group.
        """
        if num_new_tokens < 0 or num_new_computed_tokens < 0 or num_lookahead_tokens < 0:
            self._raise_negative(request, num_new_tokens, num_new_computed_tokens,
                                 num_lookahead_tokens)
        if num_external_computed_tokens:
            num_new_tokens, num_external_computed_tokens = self._external_tokens(
                request, num_new_tokens, num_new_computed_tokens, num_external_computed_tokens)
        coordinator = self.coordinator
        if new_computed_blocks:
            hits = new_computed_blocks
            has_hits = self._check_hits(request, hits, num_new_computed_tokens)
        else:  # every decode step: no hits, nothing to check but the token count
            hits = self._no_hits
            has_hits = False
            if num_new_computed_tokens:
                self._raise_hit_tokens(request, hits, num_new_computed_tokens)
        if num_new_tokens == 0 and (
            self.profile.allocate_zero_new_tokens_raises_always
            or not (has_hits or num_external_computed_tokens)
        ):
            raise KVCacheMisuseError(
                "num_new_tokens must be greater than 0"
                + ("" if has_hits or num_external_computed_tokens
                   else " when there are no prefix-cache hits or external tokens to adopt"))

        num_local_computed = request.num_computed_tokens + num_new_computed_tokens
        # Local hits and external tokens (uncapped: what the windows' skip counts).
        num_computed = total_computed = num_local_computed + num_external_computed_tokens
        num_tokens_need_slot = num_computed + num_new_tokens + num_lookahead_tokens
        if self.max_model_len is not None:
            num_tokens_need_slot = min(num_tokens_need_slot, self.max_model_len)
            if self.v033:  # 0.10.2 caches up to the uncapped count
                total_computed = min(total_computed, self.max_model_len)

        # A bool and an identity test: the ungated hot path pays no more (with a watermark
        # every call arrives here with reserved_blocks set: _allocate_slots_watermarked).
        if full_sequence_must_fit or reserved_blocks is not None:
            return self._allocate_gated(
                request, hits, has_hits, num_local_computed, num_computed, total_computed,
                num_new_tokens, num_tokens_need_slot, num_external_computed_tokens,
                num_encoder_tokens, delay_cache_blocks, full_sequence_must_fit,
                reserved_blocks, has_scheduled_reqs)
        if coordinator.skips_blocks:  # so does every layout with a cross-attention group
            # 0.33 frees on the processed-token basis: an in-flight step's window still
            # reads blocks below the optimistic count (asynchronous scheduling).
            coordinator.remove_skipped_blocks(
                request.request_id,
                max(0, total_computed - request.num_in_flight_tokens) if self.v033
                else request.num_computed_tokens)
            if coordinator.has_encoder_groups:
                return self._allocate_with_encoder(
                    request, hits, has_hits, num_local_computed, num_computed, total_computed,
                    num_new_tokens, num_tokens_need_slot, num_external_computed_tokens,
                    num_encoder_tokens, delay_cache_blocks)
            if coordinator.has_main_model_groups and not num_encoder_tokens:
                return self._allocate_with_main_model(
                    request, hits, has_hits, num_local_computed, num_computed, total_computed,
                    num_new_tokens, num_tokens_need_slot, num_external_computed_tokens,
                    delay_cache_blocks)
        if num_encoder_tokens:  # refused there (no cross-attention group); one local test here
            return self._allocate_with_encoder(
                request, hits, has_hits, num_local_computed, num_computed, total_computed,
                num_new_tokens, num_tokens_need_slot, num_external_computed_tokens,
                num_encoder_tokens, delay_cache_blocks)
        if coordinator.get_num_blocks_to_allocate(
                request.request_id, num_tokens_need_slot, hits,
                num_computed) > self.block_pool.free_block_queue.num_free_blocks:
            return None
        if has_hits or num_external_computed_tokens:
            # Touch first: a hit sitting in the free queue must leave it before the new blocks
            # are popped from the head, or this request could evict its own prefix
            # (test_computed_blocks_not_evicted).
            coordinator.add_computed_blocks(request.request_id, hits, num_local_computed,
                                            num_external_computed_tokens)
        new_blocks = coordinator.allocate_new_blocks(request.request_id, num_tokens_need_slot)
        if self.enable_caching and not delay_cache_blocks:
            # Drafts and lookahead slots are never cached.
            coordinator.cache_blocks(
                request, min(total_computed + num_new_tokens, request.num_tokens))
        return new_blocks

    def _allocate_with_encoder(self, request: Request,
                               hits: Sequence[Sequence[KVCacheBlock]], has_hits: bool,
                               num_local_computed: int, num_computed: int,
                               total_computed: int, num_new_tokens: int,
                               num_tokens_need_slot: int, num_external_computed_tokens: int,
                               num_encoder_tokens: int,
                               delay_cache_blocks: bool, headroom: int = 0) -> GroupBlocks | None:
        """``allocate_slots`` from its capacity check on, for a model with cross-attention
        groups: the same steps, with ``num_encoder_tokens`` sizing those groups (kept apart
        so that the decoder-only hot path passes no extra argument)."""
        coordinator = self.coordinator
        if num_encoder_tokens < 0:
            raise KVCacheMisuseError(
                f"allocate_slots({request.request_id!r}): num_encoder_tokens must be >= 0, "
                f"got {num_encoder_tokens}")
        if not coordinator.has_encoder_groups:
            raise KVCacheMisuseError(
                f"allocate_slots({request.request_id!r}, num_encoder_tokens="
                f"{num_encoder_tokens}): this model has no cross-attention KV-cache group "
                "to hold encoder tokens; vLLM's scheduler passes them only for an "
                "encoder-decoder model (a decoder-only model passes 0)")
        if coordinator.get_num_blocks_to_allocate(
                request.request_id, num_tokens_need_slot, hits, num_computed,
                num_encoder_tokens) > self.block_pool.free_block_queue.num_free_blocks - headroom:
            return None
        if not self.v033:
            self._check_v010_encoder_need(request.request_id, num_tokens_need_slot,
                                          num_encoder_tokens)
        if has_hits or num_external_computed_tokens:
            coordinator.add_computed_blocks(request.request_id, hits, num_local_computed,
                                            num_external_computed_tokens)
        new_blocks = coordinator.allocate_new_blocks(request.request_id, num_tokens_need_slot,
                                                     num_encoder_tokens)
        if self.enable_caching and not delay_cache_blocks:  # never with cross attention
            coordinator.cache_blocks(
                request, min(total_computed + num_new_tokens, request.num_tokens))
        return new_blocks

    def _allocate_with_main_model(self, request: Request,
                                  hits: Sequence[Sequence[KVCacheBlock]], has_hits: bool,
                                  num_local_computed: int, num_computed: int,
                                  total_computed: int, num_new_tokens: int,
                                  num_tokens_need_slot: int, num_external_computed_tokens: int,
                                  delay_cache_blocks: bool, headroom: int = 0
                                  ) -> GroupBlocks | None:
        """``allocate_slots`` from its capacity check on, for a model with a Mamba group: the
        same steps, every group also given ``num_tokens_main_model = computed + new``
        (vLLM 0.33 ``kv_cache_manager.py:550``: lookahead excluded, and not capped at
        ``max_model_len`` as the slots are), which Mamba's "align" mode sizes its table by.
        Kept apart, as ``_allocate_with_encoder`` is, so that the one-group hot path passes
        no extra argument."""
        coordinator = self.coordinator
        num_tokens_main_model = total_computed + num_new_tokens
        # The scheduler's prefill boundary (vLLM 0.33 kv_cache_manager.py:529, from the request
        # itself: num_tokens - 1 covers a resumed request replaying its output tokens); the
        # coordinator passes it on under retention 0 only (Mamba prefill checkpoints).
        prefill_end = max(request.num_prompt_tokens, request.num_tokens - 1)
        if coordinator.get_num_blocks_to_allocate_main(
                request.request_id, num_tokens_need_slot, hits, num_computed,
                num_tokens_main_model, num_local_computed,
                prefill_end) > self.block_pool.free_block_queue.num_free_blocks - headroom:
            return None
        if has_hits or num_external_computed_tokens:
            coordinator.add_computed_blocks(request.request_id, hits, num_local_computed,
                                            num_external_computed_tokens)
        new_blocks = coordinator.allocate_new_blocks_main(
            request.request_id, num_tokens_need_slot, num_tokens_main_model)
        if self.enable_caching and not delay_cache_blocks:
            coordinator.cache_blocks(
                request, min(total_computed + num_new_tokens, request.num_tokens))
        return new_blocks

    def _allocate_slots_watermarked(
            self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
            new_computed_blocks: Sequence[Sequence[KVCacheBlock]] | None = None,
            num_lookahead_tokens: int = 0, delay_cache_blocks: bool = False,
            num_external_computed_tokens: int = 0, num_encoder_tokens: int = 0,
            full_sequence_must_fit: bool = False, reserved_blocks: int | None = None,
            has_scheduled_reqs: bool = True) -> GroupBlocks | None:
        """``allocate_slots`` of a manager with a watermark: every call takes the gated
        path (``reserved_blocks`` None becomes 0)."""
        return type(self).allocate_slots(
            self, request, num_new_tokens, num_new_computed_tokens, new_computed_blocks,
            num_lookahead_tokens, delay_cache_blocks, num_external_computed_tokens,
            num_encoder_tokens, full_sequence_must_fit,
            0 if reserved_blocks is None else reserved_blocks, has_scheduled_reqs)

    def _allocate_gated(self, request: Request, hits: Sequence[Sequence[KVCacheBlock]],
                        has_hits: bool, num_local_computed: int, num_computed: int,
                        total_computed: int, num_new_tokens: int, num_tokens_need_slot: int,
                        num_external_computed_tokens: int, num_encoder_tokens: int,
                        delay_cache_blocks: bool, full_sequence_must_fit: bool,
                        reserved_blocks: int | None,
                        has_scheduled_reqs: bool) -> GroupBlocks | None:
        """``allocate_slots`` from its skipped blocks on, behind vLLM 0.33's admission gates
        (``kv_cache_manager.py:518-589``; docs/semantics.md#admission-gates), kept apart so
        that the ungated hot path checks nothing more:

        * the watermark: ``watermark_blocks`` more must stay free when the request holds no
          blocks (vLLM's WAITING or PREEMPTED status: a preempted request's blocks were
          freed) and ``has_scheduled_reqs``;
        * ``full_sequence_must_fit``: first of all (before any skipped block is freed), None
          unless the request's full sequence (``min(num_tokens, max_model_len)`` tokens,
          hits and external tokens counted as the step counts them, each group clamped at
          its admission cap) plus the watermark fits the free blocks; ``reserved_blocks``
          is not subtracted there;
        * the step itself must fit ``free - reserved_blocks``, watermark included.

        A refused gate changes nothing (the full-sequence gate refuses before any skipped
        block is freed).

        Raises:
            KVCacheMisuseError: under vllm-0.10 (no gates); ``reserved_blocks`` not an int
                >= 0.
        """
        if not self.v033:
            raise KVCacheMisuseError(
                f"allocate_slots({request.request_id!r}, full_sequence_must_fit="
                f"{full_sequence_must_fit}, reserved_blocks={reserved_blocks!r}): vLLM 0.10.2's "
                "allocate_slots has no admission gates (vLLM 0.33 added them); use profile "
                "vllm-0.33 or leave them at their defaults")
        if reserved_blocks is None:
            reserved_blocks = 0
        elif type(reserved_blocks) is not int or reserved_blocks < 0:
            raise KVCacheMisuseError(
                f"allocate_slots({request.request_id!r}): reserved_blocks must be an int "
                f">= 0, got {reserved_blocks!r}")
        coordinator = self.coordinator
        request_id = request.request_id
        watermark = (self.watermark_blocks
                     if has_scheduled_reqs and not coordinator.is_running(request_id) else 0)
        prefill_end = max(request.num_prompt_tokens, request.num_tokens - 1)
        if full_sequence_must_fit:
            full = request.num_tokens
            if self.max_model_len is not None:
                full = min(full, self.max_model_len)
            if coordinator.get_num_admission_blocks(
                    request_id, full, hits, total_computed, num_local_computed,
                    num_encoder_tokens, prefill_end
            ) + watermark > self.block_pool.free_block_queue.num_free_blocks:
                return None
        headroom = reserved_blocks + watermark
        if coordinator.skips_blocks:
            coordinator.remove_skipped_blocks(
                request_id, max(0, total_computed - request.num_in_flight_tokens))
            if coordinator.has_encoder_groups:
                return self._allocate_with_encoder(
                    request, hits, has_hits, num_local_computed, num_computed, total_computed,
                    num_new_tokens, num_tokens_need_slot, num_external_computed_tokens,
                    num_encoder_tokens, delay_cache_blocks, headroom)
            if coordinator.has_main_model_groups and not num_encoder_tokens:
                return self._allocate_with_main_model(
                    request, hits, has_hits, num_local_computed, num_computed, total_computed,
                    num_new_tokens, num_tokens_need_slot, num_external_computed_tokens,
                    delay_cache_blocks, headroom)
        if num_encoder_tokens:
            return self._allocate_with_encoder(
                request, hits, has_hits, num_local_computed, num_computed, total_computed,
                num_new_tokens, num_tokens_need_slot, num_external_computed_tokens,
                num_encoder_tokens, delay_cache_blocks, headroom)
        if coordinator.get_num_blocks_to_allocate(
                request_id, num_tokens_need_slot, hits, num_computed
        ) > self.block_pool.free_block_queue.num_free_blocks - headroom:
            return None
        if has_hits or num_external_computed_tokens:
            coordinator.add_computed_blocks(request_id, hits, num_local_computed,
                                            num_external_computed_tokens)
        new_blocks = coordinator.allocate_new_blocks(request_id, num_tokens_need_slot)
        if self.enable_caching and not delay_cache_blocks:
            coordinator.cache_blocks(
                request, min(total_computed + num_new_tokens, request.num_tokens))
        return new_blocks

    def _check_v010_encoder_need(self, request_id: str, num_tokens: int,
                                 num_encoder_tokens: int) -> None:
        """vLLM 0.10.2's capacity check counts a running request's cross-attention blocks as
        a negative need (``0 - held``), so it passes a step the pool cannot serve, and
        ``BlockPool.get_new_blocks`` then raises ``ValueError`` midway (a real bug, not
        reproduced: raised here before anything changes, naming it)."""
        need = sum(
            max(0, cdiv(num_encoder_tokens if m.uses_encoder_tokens else num_tokens,
                        m.block_size) - len(m.req_to_blocks.get(request_id, ())))
            for m in self.coordinator.single_type_managers)
        free = self.block_pool.free_block_queue.num_free_blocks
        if need > free:
            raise KVCacheMisuseError(
                f"allocate_slots({request_id!r}): vLLM 0.10.2 raises ValueError('Cannot get "
                f"{need} free blocks from the pool') here: its capacity check counts the "
                "cross-attention blocks a running request holds as a negative need "
                f"(single_type_kv_cache_manager.py:59-86), so a step needing {need} blocks "
                f"passes with {free} free (vLLM 0.33 returns None)")

    def _external_tokens(self, request: Request, num_new_tokens: int,
                         num_new_computed_tokens: int, num_external: int) -> tuple[int, int]:
        """``(num_new_tokens, num_external_computed_tokens)`` as this profile's
        ``allocate_slots`` takes them (``vllm-0.10``: the external tokens folded into the
        new ones, as 0.10.2's scheduler passes them).

        Raises:
            KVCacheMisuseError: a negative count; external tokens that reach past the
                request's tokens (a connector loads KV of tokens the request has) or past
                ``max_model_len``.
        """
        if num_external < 0:
            raise KVCacheMisuseError(
                f"allocate_slots({request.request_id!r}): num_external_computed_tokens must "
                f"be >= 0, got {num_external}")
        end = request.num_computed_tokens + num_new_computed_tokens + num_external
        if end > request.num_tokens:
            raise KVCacheMisuseError(
                f"allocate_slots({request.request_id!r}): computed tokens ({end} = "
                f"num_computed_tokens {request.num_computed_tokens} + num_new_computed_tokens "
                f"{num_new_computed_tokens} + num_external_computed_tokens {num_external}) "
                f"exceed the request's {request.num_tokens} tokens; a connector can only "
                "have KV of tokens the request holds")
        if self.max_model_len is not None and end > self.max_model_len:
            raise KVCacheMisuseError(
                f"allocate_slots({request.request_id!r}): computed tokens ({end}, external "
                f"included) exceed max_model_len ({self.max_model_len})")
        if not self.v033:
            return num_new_tokens + num_external, 0
        return num_new_tokens, num_external

    def _raise_negative(self, request: Request, *counts: int) -> None:
        names = ("num_new_tokens", "num_new_computed_tokens", "num_lookahead_tokens")
        for name, value in zip(names, counts, strict=True):
            if value < 0:
                raise KVCacheMisuseError(
                    f"allocate_slots({request.request_id!r}): {name} must be >= 0, got {value}")

    def _check_hits(self, request: Request, hits: Sequence[Sequence[KVCacheBlock]],
                    num_new_computed_tokens: int) -> bool:
        """Whether ``hits`` (one list per group) holds any block; raises when they do not
        fit this manager, the request or ``num_new_computed_tokens``."""
        sizes = self._group_block_sizes
        if len(hits) != len(sizes) or isinstance(hits[0], KVCacheBlock):
            self._raise_bad_hits(request, hits)
        if len(sizes) == 1:  # one group: one comparison, no loop (admissions run this)
            has_hits = bool(hits[0])
            if len(hits[0]) * sizes[0] != num_new_computed_tokens:
                self._raise_hit_tokens(request, hits, num_new_computed_tokens)
        else:
            if any(isinstance(g, KVCacheBlock) for g in hits):
                self._raise_bad_hits(request, hits)
            if any(len(g) != self._num_hit_blocks(num_new_computed_tokens, bs)
                   for bs, g in zip(sizes, hits, strict=True)):
                self._raise_hit_tokens(request, hits, num_new_computed_tokens)
            has_hits = any(hits)
        if has_hits:
            if not self.enable_caching:
                raise KVCacheMisuseError("prefix-cache hits passed while caching is disabled")
            if self.coordinator.is_running(request.request_id):
                raise KVCacheMisuseError(
                    f"allocate_slots({request.request_id!r}): prefix-cache hits can only be "
                    "added to a request that holds no blocks yet")
        return has_hits

    def _raise_bad_hits(self, request: Request, hits: Sequence[object]) -> None:
        raise KVCacheMisuseError(
            f"allocate_slots({request.request_id!r}): {len(hits)} hit lists for "
            f"{len(self._group_block_sizes)} groups; pass new_computed_blocks as "
            "get_computed_blocks returned them (one list of blocks per KV-cache group)")

    def _num_hit_blocks(self, num_new_computed_tokens: int, block_size: int) -> int:
        """Hit blocks of a group for that many hit tokens: whole blocks, or with fine-grained
        hits every block the hit reaches into (the last one partly)."""
        if self.enable_partial_hash_hits:
            return cdiv(num_new_computed_tokens, block_size)
        return -1 if num_new_computed_tokens % block_size else (
            num_new_computed_tokens // block_size)

    def _raise_hit_tokens(self, request: Request, hits: Sequence[Sequence[KVCacheBlock]],
                          num_new_computed_tokens: int) -> None:
        for group_id, (block_size, group) in enumerate(
                zip(self._group_block_sizes, hits, strict=True)):
            if len(group) != self._num_hit_blocks(num_new_computed_tokens, block_size):
                raise KVCacheMisuseError(
                    f"allocate_slots({request.request_id!r}): num_new_computed_tokens="
                    f"{num_new_computed_tokens} but group {group_id} got {len(group)} hit "
                    f"blocks of {block_size} tokens; pass what get_computed_blocks returned")

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Cache the request's blocks that are full within its first
        ``num_computed_tokens`` tokens, group by group (vLLM's
        ``KVCacheManager.cache_blocks``: what the scheduler calls once an asynchronous
        external load has arrived, or, after a failed one, for the valid prefix). Blocks
        already cached stay as they are; a no-op with caching off.

        Raises:
            KVCacheMisuseError: an unknown request; a negative count; more tokens than the
                request has or than its tables have slots for.
        """
        rid = request.request_id
        if not self.coordinator.is_running(rid):
            raise KVCacheMisuseError(
                f"cache_blocks({rid!r}): the request holds no blocks (call it after "
                "allocate_slots, before free)")
        slots = min(len(t) * bs for t, bs in zip(
            self.coordinator.get_blocks(rid), self._group_block_sizes, strict=True))
        if not 0 <= num_computed_tokens <= min(request.num_tokens, slots):
            raise KVCacheMisuseError(
                f"cache_blocks({rid!r}, {num_computed_tokens}): num_computed_tokens must be "
                f"in [0, {min(request.num_tokens, slots)}] (the request has "
                f"{request.num_tokens} tokens and slots for {slots})")
        if self.enable_caching:
            self.coordinator.cache_blocks(request, num_computed_tokens)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop every cache key of the given blocks (vLLM 0.33's ``evict_blocks``: what the
        scheduler calls for blocks whose external load failed): one ``BlockRemoved`` per
        key; ``ref_cnt``, free-queue positions and tables are unchanged. The ids are taken
        as a set, in the set's order, as vLLM's scheduler passes them.

        Raises:
            KVCacheMisuseError: ``vllm-0.10`` (0.10.2 has no ``evict_blocks``); an id outside
                the pool (nothing changes).
        """
        if not self.v033:
            raise KVCacheMisuseError(
                "evict_blocks: vLLM 0.10.2's KVCacheManager has no evict_blocks (added with "
                "the KV-load failure policy in later releases); use the vllm-0.33 profile")
        self.block_pool.evict_blocks(set(block_ids))

    # ---------------------------------------------------------------- release
    def free(self, request: Request | str) -> None:
        """Release every block of the request, group by group, each table in reverse order
        (last block first), so its deepest cached block is evicted before its ancestors.
        Unknown requests are a no-op."""
        self.coordinator.free(request if isinstance(request, str) else request.request_id)

    def new_step_starts(self) -> None:
        """A scheduler step begins (vLLM 0.33 ``KVCacheManager.new_step_starts``, called by the
        scheduler at the start of each ``schedule``): a Mamba group's blocks cached in the
        last step can be hit again. A no-op for every other group kind and for ``vllm-0.10``
        (0.10.2 has no such call; its Mamba groups never hit)."""
        self.coordinator.new_step_starts()

    def reset_prefix_cache(self) -> bool:
        """Drop every cached hash; False (nothing changed) while any block is in use."""
        return self.block_pool.reset_prefix_cache()

    # ---------------------------------------------------------------- queries
    def get_blocks(self, request_id: str) -> GroupBlocks:
        """Per-group block tables in logical order (nulls included; empty lists for an
        unknown request)."""
        return self.coordinator.get_blocks(request_id)

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """Per-group block tables as physical block ids in logical (token) order (0 = null)."""
        return self.coordinator.get_block_ids(request_id)

    def num_blocks_needed(self, num_tokens: int, group: int) -> int:
        """Blocks group ``group`` needs for ``num_tokens`` slots, nulls included."""
        return cdiv(num_tokens, self._group_block_sizes[group])

    def get_num_common_prefix_blocks(self, request_id: str,
                                     num_running_requests: int) -> list[int]:
        """Per group, ``vllm-0.10``: leading blocks held by every running request (``ref_cnt
        == num_running_requests``; 0 for sliding-window and chunked-local groups);
        ``vllm-0.33``: always 0 (cascade attention was removed)."""
        if not self.profile.live_common_prefix_blocks:
            return [0] * len(self.kv_cache_specs)
        return self.coordinator.get_num_common_prefix_blocks(request_id, num_running_requests)

    def check_invariants(self) -> None:
        """Raise ``InvariantViolation`` naming every broken law
        (``invariants.check_manager_invariants``)."""
        check_manager_invariants(self)

    def take_new_block_ids(self) -> list[int]:
        """Drain the ids of the blocks handed out fresh since the last call, for the worker
        to zero (vLLM 0.33 ``KVCacheManager.take_new_block_ids``, which its scheduler calls
        every step): group by group, each in the order its blocks were taken. ``[]`` without
        ``needs_kv_cache_zeroing``. An id taken, freed and taken again is listed twice."""
        ids: list[int] = []
        for manager in self.coordinator.single_type_managers:
            ids.extend(manager.take_new_block_ids())
        return ids

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        """Record again the request's blocks from token ``start_token`` on, in every
        recording group (vLLM 0.33 ``KVCacheManager.record_blocks_for_zeroing``: blocks a
        failed asynchronous load left unwritten, past its valid prefix); the null blocks a
        window left in the table are recorded too, as vLLM records them.

        Raises:
            KVCacheMisuseError: ``start_token`` negative or not a multiple of a recording
                group's block size (vLLM asserts: zeroing a partly valid block would wipe
                its valid prefix).
        """
        for manager in self.coordinator.single_type_managers:
            if not manager.records_new_block_ids:
                continue
            if start_token < 0 or start_token % manager.block_size:
                raise KVCacheMisuseError(
                    f"record_blocks_for_zeroing({request_id!r}, {start_token}): start_token "
                    f"must be a non-negative multiple of group {manager.kv_cache_group_id}'s "
                    f"block size {manager.block_size} (zeroing a partly valid block would "
                    "wipe its valid prefix; vLLM asserts it)")
            blocks = manager.req_to_blocks.get(request_id, [])
            manager.new_block_ids.extend(
                b.block_id for b in blocks[start_token // manager.block_size:])

    @contextmanager
    def zeroing_skipped(self, skip_zeroing_group_ids: Collection[int]) -> Iterator[None]:
        """Within this block, ``allocate_slots`` is vLLM 0.33's with
        ``skip_zeroing_group_ids``: the external tokens' blocks of those groups (an
        asynchronous load writes them; zeroing would race it) are not recorded for zeroing;
        every other block is, as usual. A context rather than one more parameter of
        ``allocate_slots``, so the hot path keeps its signature.

        Raises:
            KVCacheMisuseError: under ``vllm-0.10``; a group id that is not one of this
                model's groups.
        """
        managers = self.coordinator.single_type_managers
        bad = [g for g in skip_zeroing_group_ids
               if type(g) is not int or not 0 <= g < len(managers)]
        if bad or not self.v033:
            raise KVCacheMisuseError(
                f"skip_zeroing_group_ids={tuple(skip_zeroing_group_ids)!r}: "
                + ("vLLM 0.10.2 has no worker-side block zeroing; use profile vllm-0.33"
                   if not self.v033 else
                   f"{bad!r} not a KV-cache group id of this model (0 to {len(managers) - 1})"))
        skipped = [managers[g] for g in set(skip_zeroing_group_ids)]
        for manager in skipped:
            manager.skip_external_zeroing = True
        try:
            yield
        finally:
            for manager in skipped:
                manager.skip_external_zeroing = False

    def take_kv_cache_block_copies(self) -> tuple[list[tuple[int, int]], list[KVCacheBlock]]:
        """Drain the copy-on-write copies made since the last call (vLLM 0.33's
        ``take_kv_cache_block_copies``, ``kv_cache_manager.py:863-878``): ``(copies,
        retained_blocks)``, the copies as ``(src_block_id, dst_block_id)`` pairs, group by
        group in group order and each group's in the order they were made, and the blocks
        they keep referenced, ``[src, dst, src, dst, ...]`` in the same order.

        The caller releases the retained blocks once the copies ran, as vLLM 0.33's scheduler
        does at the end of each ``schedule()``: ``block_pool.free_retained_blocks(retained)``
        (its ``BlockPool.free_blocks``; a source hit by two requests in one step is listed
        twice). Empty unless fine-grained partial hash hits are on
        (``enable_partial_hash_hits``; docs/semantics.md#fine-grained-partial-hits).
        """
        pending = self.coordinator.take_pending_cow_copies()
        copies = [(src.block_id, dst.block_id) for src, dst in pending]
        retained = [block for pair in pending for block in pair]
        return copies, retained

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        """Drain the boundary-state hand-offs for a KV connector (vLLM 0.33's
        ``take_boundary_state_offloads``, ``kv_cache_manager.py:880-904``, which its
        scheduler calls in every ``schedule()`` just before ``take_kv_cache_block_copies``):
        ``{request_id: [(group_id, block_id, boundary_tokens), ...]}``, requests in the order
        of their first hand-off (groups in order, each group's hand-offs in the order made).

        Only a Mamba "align" group (``vllm-0.33``, caching on) makes them: each state block
        its ``cache_blocks`` keys, at ``(index + 1) * block_size``, and with fine-grained
        hits the copy-on-write copy of a running request's own partial tail, at the
        prompt's last hash boundary. A request's hand-offs not drained yet are dropped when
        it is freed (preemption included). The blocks are not pinned: a copy is held by
        nobody once ``take_kv_cache_block_copies``' retained blocks are released.
        """
        offloads: dict[str, list[tuple[int, int, int]]] = {}
        for rid, group_id, block, boundary in self.coordinator.take_boundary_state_offloads():
            offloads.setdefault(rid, []).append((group_id, block.block_id, boundary))
        return offloads

    def finalize_partial_tail_offloads(self, request: Request) -> list[tuple[int, int, int]]:
        """A finishing request's producer partial tails (vLLM 0.33's
        ``finalize_partial_tail_offloads``, ``kv_cache_manager.py:906-925``, called by its
        scheduler for a KV producer before the request's blocks are freed): per Mamba
        "align" group that keyed the request's own partial tail and has not copied it yet,
        ``(group_id, block_id, boundary_tokens)`` of its table block when the request
        computed exactly ``boundary_tokens`` tokens and none is in flight
        (``request.num_in_flight_tokens == 0``). Consumes them: a second call answers
        ``[]``."""
        offloads: list[tuple[int, int, int]] = []
        for manager in self.coordinator.single_type_managers:
            finalized = manager.finalize_partial_tail_offload(
                request.request_id, request.num_computed_tokens, request.num_in_flight_tokens)
            if finalized is not None:
                group_id, block, boundary = finalized
                offloads.append((group_id, block.block_id, boundary))
        return offloads

    def take_events(self) -> list[KVCacheEvent]:
        """Drain the pool's KV events (``kv_cache_event_metadata[group_idx]`` gives the
        ``(kind, sliding_window)`` 0.33 attaches to a ``BlockStored``)."""
        return self.block_pool.take_events()
