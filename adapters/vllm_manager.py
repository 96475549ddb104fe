"""kvcheck's protocol over vLLM's ``KVCacheManager`` and ``BlockPool``, for
``kvcheck.adapters.vllm``.

``VLLMManager`` drives the manager ``kvcheck.adapters.vllm_kv_config`` builds: one KV-cache
group per entry of ``spec.groups``, so a spec without ``kv_cache_groups`` is vLLM's one
full-attention group, built by the same code. vLLM answers one list of blocks per group
(``KVCacheBlocks``); at the protocol boundary a spec without ``kv_cache_groups`` gets group 0's
list (the single-group protocol) and a spec with them one list per group
(``SupportsKVCacheGroups``, even for a single group). ``slot_mapping`` maps group 0's table,
as the reference does.

KV events are the reference's fields (``event_to_dict``); a spec with ``kv_cache_groups`` also
keeps vLLM's group fields where the release has them (``group_idx`` on both event types and,
on ``BlockStored``, ``kv_cache_spec_kind`` and ``kv_cache_spec_sliding_window``: 0.33) and
carries none of them where it does not (0.10.2). Like vLLM's scheduler, ``get_computed_blocks``
stores 0.33's ``shared_prefix_boundary`` on the request, where the sliding-window cache mask
reads it (docs/semantics.md#allocation-caching-freeing-and-events-with-several-groups).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import msgspec

from kvcheck.adapters.external_blocks import blocks_added
from kvcheck.adapters.vllm_kv_config import (
    HAS_ADMISSION_GATES,
    HAS_BLOCK_ZEROING,
    make_vllm_cache,
)
from kvcheck.adapters.vllm_requests import Hashing, request_sync
from kvcheck.adapters.vllm_runtime import (
    VERSION,
    BlockPool,
    KVCacheBlocks,
    KVCacheManager,
    KVEventBatch,
    RequestStatus,
    accepting,
    params,
)
from kvcheck.adapters.vllm_slots import SlotMapper, build_batch
from kvcheck.conformance.groups import AdapterBlockIds
from kvcheck.conformance.protocol import KVCacheSpec, KVEvent, RequestView, UnsupportedSpec
from kvcheck.errors import KVCheckInputError
from kvcheck.events.wire_events import wire_event_to_dict

__all__ = ["EXTERNAL_ARGUMENT", "HAS_BLOCK_COPIES", "HAS_BOUNDARY_STATE_OFFLOADS",
           "HAS_EVICT_BLOCKS", "VLLMBlockPool", "VLLMManager", "event_to_dict", "make_block_pool"]

#: Whether this release's ``allocate_slots`` takes ``num_external_computed_tokens`` (0.33;
#: 0.10.2's scheduler adds the external tokens to ``num_new_tokens`` instead).
EXTERNAL_ARGUMENT: bool = "num_external_computed_tokens" in params(KVCacheManager.allocate_slots)
#: Whether this release's manager has ``evict_blocks`` (0.33; not 0.10.2).
HAS_EVICT_BLOCKS: bool = hasattr(KVCacheManager, "evict_blocks")
#: Whether this release hands Mamba "align" boundary states to a KV connector
#: (``KVCacheManager.take_boundary_state_offloads``: 0.33; not 0.10.2).
HAS_BOUNDARY_STATE_OFFLOADS: bool = hasattr(KVCacheManager, "take_boundary_state_offloads")
#: Whether this release has fine-grained partial hash hits and their copy-on-write copies
#: (``KVCacheManager.take_kv_cache_block_copies``: 0.33; not 0.10.2).
HAS_BLOCK_COPIES: bool = hasattr(KVCacheManager, "take_kv_cache_block_copies")


# ------------------------------------------------------------------------------ events
def _hash_bytes(value: object) -> bytes | None:
    if value is None or isinstance(value, (bytes, bytearray)):
        return None if value is None else bytes(value)
    raise KVCheckInputError(
        f"vLLM published the block hash {value!r} as {type(value).__name__}, not bytes: "
        "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES must be 0 before vLLM reads it")


def event_to_dict(event: object, group_fields: bool = False) -> KVEvent:
    """A vLLM KV event as the protocol's dict: ``"type"`` plus exactly the fields of
    ``kvcheck.reference_impl.events`` (fields an older vLLM lacks get the reference's
    default), hashes as bytes. ``group_fields``: vLLM's own group fields instead, present
    exactly when this release's event class has them (0.33: ``group_idx``, and on
    ``BlockStored`` the spec kind and window), absent otherwise (0.10.2)."""
    return wire_event_to_dict(event, group_fields, _hash_bytes)


# ------------------------------------------------------------------------------ the manager
class VLLMManager:
    """``KVCacheManagerAdapter`` over vLLM's ``KVCacheManager``, and ``SupportsKVCacheGroups``
    for a spec with ``kv_cache_groups`` (see the module docstring).

    Raises:
        UnsupportedSpec: this release refuses the spec's groups (``kvcheck.adapters.
            vllm_kv_config.unsupported_reason``).
        KVCheckInputError: a malformed group.
    """

    def __init__(self, spec: KVCacheSpec) -> None:
        cache = make_vllm_cache(spec)
        self.spec = spec
        self.num_groups = len(spec.groups)
        #: False: the single-group protocol (group 0's lists, flat).
        self.grouped = bool(spec.kv_cache_groups)
        self.scheduler_block_size = cache.scheduler_block_size
        self.hash_block_size = cache.hash_block_size
        self.hashing = Hashing(spec, cache.hash_block_size)
        self.manager = cache.manager
        self.pool = self.manager.block_pool
        self._requests = request_sync(self.hashing)
        self._pack = msgspec.msgpack.Encoder()  # as ZmqEventPublisher keeps one
        self._slots: SlotMapper | None = None
        self._slot_capacity = 0

    # -- manager
    def get_computed_blocks(self, request: RequestView) -> tuple[AdapterBlockIds, int]:
        """``(hit block ids, hit tokens)``: one list per group, or group 0's for a spec
        without ``kv_cache_groups``."""
        req = self._requests.sync(request)
        result = self.manager.get_computed_blocks(req)
        blocks, num_tokens = result[0].blocks, int(result[1])
        if len(result) > 2:
            # As the scheduler does with a waiting request's lookup (the only kind it makes):
            # the shared-prefix boundary feeds the sliding-window cache mask (0.33, with a
            # retention interval; 0 whenever no group lags behind another).
            req.shared_prefix_boundary = result[2]
        if not self.grouped:
            return [b.block_id for b in blocks[0]], num_tokens
        return [[b.block_id for b in group] for group in blocks], num_tokens

    def allocate_slots(
        self,
        request: RequestView,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        # Any: the protocol's two forms, flat ids or one list per group (``grouped``).
        new_computed_block_ids: Sequence[Any] = (),
        num_lookahead_tokens: int = 0,
        *,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
        num_in_flight_tokens: int = 0,
        skip_zeroing_group_ids: Sequence[int] = (),
    ) -> AdapterBlockIds | None:
        """The newly allocated block ids (one list per group, or group 0's for a spec
        without ``kv_cache_groups``), or None when the pool cannot hold the request.

        External tokens go to vLLM as its own scheduler passes them: 0.33 as
        ``num_external_computed_tokens`` (its answer omits the external blocks, so the
        answer is read from the tables, ``blocks_added``), 0.10.2 added to
        ``num_new_tokens``. Encoder tokens (a cross-attention group) go as vLLM's
        ``num_encoder_tokens`` (both releases), only when there are some.

        vLLM 0.33's admission gates go to vLLM as they come, only when not at their default;
        the vLLM ``Request``'s status is what the protocol's contract says: RUNNING once an
        allocation succeeded, WAITING until then (a freed request's next ``Request`` is a
        new one, WAITING: vLLM treats PREEMPTED alike). 0.10.2 has no gates:
        ``UnsupportedSpec``."""
        # Any: vLLM's keyword arguments, each of its own type.
        gates: dict[str, Any] = dict(
            self._gates(full_sequence_must_fit, reserved_blocks, has_scheduled_reqs))
        if skip_zeroing_group_ids:  # only with an asynchronous external load (vLLM 0.33)
            if not HAS_BLOCK_ZEROING:
                raise UnsupportedSpec(
                    f"allocate_slots(skip_zeroing_group_ids={list(skip_zeroing_group_ids)}): "
                    f"vLLM {VERSION} has no worker-side block zeroing (vLLM 0.33 added it)")
            gates["skip_zeroing_group_ids"] = tuple(skip_zeroing_group_ids)
        req = self._requests.sync(request)
        if num_in_flight_tokens:
            # vLLM's scheduler keeps the count on the Request; the view carries it per call.
            req.num_in_flight_tokens = _in_flight(num_in_flight_tokens)
            try:
                return self.allocate_slots(
                    request, num_new_tokens, num_new_computed_tokens, new_computed_block_ids,
                    num_lookahead_tokens,
                    num_external_computed_tokens=num_external_computed_tokens,
                    delay_cache_blocks=delay_cache_blocks,
                    num_encoder_tokens=num_encoder_tokens,
                    full_sequence_must_fit=full_sequence_must_fit,
                    reserved_blocks=reserved_blocks, has_scheduled_reqs=has_scheduled_reqs,
                    skip_zeroing_group_ids=skip_zeroing_group_ids)
            finally:
                req.num_in_flight_tokens = 0
        hits = None
        if new_computed_block_ids:
            per_group = new_computed_block_ids if self.grouped else (new_computed_block_ids,)
            if len(per_group) != self.num_groups:
                raise KVCheckInputError(
                    f"new_computed_block_ids has {len(per_group)} lists for "
                    f"{self.num_groups} KV-cache groups")
            blocks = self.pool.blocks
            hits = KVCacheBlocks(tuple([blocks[i] for i in group] for group in per_group))
        if num_external_computed_tokens and EXTERNAL_ARGUMENT:
            before = self.manager.get_block_ids(req.request_id)
            new = self.manager.allocate_slots(
                req, num_new_tokens=num_new_tokens,
                num_new_computed_tokens=num_new_computed_tokens, new_computed_blocks=hits,
                num_lookahead_tokens=num_lookahead_tokens,
                num_external_computed_tokens=num_external_computed_tokens,
                delay_cache_blocks=delay_cache_blocks,
                **({"num_encoder_tokens": num_encoder_tokens} if num_encoder_tokens else {}),
                **gates)
            if new is None:
                return None
            req.status = RequestStatus.RUNNING
            added = blocks_added(
                before, [len(g) for g in hits.blocks] if hits else [0] * self.num_groups,
                self.manager.get_block_ids(req.request_id))
            return added if self.grouped else added[0]
        new = self.manager.allocate_slots(
            req, num_new_tokens=num_new_tokens + num_external_computed_tokens,
            num_new_computed_tokens=num_new_computed_tokens, new_computed_blocks=hits,
            num_lookahead_tokens=num_lookahead_tokens,
            **({"delay_cache_blocks": True} if delay_cache_blocks else {}),
            **({"num_encoder_tokens": num_encoder_tokens} if num_encoder_tokens else {}),
            **gates)
        if new is None:
            return None
        req.status = RequestStatus.RUNNING
        if not self.grouped:
            return [b.block_id for b in new.blocks[0]]
        return [[b.block_id for b in group] for group in new.blocks]

    @staticmethod
    def _gates(full_sequence_must_fit: bool, reserved_blocks: int,
               has_scheduled_reqs: bool) -> dict[str, bool | int]:
        """The admission gates not at their default, as vLLM 0.33's ``allocate_slots`` takes
        them; ``UnsupportedSpec`` on a release without them."""
        gates: dict[str, bool | int] = {}
        if full_sequence_must_fit:
            gates["full_sequence_must_fit"] = True
        if reserved_blocks:
            gates["reserved_blocks"] = reserved_blocks
        if not has_scheduled_reqs:
            gates["has_scheduled_reqs"] = False
        if gates and not HAS_ADMISSION_GATES:
            raise UnsupportedSpec(
                f"allocate_slots({', '.join(f'{k}={v!r}' for k, v in gates.items())}): vLLM "
                f"{VERSION}'s allocate_slots has no admission gates (vLLM 0.33 added them)")
        return gates

    def cache_blocks(self, request: RequestView, num_computed_tokens: int) -> None:
        """vLLM's ``KVCacheManager.cache_blocks`` (what its scheduler calls once an
        asynchronous load arrived)."""
        self.manager.cache_blocks(self._requests.sync(request), num_computed_tokens)

    def evict_blocks(self, block_ids: Sequence[int]) -> None:
        """vLLM's ``KVCacheManager.evict_blocks``, given a set as its scheduler gives it."""
        if not HAS_EVICT_BLOCKS:
            raise UnsupportedSpec(f"evict_blocks: vLLM {VERSION}'s KVCacheManager has none")
        self.manager.evict_blocks(set(block_ids))

    def new_step_starts(self) -> None:
        """vLLM 0.33's ``KVCacheManager.new_step_starts`` (its scheduler calls it at the start
        of each step); 0.10.2 has none (its Mamba groups never hit): a no-op there."""
        step = getattr(self.manager, "new_step_starts", None)
        if step is not None:
            step()

    def take_new_block_ids(self) -> list[int]:
        """vLLM 0.33's ``KVCacheManager.take_new_block_ids()`` (its scheduler drains it every
        step into ``new_block_ids_to_zero``), as plain ints; ``[]`` on a release without it
        (0.10.2, which declines specs with ``needs_kv_cache_zeroing``)."""
        take = getattr(self.manager, "take_new_block_ids", None)
        return [] if take is None else [int(b) for b in take()]

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        """vLLM 0.33's ``KVCacheManager.record_blocks_for_zeroing`` (its scheduler's answer to
        a failed asynchronous load past a valid prefix)."""
        if not HAS_BLOCK_ZEROING:
            raise UnsupportedSpec(f"record_blocks_for_zeroing: vLLM {VERSION} has no "
                                  "worker-side block zeroing (vLLM 0.33 added it)")
        self.manager.record_blocks_for_zeroing(request_id, start_token)

    def take_kv_cache_block_copies(self) -> list[tuple[int, int]]:
        """vLLM 0.33's ``KVCacheManager.take_kv_cache_block_copies()`` and what its scheduler
        does right after in its non-deferred mode (``Scheduler.schedule``,
        ``_free_cow_retained_blocks``): ``block_pool.free_blocks(retained_blocks)`` in the
        order vLLM gives them (``[src, dst, src, dst...]``). The copies as ``(src, dst)``
        block-id pairs; ``[]`` on a release without the feature (0.10.2)."""
        take = getattr(self.manager, "take_kv_cache_block_copies", None)
        if take is None:
            return []
        copies, retained = take()
        if copies:  # as the scheduler: only a step that made copies frees their retentions
            self.pool.free_blocks(retained)
        return [(int(c.src_block_id), int(c.dst_block_id)) for c in copies]

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        """vLLM 0.33's ``KVCacheManager.take_boundary_state_offloads()`` (its scheduler
        calls it in every ``schedule()``, just before ``take_kv_cache_block_copies``), as
        plain ints; ``{}`` on a release without it (0.10.2)."""
        take = getattr(self.manager, "take_boundary_state_offloads", None)
        if take is None:
            return {}
        offloads: dict[str, list[tuple[int, int, int]]] = take()
        return {str(rid): [(int(g), int(b), int(n)) for g, b, n in entries]
                for rid, entries in offloads.items()}

    def finalize_partial_tail_offloads(self, request: RequestView, *,
                                       num_in_flight_tokens: int = 0,
                                       ) -> list[tuple[int, int, int]]:
        """vLLM 0.33's ``KVCacheManager.finalize_partial_tail_offloads(request)`` (its
        scheduler calls it for a KV producer whose request finishes, before freeing it), the
        request synced to the view (``num_computed_tokens``; none in flight); ``[]`` on a
        release without it."""
        finalize = getattr(self.manager, "finalize_partial_tail_offloads", None)
        if finalize is None:
            return []
        req = self._requests.sync(request)
        req.num_in_flight_tokens = _in_flight(num_in_flight_tokens) if num_in_flight_tokens else 0
        try:
            tails: list[tuple[int, int, int]] = finalize(req)
        finally:
            req.num_in_flight_tokens = 0
        return [(int(g), int(b), int(n)) for g, b, n in tails]

    def free(self, request_id: str) -> None:
        req = self._requests.pop(request_id)
        if req is not None:  # vLLM never saw a request the adapter has no Request for
            self.manager.free(req)

    def get_block_ids(self, request_id: str) -> AdapterBlockIds:
        """The request's block table: one list per group, or group 0's."""
        tables = self.manager.get_block_ids(request_id)
        if not self.grouped:
            return list(tables[0])
        return [list(ids) for ids in tables]

    def reset_prefix_cache(self) -> bool:
        return bool(self.manager.reset_prefix_cache())

    def num_free_blocks(self) -> int:
        free: int = self.pool.get_num_free_blocks()
        return free

    # -- observations
    def free_block_ids(self) -> list[int]:
        return [b.block_id for b in self.pool.free_block_queue.get_all_free_blocks()]

    def ref_cnt(self, block_id: int) -> int:
        count: int = self.pool.blocks[block_id].ref_cnt
        return count

    def block_hashes(self, request_id: str) -> list[bytes]:
        req = self._requests.get(request_id)
        return [] if req is None else [bytes(h) for h in req.block_hashes]

    def take_events(self) -> list[KVEvent]:
        return [event_to_dict(e, self.grouped) for e in self.manager.take_events()]

    def take_event_batch(self, ts: float) -> bytes:
        """vLLM's own bytes: its ``KVCacheManager.take_events()`` (0.33 annotates each
        ``BlockStored`` with its group's kind and window there) in its ``KVEventBatch``,
        encoded by one msgspec msgpack encoder as ``ZmqEventPublisher`` does (it keeps one,
        ``self._pack``; ``data_parallel_rank`` left nil: the publisher fills it in)."""
        return self._pack.encode(KVEventBatch(ts=ts, events=self.manager.take_events()))

    def slot_mapping(self, request_id: str, start: int, end: int) -> list[int]:
        """Slots of group 0 (its block table and block size), from vLLM's worker
        ``BlockTable``."""
        table = self.manager.get_block_ids(request_id)[0]
        size = self.spec.group_block_size(0)
        # A window's table (nulls included) may be longer than the pool: grow the worker table.
        need = max(len(table), -(-end // size), self.spec.num_blocks)
        if self._slots is None or need > self._slot_capacity:
            self._slot_capacity = max(need, 2 * self._slot_capacity)
            self._slots = SlotMapper(self._slot_capacity, size)
        return self._slots(table, start, end)

    # -- batch metadata: vLLM's worker BlockTable (stateless; the tables are arguments)
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
        return build_batch(self.spec.block_size, block_tables, num_computed_tokens,
                           num_scheduled_tokens, num_padded_tokens, dcp_world_size,
                           dcp_rank, cp_kv_cache_interleave_size)

    def flashinfer_csr(self, block_tables: Sequence[Sequence[int]],
                       seq_lens: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
        # vLLM builds the CSR inside FlashInferMetadataBuilder, which needs a whole VllmConfig
        # and the flashinfer package; the adapter does not drive it.
        raise UnsupportedSpec(
            "vLLM builds FlashInfer's CSR page table only inside its FlashInfer attention "
            "backend (a VllmConfig and the flashinfer package); the adapter does not drive it")

    def req_to_token(self, block_tables: Sequence[Sequence[int]],
                     seq_lens: Sequence[int]) -> list[list[int]]:
        # SGLang's req_to_token[b, pos] is the slot of every position: vLLM's slot mapping of
        # a step that schedules each request's whole sequence.
        lens = [int(n) for n in seq_lens]
        slots, _, _ = build_batch(self.spec.block_size, block_tables, [0] * len(lens), lens,
                                  sum(lens))
        out, start = [], 0
        for n in lens:
            out.append(slots[start:start + n])
            start += n
        return out


# ------------------------------------------------------------------------------ the block pool
def make_block_pool(num_blocks: int, block_size: int, enable_caching: bool,
                    enable_kv_cache_events: bool = False) -> Any:  # Any: vLLM's BlockPool
    """vLLM's ``BlockPool`` with the arguments this release accepts."""
    return BlockPool(**accepting(
        BlockPool.__init__, num_gpu_blocks=num_blocks, enable_caching=enable_caching,
        hash_block_size=block_size, enable_kv_cache_events=enable_kv_cache_events))


def _detect_touch_takes_groups() -> bool:
    """0.10.2's ``BlockPool.touch`` takes a tuple of per-group lists; newer ones a flat list."""
    pool = make_block_pool(4, 4, True)
    (block,) = pool.get_new_blocks(1)
    pool.free_blocks([block])
    try:
        pool.touch([block])
    except (TypeError, AttributeError):
        return True
    return False


_TOUCH_TAKES_GROUPS = _detect_touch_takes_groups()


class VLLMBlockPool:
    """``BlockPoolAdapter`` over vLLM's ``BlockPool`` (block ids in, block ids out)."""

    def __init__(self, spec: KVCacheSpec) -> None:
        self.spec = spec
        self.pool = make_block_pool(spec.num_blocks, spec.block_size, spec.enable_caching,
                                    spec.enable_kv_cache_events)
        self._requests = request_sync(Hashing(spec))

    def _blocks(self, block_ids: Sequence[int]) -> list[object]:
        return [self.pool.blocks[i] for i in block_ids]

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        return [b.block_id for b in self.pool.get_new_blocks(num_blocks)]

    def free_blocks(self, ordered_block_ids: Sequence[int]) -> None:
        self.pool.free_blocks(self._blocks(ordered_block_ids))

    def touch(self, block_ids: Sequence[int]) -> None:
        blocks = self._blocks(block_ids)
        self.pool.touch((blocks,) if _TOUCH_TAKES_GROUPS else blocks)

    def cache_full_blocks(self, request: RequestView, block_ids: Sequence[int],
                          num_cached_blocks: int, num_full_blocks: int) -> None:
        self.pool.cache_full_blocks(self._requests.sync(request), self._blocks(block_ids),
                                    num_cached_blocks, num_full_blocks, self.spec.block_size, 0)

    def get_cached_block(self, block_hash: bytes) -> int | None:
        hit = self.pool.get_cached_block(block_hash, [0])
        return None if hit is None else hit[0].block_id

    def num_free_blocks(self) -> int:
        free: int = self.pool.get_num_free_blocks()
        return free

    def free_block_ids(self) -> list[int]:
        return [b.block_id for b in self.pool.free_block_queue.get_all_free_blocks()]


#: vLLM 0.33's asynchronous scheduling in the KV-cache manager: ``allocate_slots`` frees a
#: window's skipped blocks at ``computed - request.num_in_flight_tokens`` (0.10.2 has no
#: such count).
HAS_IN_FLIGHT_TOKENS: bool = "num_in_flight_tokens" in inspect.getsource(
    KVCacheManager.allocate_slots)


def _in_flight(num_in_flight_tokens: int) -> int:
    """``num_in_flight_tokens`` for vLLM's ``Request``; ``UnsupportedSpec`` on a release
    whose manager reads no such count."""
    if not HAS_IN_FLIGHT_TOKENS:
        raise UnsupportedSpec(
            f"num_in_flight_tokens={num_in_flight_tokens}: vLLM {VERSION}'s KVCacheManager "
            "reads no in-flight count (vLLM 0.33's asynchronous scheduling added it)")
    return num_in_flight_tokens
