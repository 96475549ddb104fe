"""KV-cache groups (hybrid models) on the installed vLLM, for ``kvcheck.adapters.vllm``.

A spec with ``kv_cache_groups`` is translated into vLLM's own ``KVCacheConfig``: one
``KVCacheGroupSpec(["layer.<i>"], spec)`` per group, in the spec's order, with
``FullAttentionSpec`` / ``SlidingWindowSpec`` / ``ChunkedLocalAttentionSpec`` of the group's
block size, window or chunk (dummy ``num_kv_heads=1, head_size=1, float32``: the manager never
reads the page layout). vLLM's ``KVCacheManager`` then picks its own coordinator (unitary,
hybrid or no-prefix-cache) over one ``BlockPool`` shared by every group.

Releases with ``scheduler_block_size`` / ``hash_block_size`` (0.33) get them as the engine core
derives them, by vLLM's ``resolve_kv_cache_block_sizes`` (one group: its block size; several:
the LCM of the group block sizes, hashes at their GCD with prefix caching on), and the spec's
``prefix_cache_retention_interval`` in the ``KVCacheConfig``. Requests are hashed at the hash
block size, so ``block_hashes`` is at that size.

Configurations the installed release refuses raise ``UnsupportedSpec`` naming the release and
the rule (``unsupported_reason``), so the suite skips them: 0.10.2's hybrid coordinator takes
one full-attention spec and one other spec, not interleaved, all of one block size with prefix
caching on, and crashes on KV events when a chunked-local or ``w - 1 < bs`` sliding-window
group caches a block after a null one; 0.33 rejects chunked-local groups whose block size is
not the scheduler block size. A malformed group (unknown kind, missing window / chunk) is a
``KVCheckInputError``.

The manager speaks the per-group protocol (``SupportsKVCacheGroups``; ``slot_mapping`` maps
group 0's table, as the reference does). KV events keep vLLM's group fields where the release
has them (``group_idx`` on both event types and, on ``BlockStored``, ``kv_cache_spec_kind`` and
``kv_cache_spec_sliding_window``: 0.33) and carry none of them where it does not (0.10.2).
Like vLLM's scheduler, ``get_computed_blocks`` stores 0.33's ``shared_prefix_boundary`` on the
request, where the sliding-window cache mask reads it
(docs/semantics.md#allocation-caching-freeing-and-events-with-several-groups).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from kvcheck.adapters import vllm as _base
from kvcheck.conformance.protocol import (
    ATTENTION_KINDS,
    KVCacheGroupSpec,
    KVCacheSpec,
    RequestView,
    UnsupportedSpec,
)
from kvcheck.errors import KVCheckInputError

__all__ = [
    "LEGACY_HYBRID",
    "VLLMGroupedManager",
    "block_sizes",
    "group_event_to_dict",
    "kv_cache_config",
    "unsupported_reason",
]

# vLLM's classes, as the adapter imported them (after setting vLLM's environment up).
ChunkedLocalAttentionSpec = _base.ChunkedLocalAttentionSpec
FullAttentionSpec = _base.FullAttentionSpec
KVCacheConfig = _base.KVCacheConfig
VLLMKVCacheGroupSpec = _base.KVCacheGroupSpec
SlidingWindowSpec = _base.SlidingWindowSpec
VERSION = _base.VERSION
#: True for releases whose ``KVCacheManager`` has no ``hash_block_size`` (0.10.x): one block
#: size with caching, the one-full-one-other hybrid coordinator, the KV-event null-parent bug.
LEGACY_HYBRID: bool = "hash_block_size" not in _base._MANAGER_PARAMS

_EVENT_GROUP_FIELDS = ("group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window")


# ------------------------------------------------------------------------------ translation
def _check_group(index: int, group: KVCacheGroupSpec, block_size: int) -> None:
    """``KVCheckInputError`` for a group no model could have."""
    where = f"kv_cache_groups[{index}]"
    if group.kind not in ATTENTION_KINDS:
        raise KVCheckInputError(f"{where}: kind {group.kind!r} is not one of {ATTENTION_KINDS}")
    if block_size < 1:
        raise KVCheckInputError(f"{where}: block_size {block_size} < 1")
    if group.kind == "sliding_window" and (group.sliding_window or 0) < 1:
        raise KVCheckInputError(f"{where}: a sliding_window group needs sliding_window >= 1, "
                                f"got {group.sliding_window!r}")
    if group.kind == "chunked_local_attention" and (group.attention_chunk_size or 0) < 1:
        raise KVCheckInputError(f"{where}: a chunked_local_attention group needs "
                                f"attention_chunk_size >= 1, got {group.attention_chunk_size!r}")


def _attention_spec(group: KVCacheGroupSpec, block_size: int) -> Any:
    """vLLM's spec for one group (dummy heads and dtype)."""
    common: dict[str, Any] = {"block_size": block_size, "num_kv_heads": 1, "head_size": 1,
                              "dtype": _base.torch.float32, "use_mla": False}
    if group.kind == "sliding_window":
        cls: Any = SlidingWindowSpec
        common["sliding_window"] = group.sliding_window
    elif group.kind == "chunked_local_attention":
        cls = ChunkedLocalAttentionSpec
        common["attention_chunk_size"] = group.attention_chunk_size
    else:
        cls = FullAttentionSpec
    return cls(**_base._accepting(cls, **common))


def _vllm_config(spec: KVCacheSpec, groups: Sequence[Any]) -> Any:
    """The few ``VllmConfig`` fields vLLM's block-size resolution reads (no connector, no
    DCP, no ``prefix_match_unit``)."""
    first = groups[0].kv_cache_spec.block_size
    return SimpleNamespace(
        cache_config=SimpleNamespace(block_size=first,
                                     enable_prefix_caching=spec.enable_caching,
                                     prefix_match_unit=None),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
        kv_transfer_config=None)


def block_sizes(spec: KVCacheSpec) -> tuple[int, int]:
    """``(scheduler_block_size, hash_block_size)`` for ``spec`` on this release.

    0.33: vLLM's ``resolve_kv_cache_block_sizes`` on the translated groups. 0.10.x has neither
    (one hash size: the common block size; ``spec.block_size`` when sizes differ, which only
    caching off allows, where hashes are unused)."""
    sizes = [spec.group_block_size(i) for i in range(len(spec.groups))]
    if LEGACY_HYBRID:
        size = sizes[0] if len(set(sizes)) == 1 else spec.block_size
        return size, size
    from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes

    groups = [VLLMKVCacheGroupSpec([f"layer.{i}"], _attention_spec(g, s))
              for i, (g, s) in enumerate(zip(spec.groups, sizes, strict=True))]
    config = KVCacheConfig(num_blocks=spec.num_blocks, kv_cache_tensors=[],
                           kv_cache_groups=groups)
    scheduler, hashed = resolve_kv_cache_block_sizes(config, _vllm_config(spec, groups))
    return int(scheduler), int(hashed)


def unsupported_reason(spec: KVCacheSpec) -> str | None:
    """Why the installed vLLM refuses ``spec``'s groups (a sentence naming the release and
    its rule), or None when it takes them."""
    groups = spec.groups
    sizes = [spec.group_block_size(i) for i in range(len(groups))]
    if LEGACY_HYBRID:
        return _legacy_reason(spec, groups, sizes)
    if not spec.enable_caching:
        return None
    scheduler = math.lcm(*sizes)
    for i, (group, size) in enumerate(zip(groups, sizes, strict=True)):
        if group.kind == "chunked_local_attention" and size != scheduler:
            return (f"vLLM {VERSION}'s ChunkedLocalAttentionManager asserts that its block "
                    f"size equals the cache-hit alignment (the scheduler block size, "
                    f"lcm{tuple(sizes)} = {scheduler}); group {i} has block size {size}")
    return None


def _legacy_reason(spec: KVCacheSpec, groups: Sequence[KVCacheGroupSpec],
                   sizes: Sequence[int]) -> str | None:
    if not spec.enable_caching:
        return None  # KVCacheCoordinatorNoPrefixCache: any groups, any sizes
    if len(set(sizes)) != 1:
        return (f"vLLM {VERSION}'s KVCacheManager asserts one block size for all KV-cache "
                f"groups with prefix caching on (got {list(sizes)})")
    if len(groups) > 1:
        specs = [(g.kind, g.sliding_window if g.kind == "sliding_window" else None,
                  g.attention_chunk_size if g.kind == "chunked_local_attention" else None)
                 for g in groups]
        full = {s for s in specs if s[0] == "full_attention"}
        other = {s for s in specs if s[0] != "full_attention"}
        if len(full) != 1 or len(other) != 1:
            return (f"vLLM {VERSION}'s HybridKVCacheCoordinator takes exactly one "
                    "full-attention spec and one other spec with prefix caching on (got "
                    f"{len(full)} full and {len(other)} other distinct specs)")
        is_full = [s[0] == "full_attention" for s in specs]
        if is_full != sorted(is_full, reverse=is_full[0]):
            return (f"vLLM {VERSION}'s HybridKVCacheCoordinator raises ValueError when "
                    "full-attention group ids and other group ids interleave")
    if spec.enable_kv_cache_events:
        for i, (group, size) in enumerate(zip(groups, sizes, strict=True)):
            crashes = (group.kind == "chunked_local_attention"
                       or (group.kind == "sliding_window"
                           and (group.sliding_window or 0) - 1 < size))
            if crashes:
                return (f"vLLM {VERSION} raises AssertionError in BlockPool.cache_full_blocks "
                        "with KV events on when the parent of a newly cached block is a null "
                        f"block (group {i}: {group.kind}, block size {size}; chunked-local and "
                        "sliding windows with w - 1 < block size)")
    return None


def kv_cache_config(spec: KVCacheSpec) -> Any:
    """vLLM's ``KVCacheConfig`` for ``spec``'s groups (``KVCheckInputError`` for a malformed
    group)."""
    sizes = [spec.group_block_size(i) for i in range(len(spec.groups))]
    for i, (group, size) in enumerate(zip(spec.groups, sizes, strict=True)):
        _check_group(i, group, size)
    groups = [VLLMKVCacheGroupSpec([f"layer.{i}"], _attention_spec(g, s))
              for i, (g, s) in enumerate(zip(spec.groups, sizes, strict=True))]
    extra: dict[str, Any] = {}
    if not LEGACY_HYBRID:
        scheduler, hashed = block_sizes(spec)
        extra = _base._accepting(
            KVCacheConfig, prefix_cache_retention_interval=spec.prefix_cache_retention_interval,
            hash_block_size=hashed, cache_hit_alignment_tokens=scheduler)
    return KVCacheConfig(num_blocks=spec.num_blocks, kv_cache_tensors=[],
                         kv_cache_groups=groups, **extra)


# ------------------------------------------------------------------------------ events
def group_event_to_dict(event: Any) -> dict[str, Any]:
    """``event_to_dict`` with vLLM's own group fields: present exactly when this release's
    event class has them (0.33: ``group_idx``, and on ``BlockStored`` the spec kind and
    window), absent otherwise (0.10.2)."""
    out = _base.event_to_dict(event)
    for name in _EVENT_GROUP_FIELDS:
        if hasattr(event, name):
            out[name] = getattr(event, name)
        else:
            out.pop(name, None)
    return out


# ------------------------------------------------------------------------------ the manager
class VLLMGroupedManager(_base.VLLMManager):
    """``SupportsKVCacheGroups`` over vLLM's ``KVCacheManager`` with one KV-cache group per
    ``spec.kv_cache_groups`` entry (see the module docstring). Methods not overridden here
    (free, pool observations, ref counts, reset) keep the single-group adapter's form."""

    def __init__(self, spec: KVCacheSpec) -> None:
        if not spec.kv_cache_groups:
            raise KVCheckInputError("VLLMGroupedManager needs a spec with kv_cache_groups")
        reason = unsupported_reason(spec)
        if reason is not None:
            raise UnsupportedSpec(reason)
        config = kv_cache_config(spec)
        scheduler, hashed = block_sizes(spec)
        self.spec = spec
        self.num_groups = len(spec.kv_cache_groups)
        self.scheduler_block_size = scheduler
        self.hash_block_size = hashed
        self.hashing = _base._Hashing(spec, hashed)
        try:
            self.manager = _base._make_kv_cache_manager(spec, config, (scheduler, hashed))
        except AssertionError as exc:  # a rule of this release the checks above missed
            raise UnsupportedSpec(f"vLLM {VERSION} refuses these KV-cache groups: "
                                  f"AssertionError: {exc}") from exc
        self.pool = self.manager.block_pool
        self._requests = _base._request_sync(self.hashing)
        self._slots: Any = None
        self._slot_capacity = 0

    def _ids(self, groups: Sequence[Sequence[Any]]) -> list[list[int]]:
        return [[b.block_id for b in group] for group in groups]

    def get_computed_blocks(  # type: ignore[override]
        self, request: RequestView,
    ) -> tuple[list[list[int]], int]:
        req = self._requests.sync(request)
        result = self.manager.get_computed_blocks(req)
        blocks, num_tokens = result[0], int(result[1])
        if len(result) > 2:
            # As the scheduler does with a waiting request's lookup (the only kind it makes):
            # the shared-prefix boundary feeds the sliding-window cache mask (0.33, with a
            # retention interval).
            req.shared_prefix_boundary = result[2]
        return self._ids(blocks.blocks), num_tokens

    def allocate_slots(  # type: ignore[override]
        self,
        request: RequestView,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_block_ids: Sequence[Sequence[int]] = (),
        num_lookahead_tokens: int = 0,
    ) -> list[list[int]] | None:
        req = self._requests.sync(request)
        hits = None
        if new_computed_block_ids:
            if len(new_computed_block_ids) != self.num_groups:
                raise KVCheckInputError(
                    f"new_computed_block_ids has {len(new_computed_block_ids)} lists for "
                    f"{self.num_groups} KV-cache groups")
            blocks = self.pool.blocks
            hits = _base.KVCacheBlocks(tuple([blocks[i] for i in group]
                                             for group in new_computed_block_ids))
        new = self.manager.allocate_slots(
            req, num_new_tokens=num_new_tokens, num_new_computed_tokens=num_new_computed_tokens,
            new_computed_blocks=hits, num_lookahead_tokens=num_lookahead_tokens)
        if new is None:
            return None
        return self._ids(new.blocks)

    def get_block_ids(self, request_id: str) -> list[list[int]]:  # type: ignore[override]
        return [list(ids) for ids in self.manager.get_block_ids(request_id)]

    def take_events(self) -> list[dict[str, Any]]:
        return [group_event_to_dict(e) for e in self.manager.take_events()]

    def slot_mapping(self, request_id: str, start: int, end: int) -> list[int]:
        """Slots of group 0 (its block table and block size), from vLLM's worker
        ``BlockTable`` as in the single-group adapter (the reference's grouped form too)."""
        table = self.get_block_ids(request_id)[0]
        size = self.spec.group_block_size(0)
        # A window's table (nulls included) may be longer than the pool: grow the worker table.
        need = max(len(table), -(-end // size), self.spec.num_blocks)
        if self._slots is None or need > self._slot_capacity:
            self._slot_capacity = max(need, 2 * self._slot_capacity)
            self._slots = _base._SlotMapper(self._slot_capacity, size)
        return self._slots(table, start, end)
