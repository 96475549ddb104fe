"""The reference seen through kvcheck's public protocol (``--kv-impl=reference``).

It declares every capability, so the conformance suite exercises all of its tests on it; it is
also the oracle the differential tests compare other implementations with.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from kvcheck import __version__
from kvcheck.adapters.external_blocks import blocks_added
from kvcheck.adapters.offload_tier import OffloadTier
from kvcheck.adapters.reference_native import ReferenceNativeManager
from kvcheck.adapters.reference_sizing import (
    kv_block_sizes,
    kv_cache_view_shape,
    kv_feature_defaults,
    kv_page_size_bytes,
    kv_sizing_plan,
)
from kvcheck.conformance.groups import AdapterBlockIds
from kvcheck.conformance.offload_protocol import OffloadSpec
from kvcheck.conformance.protocol import (
    ImplInfo,
    KVCacheGroupSpec,
    KVCacheSpec,
    KVEvent,
    RequestView,
    UnsupportedSpec,
)
from kvcheck.conformance.view_sync import EngineRequest, RequestViewSync
from kvcheck.errors import KVCheckInputError
from kvcheck.events.codec import decode_batch, encode_batch
from kvcheck.events.wire_events import WireEventFactory, wire_event_factory, wire_event_to_dict
from kvcheck.reference_impl import batch_metadata, page_table
from kvcheck.reference_impl.block import KVCacheBlock
from kvcheck.reference_impl.block_hasher import RequestBlockHasher
from kvcheck.reference_impl.block_pool import BlockPool
from kvcheck.reference_impl.block_table import slot_mapping_for_request
from kvcheck.reference_impl.errors import KVCacheMisuseError
from kvcheck.reference_impl.events import KVCacheEvent
from kvcheck.reference_impl.hashing import HASH_FUNCTIONS, resolve_none_hash
from kvcheck.reference_impl.invariants import check_manager_invariants
from kvcheck.reference_impl.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    SlidingWindowSpec,
    kv_cache_event_metadata,
)
from kvcheck.reference_impl.kv_cache_interface import KVCacheSpec as GroupKVCacheSpec
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager
from kvcheck.reference_impl.offload_manager import CPUOffloadingManager
from kvcheck.reference_impl.offload_policy import ReqContext
from kvcheck.reference_impl.profiles import get_profile
from kvcheck.reference_impl.request import LoRARequest, MultiModalFeature, Request

if TYPE_CHECKING:
    from kvcheck.gpu_kernels.conformance import KernelSet

__all__ = [
    "IMPL_INFO",
    "ReferenceBlockPool",
    "ReferenceManager",
    "SnapshotSync",
    "check_knobs_grouped",
    "decode_event_batch",
    "event_to_dict",
    "group_kv_cache_spec",
    "kernels",
    "kv_block_sizes",
    "kv_cache_view_shape",
    "kv_feature_defaults",
    "kv_page_size_bytes",
    "kv_sizing_plan",
    "make_block_pool",
    "make_kv_cache_manager",
    "make_native_manager",
    "make_offloading_manager",
    "none_hash_for",
    "reference_kv_cache_manager",
    "reference_profile",
    "request_factory",
    "request_sync",
]

IMPL_INFO = ImplInfo(
    name="reference",
    version=__version__,
    capabilities=frozenset(
        {"manager", "block_pool", "prefix_caching", "extra_keys", "free_queue_order",
         "ref_counts", "block_hashes", "events", "event_wire", "slot_mapping", "invariants",
         "kernels", "batch_metadata",
         # Hybrid models: several KV-cache groups over one pool (ReferenceManager).
         "kv_cache_groups", "sliding_window", "chunked_local_attention", "cross_attention",
         "mamba",
         # Decode context parallelism and vLLM 0.33's prefix_match_unit (KVCacheManager's
         # dcp_world_size and prefix_match_unit).
         "dcp", "prefix_match_unit",
         # A Mamba group under DCP (unsharded in vLLM 0.33, scaled in 0.10.2).
         "mamba_dcp",
         # vLLM 0.33's fine-grained partial hash hits and their copy-on-write
         # (ReferenceManager.take_kv_cache_block_copies).
         "fine_grained_hits",
         # vLLM 0.33's Mamba prefill checkpoint blocks and sparse Mamba retention.
         "mamba_checkpoints",
         # vLLM 0.33's boundary-state hand-offs for a KV connector
         # (ReferenceManager.take_boundary_state_offloads).
         "boundary_state_offloads",
         # EAGLE/MTP: hits drop their last block (KVCacheManager(use_eagle=True)).
         "eagle",
         # vLLM 0.33's per-group EAGLE flag (KVCacheGroupSpec.is_eagle_group).
         "eagle_groups",
         # vLLM 0.33's multi-module MTP (KVCacheManager(num_prefill_lookahead=K)).
         "prefill_lookahead",
         # vLLM 0.33's hash lookahead (KVCacheManager(num_hash_lookahead_tokens=L)).
         "hash_lookahead",
         # vLLM 0.33's admission gates (allocate_slots' full_sequence_must_fit,
         # reserved_blocks, has_scheduled_reqs; KVCacheManager's watermark and
         # max_in_flight_tokens).
         "admission_gates",
         # vLLM 0.33's asynchronous scheduling: allocate_slots / finalize_partial_tail_offloads
         # read the request's in-flight tokens (num_in_flight_tokens).
         "async_scheduling",
         # vLLM 0.33's Mamba shared-prefix checkpoint
         # (KVCacheManager(enable_mamba_shared_prefix_checkpoint=True)).
         "mamba_shared_prefix_checkpoint",
         # vLLM 0.33's worker-side block zeroing (KVCacheManager(needs_kv_cache_zeroing=True),
         # take_new_block_ids, allocate_slots' skip_zeroing_group_ids).
         "block_zeroing",
         # Module-level KV-cache sizing functions (kvcheck.adapters.reference_sizing).
         "sizing",
         # vLLM's design features, declared so they are also tested under --kv-profile=generic
         # (the vLLM profiles imply them).
         "reset_prefix_cache", "caching_off", "skip_reading_prefix_cache", "lookahead",
         "multi_token_decode",
         # KV from outside the pool (issue 29): a connector's tokens, failed loads.
         "external_kv", "evict_blocks",
         # The offload tier (issue 30): vLLM's CPUOffloadingManager, LRU and ARC
         # (make_offloading_manager below).
         "offload"}
    ),
    profile="vllm-0.33",
    hash_algos=tuple(HASH_FUNCTIONS),
    reserved_block_ids=(0,),  # vLLM's null block, under every profile
)


def reference_profile(spec: KVCacheSpec) -> str:
    # "generic" checks profile-independent laws; the reference then behaves as the newest vLLM.
    return "vllm-0.33" if spec.profile == "generic" else spec.profile


def group_kv_cache_spec(spec: KVCacheSpec, group: KVCacheGroupSpec,
                        index: int) -> GroupKVCacheSpec:
    """The reference spec of one protocol ``KVCacheGroupSpec`` (block size defaulting to
    ``spec.block_size``; per rank: the manager scales it by ``spec.dcp_world_size``).

    Raises:
        KVCheckInputError: an unknown kind, or a window / chunk missing for its kind.
    """
    block_size = spec.group_spec_block_size(index)
    if group.kind == "full_attention":
        return FullAttentionSpec(block_size)
    if group.kind == "sliding_window":
        if group.sliding_window is None:
            raise KVCheckInputError(f"kv_cache_groups[{index}]: sliding_window group without "
                                    "a sliding_window")
        return SlidingWindowSpec(block_size, group.sliding_window)
    if group.kind == "chunked_local_attention":
        if group.attention_chunk_size is None:
            raise KVCheckInputError(f"kv_cache_groups[{index}]: chunked_local_attention group "
                                    "without an attention_chunk_size")
        return ChunkedLocalAttentionSpec(block_size, group.attention_chunk_size)
    if group.kind == "cross_attention":
        return CrossAttentionSpec(block_size)
    if group.kind == "mamba":
        try:
            return MambaSpec(block_size, group.mamba_cache_mode or "none",
                             group.num_speculative_blocks,
                             group.num_prefill_checkpoint_blocks,
                             group.prefill_checkpoint_alignment)
        except KVCacheMisuseError as exc:
            raise KVCheckInputError(f"kv_cache_groups[{index}]: {exc}") from None
    raise KVCheckInputError(f"kv_cache_groups[{index}]: unknown kind {group.kind!r}")


def check_knobs_grouped(spec: KVCacheSpec) -> None:
    """``KVCheckInputError`` for ``dcp_world_size`` or ``prefix_match_unit`` on a spec without
    ``kv_cache_groups``: they come with the grouped protocol (capabilities ``dcp`` and
    ``prefix_match_unit``), where the harness counts a block as ``group_block_size``."""
    if not spec.kv_cache_groups and (spec.dcp_world_size != 1
                                     or spec.prefix_match_unit is not None):
        raise KVCheckInputError(
            f"dcp_world_size={spec.dcp_world_size}, prefix_match_unit="
            f"{spec.prefix_match_unit} on a spec without kv_cache_groups: give the groups "
            "(kv_cache_groups=(KVCacheGroupSpec('full_attention', block_size),) for one)")


def reference_kv_cache_manager(spec: KVCacheSpec, *,
                               wire_events: bool = False) -> KVCacheManager:
    """The reference ``KVCacheManager`` for ``spec``: one full-attention group of
    ``spec.block_size`` without ``kv_cache_groups``, else one group per entry.

    ``wire_events``: with events on, the pool builds them as the profile's wire structs with
    full hash bytes (``wire_event_factory``: what ``take_event_batch`` publishes, built when
    they happen as vLLM does); not for a grouped 0.10 spec, whose events 0.10.2's wire form
    cannot carry (the reference's dataclasses then, as without it).

    Raises:
        KVCheckInputError: a group spec the reference cannot read.
        KVCacheMisuseError: a layout vLLM refuses (the message names the rule).
    """
    groups = spec.kv_cache_groups
    check_knobs_grouped(spec)
    specs = [group_kv_cache_spec(spec, g, i) for i, g in enumerate(groups)] if groups else None
    profile = reference_profile(spec)
    factory = None
    if wire_events and spec.enable_kv_cache_events:
        if get_profile(profile).hybrid_rules == "spec_groups":  # 0.33's rules and wire form
            factory = wire_event_factory("vllm-0.33", group_metadata=kv_cache_event_metadata(
                specs or [FullAttentionSpec(spec.block_size)]))
        elif not groups:
            factory = wire_event_factory("vllm-0.10")
    return KVCacheManager(
        spec.num_blocks,
        None if groups else spec.block_size,
        kv_cache_specs=specs,
        max_model_len=spec.max_model_len,
        enable_caching=spec.enable_caching,
        hash_algo=spec.hash_algo,
        profile=profile,
        enable_kv_cache_events=spec.enable_kv_cache_events,
        pythonhashseed=spec.pythonhashseed,
        prefix_cache_retention_interval=spec.prefix_cache_retention_interval,
        kv_event_factory=factory,
        dcp_world_size=spec.dcp_world_size,
        prefix_match_unit=spec.prefix_match_unit,
        use_eagle=spec.use_eagle,
        eagle_group_ids=[i for i, g in enumerate(spec.kv_cache_groups) if g.is_eagle_group],
        num_prefill_lookahead=spec.num_prefill_lookahead,
        num_hash_lookahead_tokens=spec.num_hash_lookahead_tokens,
        watermark=spec.watermark,
        max_in_flight_tokens=spec.max_in_flight_tokens,
        enable_mamba_shared_prefix_checkpoint=spec.mamba_shared_prefix_checkpoint,
        needs_kv_cache_zeroing=spec.needs_kv_cache_zeroing,
    )


def request_factory(block_hasher: RequestBlockHasher,
                    request_cls: type[Request] = Request) -> Callable[[RequestView], Request]:
    """``make(view)``: a new ``request_cls`` for ``view``'s prompt alone (outputs are appended
    by the caller), hashed by ``block_hasher``, with the view's LoRA, multimodal features,
    cache salt and ``skip_reading_prefix_cache``. Shared by the adapter's request sync and the
    benchmark hook, whose timed ``new_request`` is this closure itself (no extra call layer)."""

    def make(view: RequestView) -> Request:
        return request_cls(
            view.request_id,
            view.prompt_token_ids,
            block_hasher=block_hasher,
            lora_request=None if view.lora is None else LoRARequest(*view.lora),
            mm_features=tuple(MultiModalFeature(*f) for f in view.mm_features),
            cache_salt=view.cache_salt,
            skip_reading_prefix_cache=view.skip_reading_prefix_cache,
        )

    return make


def event_to_dict(event: KVCacheEvent) -> KVEvent:
    """A reference event as the protocol's primitive dict (``"type"`` + vLLM's fields): a
    shallow copy (the events are frozen and their sequences tuples, so the dict shares them;
    ``dataclasses.asdict`` rebuilt every token tuple element by element, a third of the
    adapter's time with events on). The same function reads the wire-ready events."""
    return wire_event_to_dict(event)


R = TypeVar("R", bound=EngineRequest)


class _Seen(Generic[R]):
    """What ``SnapshotSync`` remembers of one request id: the engine request, the prompt it
    was built from and how many output tokens it has absorbed."""

    __slots__ = ("outputs", "prompt", "req")

    def __init__(self, req: R, prompt: tuple[int, ...], outputs: int) -> None:
        self.req = req
        self.prompt = prompt
        self.outputs = outputs


class SnapshotSync(RequestViewSync[R]):
    """``RequestViewSync`` whose steady-state ``sync`` costs O(new tokens), not O(tokens).

    The base class compares the whole prompt and measures the engine's output list on every
    call. Here each request id remembers the prompt tuple it was built from and how many
    output tokens it has absorbed: a view carrying the *same* prompt object (what a driver
    passes call after call) is recognised by identity, another one by equality (O(n), as
    before), and only the new output tokens are copied. Behaviour is the base class's:
    a different prompt under a known id is a new request; shrinking outputs raise.
    """

    def __init__(self, make: Callable[[RequestView], R],
                 before_hashing: Callable[[], None] | None = None) -> None:
        super().__init__(make, before_hashing)
        self._hook = before_hashing  # None: nothing to call before hashing
        self._seen: dict[str, _Seen[R]] = {}

    def sync(self, view: RequestView) -> R:
        """The engine request for ``view``, brought up to date (see the class docstring).

        Raises:
            KVCheckInputError: the view has fewer output tokens than already seen.
        """
        prompt = view.prompt_token_ids
        entry = self._seen.get(view.request_id)
        if entry is None or (entry.prompt is not prompt and entry.prompt != prompt):
            entry = self._build(view)
        req = entry.req
        outputs = view.output_token_ids
        known = entry.outputs
        num_outputs = len(outputs)
        if num_outputs != known:
            if num_outputs < known:
                raise KVCheckInputError(
                    f"request {view.request_id!r}: output_token_ids shrank from {known} to "
                    f"{num_outputs}; views may only grow")
            if self._hook is not None:
                self._hook()
            # A decode step adds one token: skip the slice.
            req.append_output_token_ids(
                [outputs[known]] if num_outputs == known + 1 else list(outputs[known:]))
            entry.outputs = num_outputs
        req.num_computed_tokens = view.num_computed_tokens
        return req

    def _build(self, view: RequestView) -> _Seen[R]:
        self._before_hashing()
        req = self._make(view)
        self.requests[view.request_id] = req
        entry = _Seen(req, view.prompt_token_ids, len(req.output_token_ids))
        self._seen[view.request_id] = entry
        return entry

    def pop(self, request_id: str) -> R | None:
        self._seen.pop(request_id, None)
        return super().pop(request_id)


def request_sync(block_hasher: RequestBlockHasher) -> RequestViewSync[Request]:
    """One reference ``Request`` per request id, hashed by ``block_hasher`` and kept in step
    with the views the suite passes."""
    # ``Request`` is read here, from this function's globals: a copy of this function with
    # other globals (the mutation tests' ``rebind_function``) builds its own request class.
    return SnapshotSync(request_factory(block_hasher, Request))


class ReferenceManager:
    """``KVCacheManagerAdapter`` over ``KVCacheManager``, with every observation method, for
    any spec.

    The engine answers one list per KV-cache group. A spec with ``kv_cache_groups`` gets
    them as they are (the protocol's grouped form, ``SupportsKVCacheGroups``); a single-group
    spec gets group 0 unwrapped at this boundary (flat lists, as the protocol's single-group
    form asks). Events name their group under ``vllm-0.33`` in the grouped form
    (``group_idx``, ``kv_cache_spec_kind``, ``kv_cache_spec_sliding_window``) and carry no
    group field under ``vllm-0.10``; the single-group form passes them as the engine made
    them.

    With events on, the pool builds them in the profile's wire form as they happen
    (``reference_kv_cache_manager(wire_events=True)``), so ``take_event_batch`` is one
    msgspec call, as vLLM's publisher's is; a subclass that rewrites the reference's event
    dataclasses sets ``wire_ready_events = False`` (both forms are served).

    Raises:
        UnsupportedSpec: a grouped layout vLLM refuses (or crashes on); the message names
            the rule.
    """

    #: Build events in the wire form (see the class docstring).
    wire_ready_events: ClassVar[bool] = True

    def __init__(self, spec: KVCacheSpec) -> None:
        try:
            manager = reference_kv_cache_manager(spec, wire_events=self.wire_ready_events)
        except KVCacheMisuseError as exc:
            if not spec.kv_cache_groups and not spec.num_prefill_lookahead:
                raise
            # A layout vLLM refuses (or crashes on), or multi-module MTP past the scheduler
            # block (vLLM 0.33 raises ValueError): not applicable to this implementation.
            raise UnsupportedSpec(str(exc)) from exc
        self._wrap(spec, manager)
        self._requests = request_sync(manager.block_hasher)

    def _wrap(self, spec: KVCacheSpec, manager: KVCacheManager) -> None:
        """Serve ``spec`` with ``manager`` (built for it); requests are the caller's."""
        self.spec = spec
        self.manager = manager
        self._grouped = bool(spec.kv_cache_groups)
        self._v033 = manager.v033
        self._slot_block_size = spec.group_block_size(0)

    # -- manager
    def get_computed_blocks(self, request: RequestView) -> tuple[AdapterBlockIds, int]:
        blocks, num = self.manager.get_computed_blocks(self._requests.sync(request))
        if self._grouped:
            return [[b.block_id for b in g] for g in blocks], num
        return [b.block_id for b in blocks[0]], num

    def allocate_slots(
        self,
        request: RequestView,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        # Any: the protocol's two forms, flat ids or one list per group (``_grouped``).
        new_computed_block_ids: Sequence[Any] = (),
        num_lookahead_tokens: int = 0,
        # The protocol's keyword-only arguments (external tokens, a delayed cache, encoder
        # tokens, admission gates), each passed only when not at its default: one test of
        # this mapping on the hot path instead of one per argument (fewer instructions per
        # call in the counted benchmark than six defaulted parameters and their tests).
        **extra: Any,
    ) -> AdapterBlockIds | None:
        req = self._requests.sync(request)
        hits: Sequence[list[KVCacheBlock]] | None = None
        if new_computed_block_ids:
            blocks = self.manager.block_pool.blocks
            if self._grouped:
                hits = [[blocks[i] for i in g] for g in new_computed_block_ids]
            else:
                hits = ([blocks[i] for i in new_computed_block_ids],)
        if extra:
            return self._allocate_slots_with(req, num_new_tokens, num_new_computed_tokens, hits,
                                             num_lookahead_tokens, **extra)
        new = self.manager.allocate_slots(
            req, num_new_tokens, num_new_computed_tokens, hits, num_lookahead_tokens)
        if new is None:
            return None
        if self._grouped:
            return [[b.block_id for b in g] for g in new]
        blocks_0 = new[0]
        # A decode step mostly allocates nothing: skip the comprehension (it costs a call).
        return [b.block_id for b in blocks_0] if blocks_0 else []

    def _allocate_slots_with(self, req: Request, num_new_tokens: int,
                             num_new_computed_tokens: int,
                             hits: Sequence[list[KVCacheBlock]] | None,
                             num_lookahead_tokens: int, *,
                             num_external_computed_tokens: int = 0,
                             delay_cache_blocks: bool = False, num_encoder_tokens: int = 0,
                             full_sequence_must_fit: bool = False,
                             reserved_blocks: int | None = None,
                             has_scheduled_reqs: bool = True,
                             num_in_flight_tokens: int = 0,
                             skip_zeroing_group_ids: Sequence[int] = ()
                             ) -> AdapterBlockIds | None:
        """``allocate_slots`` with external tokens, a delayed cache, encoder tokens,
        admission gates, in-flight tokens or zeroing skips (kept apart from the hot path).
        Each argument goes to the manager only when not at its default, so a subclass of the
        manager (a mutant) written without it keeps working. ``num_in_flight_tokens`` is set
        on the request for this call only (``_tokens_in_flight``); ``skip_zeroing_group_ids``
        goes through ``KVCacheManager.zeroing_skipped``."""
        manager = self.manager
        extra: dict[str, Any] = {}  # Any: each keyword's own type
        if num_external_computed_tokens:
            extra["num_external_computed_tokens"] = num_external_computed_tokens
        if num_encoder_tokens:
            extra["num_encoder_tokens"] = num_encoder_tokens
        if full_sequence_must_fit:
            extra["full_sequence_must_fit"] = True
        if reserved_blocks is not None:
            extra["reserved_blocks"] = reserved_blocks
        if not has_scheduled_reqs:
            extra["has_scheduled_reqs"] = False
        with contextlib.ExitStack() as scope:
            if skip_zeroing_group_ids:
                scope.enter_context(manager.zeroing_skipped(skip_zeroing_group_ids))
            if num_in_flight_tokens:
                scope.enter_context(self._tokens_in_flight(req, num_in_flight_tokens))
            if num_external_computed_tokens and self._v033:
                # 0.33 returns only the blocks after the external ones: answer the whole
                # addition.
                before = manager.get_block_ids(req.request_id)
                if manager.allocate_slots(req, num_new_tokens, num_new_computed_tokens, hits,
                                          num_lookahead_tokens, delay_cache_blocks,
                                          **extra) is None:
                    return None
                added = blocks_added(before, [len(g) for g in hits or [[]] * len(before)],
                                     manager.get_block_ids(req.request_id))
                return added if self._grouped else added[0]
            new = manager.allocate_slots(req, num_new_tokens, num_new_computed_tokens, hits,
                                         num_lookahead_tokens, delay_cache_blocks, **extra)
        if new is None:
            return None
        return [[b.block_id for b in g] for g in new] if self._grouped else [
            b.block_id for b in new[0]]

    def cache_blocks(self, request: RequestView, num_computed_tokens: int) -> None:
        self.manager.cache_blocks(self._requests.sync(request), num_computed_tokens)

    def evict_blocks(self, block_ids: Sequence[int]) -> None:
        if not self._v033:
            raise UnsupportedSpec("evict_blocks: vLLM 0.10.2 has no evict_blocks (vllm-0.33 "
                                  "and generic have it)")
        self.manager.evict_blocks(block_ids)

    def new_step_starts(self) -> None:
        self.manager.new_step_starts()

    def take_new_block_ids(self) -> list[int]:
        """The blocks handed out fresh since the last call, for the worker to zero (vLLM
        0.33's ``take_new_block_ids``; ``[]`` without ``needs_kv_cache_zeroing``)."""
        return self.manager.take_new_block_ids()

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        self.manager.record_blocks_for_zeroing(request_id, start_token)

    def take_kv_cache_block_copies(self) -> list[tuple[int, int]]:
        """The copy-on-write copies made since the last call, ``(src_block_id,
        dst_block_id)`` in vLLM's order, their retained blocks released as vLLM 0.33's
        scheduler releases them in its non-deferred mode (``block_pool.free_blocks(
        retained)`` at the end of ``schedule()``: ``BlockPool.free_retained_blocks``, which
        also takes a source listed twice). ``[]`` without fine-grained hits."""
        copies, retained = self.manager.take_kv_cache_block_copies()
        if retained:
            self.manager.block_pool.free_retained_blocks(retained)
        return copies

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        """The Mamba "align" boundary-state hand-offs made since the last call,
        ``{request_id: [(group_id, block_id, boundary_tokens), ...]}`` in vLLM's order
        (``KVCacheManager.take_boundary_state_offloads``); ``{}`` without such a group."""
        return self.manager.take_boundary_state_offloads()

    def finalize_partial_tail_offloads(self, request: RequestView, *,
                                       num_in_flight_tokens: int = 0,
                                       ) -> list[tuple[int, int, int]]:
        """A finishing request's producer partial tails (``KVCacheManager.
        finalize_partial_tail_offloads``), judged at ``request.num_computed_tokens`` with
        ``num_in_flight_tokens`` of them in flight (asynchronous scheduling)."""
        req = self._requests.sync(request)
        if not num_in_flight_tokens:
            return self.manager.finalize_partial_tail_offloads(req)
        with self._tokens_in_flight(req, num_in_flight_tokens):
            return self.manager.finalize_partial_tail_offloads(req)

    @contextlib.contextmanager
    def _tokens_in_flight(self, req: Request, num_in_flight_tokens: int) -> Iterator[None]:
        """``req.num_in_flight_tokens`` (vLLM's ``Request.num_in_flight_tokens``: the
        scheduler's count, which the view carries per call) set for one manager call, then
        back at 0. Checked first: an int >= 0, and only under vLLM 0.33 (0.10.2's KV-cache
        manager reads no such count)."""
        request_id = req.request_id
        if type(num_in_flight_tokens) is not int or num_in_flight_tokens < 0:
            raise KVCacheMisuseError(
                f"{request_id!r}: num_in_flight_tokens must be an int >= 0, got "
                f"{num_in_flight_tokens!r}")
        if not self._v033:
            raise KVCacheMisuseError(
                f"{request_id!r}: num_in_flight_tokens={num_in_flight_tokens}: vLLM 0.10.2's "
                "KV-cache manager reads no in-flight count (vLLM 0.33's asynchronous "
                "scheduling added it); use profile vllm-0.33 or leave it at 0")
        req.num_in_flight_tokens = num_in_flight_tokens
        try:
            yield
        finally:
            req.num_in_flight_tokens = 0

    def free(self, request_id: str) -> None:
        self.manager.free(request_id)
        self._requests.pop(request_id)

    def get_block_ids(self, request_id: str) -> AdapterBlockIds:
        if self._grouped:
            return list(self.manager.get_block_ids(request_id))
        return self.manager.get_block_ids(request_id)[0]

    def get_block_ids_many(self, request_ids: list[str]) -> list[AdapterBlockIds]:
        """``get_block_ids`` of each of ``request_ids``, in order, in one call: the harness
        reads every running request's tables after each step (the recorded area, the
        workload machine), one guarded call instead of one per request."""
        return [self.get_block_ids(r) for r in request_ids]

    def reset_prefix_cache(self) -> bool:
        return self.manager.reset_prefix_cache()

    def num_free_blocks(self) -> int:
        return self.manager.num_free_blocks

    # -- observations
    def free_block_ids(self) -> list[int]:
        return [b.block_id for b in self.manager.block_pool.free_block_queue]

    def ref_cnt(self, block_id: int) -> int:
        return self.manager.block_pool.blocks[block_id].ref_cnt

    def ref_cnts(self, block_ids: list[int]) -> list[int]:
        """``ref_cnt`` of each of ``block_ids``, in one call: the harness's sweeps over the
        pool (the recorded area reads every held block after each step) take one guarded
        call instead of one per block."""
        blocks = self.manager.block_pool.blocks
        return [blocks[b].ref_cnt for b in block_ids]

    def block_hashes(self, request_id: str) -> list[bytes]:
        req = self._requests.get(request_id)
        return [] if req is None else list(req.block_hashes)

    def block_hashes_many(self, request_ids: list[str]) -> list[list[bytes]]:
        """``block_hashes`` of each of ``request_ids``, in order, in one call (as
        ``get_block_ids_many``)."""
        return [self.block_hashes(r) for r in request_ids]

    def take_events(self) -> list[KVEvent]:
        events = self.manager.take_events()
        if isinstance(self.manager.block_pool.event_factory, WireEventFactory):
            return [wire_event_to_dict(e, self._grouped) for e in events]
        if not self._grouped:
            return [event_to_dict(e) for e in events]
        out = []
        metadata = self.manager.kv_cache_event_metadata
        for event in events:
            d = event_to_dict(event)
            if not self._v033:
                d.pop("group_idx", None)
            elif d["type"] == "BlockStored":
                d["kv_cache_spec_kind"], d["kv_cache_spec_sliding_window"] = (
                    metadata[d["group_idx"]])
            out.append(d)
        return out

    def take_event_batch(self, ts: float) -> bytes:
        """The events as vLLM's publisher sends them (``event_wire``): 0.33's tagged maps,
        every ``BlockStored`` annotated with its group's kind and window as 0.33's
        ``KVCacheManager.take_events`` does, or 0.10.2's tagged arrays; full hash bytes (the
        adapter's ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``, as vLLM's adapter runs). Events
        built in the wire form (the default) are encoded as they are, as vLLM's publisher
        does; the reference's dataclasses are converted (``encode_batch``)."""
        events = self.manager.take_events()
        factory = self.manager.block_pool.event_factory
        if isinstance(factory, WireEventFactory):
            return factory.encode(events, ts)
        if self._v033:
            return encode_batch(events, ts=ts, release="vllm-0.33", int_hashes=False,
                                group_metadata=self.manager.kv_cache_event_metadata)
        return encode_batch(events, ts=ts, release="vllm-0.10", int_hashes=False)

    def slot_mapping(self, request_id: str, start: int, end: int) -> list[int]:
        """Slots of group 0 (its block table and block size)."""
        return slot_mapping_for_request(
            self.manager.get_block_ids(request_id)[0], self._slot_block_size, start, end)

    def check_invariants(self) -> None:
        check_manager_invariants(self.manager)

    # -- batch metadata (stateless: the block tables are arguments)
    def build_batch(
        self,
        block_tables: Sequence[Sequence[int]],
        num_computed_tokens: Sequence[int],
        num_scheduled_tokens: Sequence[int],
        num_padded_tokens: int,
        dcp_world_size: int = 1,
        dcp_rank: int = 0,
        cp_kv_cache_interleave_size: int = 1,
    ) -> tuple[list[int], list[int], list[int]]:
        batch = batch_metadata.build_batch(
            block_tables, num_computed_tokens, num_scheduled_tokens, self.spec.block_size,
            num_padded_tokens, dcp_world_size=dcp_world_size, dcp_rank=dcp_rank,
            cp_kv_cache_interleave_size=cp_kv_cache_interleave_size)
        return (batch.slot_mapping.tolist(), batch.positions.tolist(),
                batch.req_indices.tolist())

    def flashinfer_csr(self, block_tables: Sequence[Sequence[int]],
                       seq_lens: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
        indptr, indices, last = page_table.to_flashinfer_csr(
            block_tables, seq_lens, self.spec.block_size)
        return indptr.tolist(), indices.tolist(), last.tolist()

    def req_to_token(self, block_tables: Sequence[Sequence[int]],
                     seq_lens: Sequence[int]) -> list[list[int]]:
        table = batch_metadata.req_to_token(block_tables, seq_lens, self.spec.block_size)
        return [row[:n] for row, n in zip(table.tolist(), seq_lens, strict=True)]


class ReferenceBlockPool:
    """``BlockPoolAdapter`` over ``BlockPool`` (block ids in, block ids out)."""

    def __init__(self, spec: KVCacheSpec) -> None:
        self.spec = spec
        profile = reference_profile(spec)
        self.pool = BlockPool(spec.num_blocks, spec.enable_caching,
                              spec.enable_kv_cache_events, profile=profile,
                              num_hash_lookahead_tokens=spec.num_hash_lookahead_tokens)
        self._requests = request_sync(
            RequestBlockHasher(spec.block_size, spec.hash_algo, profile=profile,
                               none_hash=none_hash_for(spec),
                               num_lookahead_tokens=spec.num_hash_lookahead_tokens)
        )

    def _blocks(self, block_ids: Sequence[int]) -> list[KVCacheBlock]:
        return [self.pool.blocks[i] for i in block_ids]

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        return [b.block_id for b in self.pool.get_new_blocks(num_blocks)]

    def free_blocks(self, ordered_block_ids: Sequence[int]) -> None:
        self.pool.free_blocks(self._blocks(ordered_block_ids))

    def touch(self, block_ids: Sequence[int]) -> None:
        self.pool.touch(self._blocks(block_ids))

    def cache_full_blocks(self, request: RequestView, block_ids: Sequence[int],
                          num_cached_blocks: int, num_full_blocks: int) -> None:
        self.pool.cache_full_blocks(self._requests.sync(request), self._blocks(block_ids),
                                    num_cached_blocks, num_full_blocks, self.spec.block_size)

    def get_cached_block(self, block_hash: bytes) -> int | None:
        hit = self.pool.get_cached_block(block_hash, (0,))  # type: ignore[arg-type]
        return None if hit is None else hit[0].block_id

    def num_free_blocks(self) -> int:
        return self.pool.get_num_free_blocks()

    def free_block_ids(self) -> list[int]:
        return [b.block_id for b in self.pool.free_block_queue]


def make_kv_cache_manager(spec: KVCacheSpec) -> ReferenceManager:
    """A fresh reference manager for ``spec`` (the grouped form when it has
    ``kv_cache_groups``)."""
    return ReferenceManager(spec)


def make_native_manager(spec: KVCacheSpec) -> ReferenceNativeManager:
    """The reference manager for ``spec`` with its own objects (benchmark hook,
    ``kvcheck.bench.replay.native``), built as ``ReferenceManager`` builds it.

    Raises:
        UnsupportedSpec: ``spec.kv_cache_groups`` is set (the hook covers single-group specs).
    """
    return ReferenceNativeManager(spec, reference_kv_cache_manager, request_factory)


def make_offloading_manager(spec: OffloadSpec) -> OffloadTier:
    """A fresh, empty reference offload tier for ``spec`` (capability ``offload``): kvcheck's
    ``CPUOffloadingManager``, LRU or ARC, through ``offload_tier.OffloadTier``; its misuse
    errors name the key and the rule."""
    return OffloadTier(CPUOffloadingManager(
        spec.num_chunks, spec.cache_policy, enable_events=spec.enable_events,
        store_threshold=spec.store_threshold, max_tracker_size=spec.max_tracker_size,
        key_width=spec.key_width), ReqContext)


def make_block_pool(spec: KVCacheSpec) -> ReferenceBlockPool:
    """A fresh reference block pool for ``spec``."""
    return ReferenceBlockPool(spec)


def kernels() -> KernelSet:
    """kvcheck's own Triton kernels (needs the ``kernels`` extra: torch and triton)."""
    from kvcheck.gpu_kernels.conformance import kvcheck_kernel_set

    return kvcheck_kernel_set()


#: Benchmark hook (``kvcheck.bench.kinds.event_wire.EventDecodeBench``):
#: ``decode_event_batch(payload, release)`` is kvcheck's own decoder,
#: ``kvcheck.events.codec.decode_batch``, which validates as it decodes (bound as is: a
#: wrapper's Python frame would be a tenth of a batch's decode time).
decode_event_batch = decode_batch


def none_hash_for(spec: KVCacheSpec) -> bytes:
    """The NONE_HASH the reference uses for ``spec`` (for hash-vector checks)."""
    return resolve_none_hash(spec.hash_algo, reference_profile(spec), spec.pythonhashseed)
