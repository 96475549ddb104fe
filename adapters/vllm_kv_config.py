"""kvcheck's ``KVCacheSpec`` as vLLM's own ``KVCacheConfig`` and ``KVCacheManager``, for
``kvcheck.adapters.vllm`` (the protocol adapter) and ``kvcheck.adapters.vllm_native`` (the
benchmark hook): both build their manager here.

The spec's groups (``spec.groups``: ``kv_cache_groups``, or for a spec without them one
full-attention group of ``spec.block_size``) become one ``KVCacheGroupSpec(["layer.<i>"],
spec)`` each, in the spec's order, with ``FullAttentionSpec`` / ``SlidingWindowSpec`` /
``ChunkedLocalAttentionSpec`` of the group's block size, window or chunk (dummy
``num_kv_heads=1, head_size=1, float32``: the manager never reads the page layout), as vLLM's
unit tests build them. vLLM's ``KVCacheManager`` then picks its own coordinator (unitary,
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
``KVCheckInputError``. One full-attention group is never refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any, NamedTuple, Protocol

from kvcheck.adapters.reference import check_knobs_grouped
from kvcheck.adapters.vllm_runtime import (
    MANAGER_PARAMS,
    VERSION,
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheManager,
    MambaSpec,
    SlidingWindowSpec,
    accepting,
    torch,
)
from kvcheck.adapters.vllm_runtime import KVCacheGroupSpec as VLLMKVCacheGroupSpec
from kvcheck.conformance.laws import eagle_drop_groups
from kvcheck.conformance.protocol import (
    ATTENTION_KINDS,
    MAMBA_CACHE_MODES,
    KVCacheGroupSpec,
    KVCacheSpec,
    UnsupportedSpec,
)
from kvcheck.errors import KVCheckInputError

__all__ = ["HAS_ADMISSION_GATES", "HAS_BLOCK_ZEROING", "HAS_EAGLE_GROUPS", "HAS_HASH_LOOKAHEAD",
           "HAS_PREFILL_LOOKAHEAD", "HAS_SHARED_PREFIX_CHECKPOINT", "LEGACY_HYBRID", "VLLMCache",
           "block_sizes", "make_vllm_cache", "unsupported_reason"]

#: True for releases whose ``KVCacheManager`` has no ``hash_block_size`` (0.10.x): one block
#: size with caching, the one-full-one-other hybrid coordinator, the KV-event null-parent bug.
LEGACY_HYBRID: bool = "hash_block_size" not in MANAGER_PARAMS
#: vLLM 0.33's multi-module MTP argument (``KVCacheManager(num_prefill_lookahead=K)``).
HAS_PREFILL_LOOKAHEAD: bool = "num_prefill_lookahead" in MANAGER_PARAMS
#: vLLM 0.33's hash lookahead (``KVCacheManager(num_hash_lookahead_tokens=L)``).
HAS_HASH_LOOKAHEAD: bool = "num_hash_lookahead_tokens" in MANAGER_PARAMS
#: vLLM 0.33's admission gates (``KVCacheManager(watermark, max_in_flight_tokens)``,
#: ``allocate_slots(..., full_sequence_must_fit, reserved_blocks, has_scheduled_reqs)``).
HAS_ADMISSION_GATES: bool = "watermark" in MANAGER_PARAMS
#: vLLM 0.33's Mamba shared-prefix checkpoint
#: (``KVCacheManager(enable_mamba_shared_prefix_checkpoint=True)``).
HAS_SHARED_PREFIX_CHECKPOINT: bool = "enable_mamba_shared_prefix_checkpoint" in MANAGER_PARAMS
#: vLLM 0.33's MambaSpec has prefill checkpoint blocks (0.10.2's has not).
HAS_MAMBA_CHECKPOINTS: bool = "num_prefill_checkpoint_blocks" in getattr(
    MambaSpec, "__dataclass_fields__", {})
#: vLLM 0.33's per-group EAGLE flag (``KVCacheGroupSpec.is_eagle_group``; 0.10.2 has none).
HAS_EAGLE_GROUPS: bool = "is_eagle_group" in getattr(
    VLLMKVCacheGroupSpec, "__dataclass_fields__", {})
#: vLLM 0.33's worker-side block zeroing (``KVCacheConfig.needs_kv_cache_zeroing``, the
#: manager's ``take_new_block_ids``; 0.10.2 has neither).
HAS_BLOCK_ZEROING: bool = hasattr(KVCacheConfig, "needs_kv_cache_zeroing")
# max_model_len when the spec sets none: far above anything a pool in the suite can hold.
_UNCAPPED_MODEL_LEN = 1 << 20


# ------------------------------------------------------------------------------ translation
class _VllmAttentionSpec(Protocol):
    """What the adapter reads of a vLLM attention ``KVCacheSpec``."""

    @property
    def block_size(self) -> int: ...


class _VllmGroup(Protocol):
    """What the adapter reads of a vLLM ``KVCacheGroupSpec``."""

    @property
    def kv_cache_spec(self) -> _VllmAttentionSpec: ...


def _check_group(where: str, group: KVCacheGroupSpec, block_size: int) -> None:
    """``KVCheckInputError`` for a group no model could have."""
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
    if group.kind == "mamba" and (group.mamba_cache_mode or "none") not in MAMBA_CACHE_MODES:
        raise KVCheckInputError(f"{where}: a mamba group's mamba_cache_mode must be one of "
                                f"{MAMBA_CACHE_MODES} or None, got {group.mamba_cache_mode!r}")


def _attention_spec(group: KVCacheGroupSpec, block_size: int,
                    extra_retained_tokens: int = 0) -> _VllmAttentionSpec:
    """vLLM's spec for one group (dummy heads and dtype); a sliding window keeps
    ``extra_retained_tokens`` more below it (vLLM 0.33's multi-module MTP, set as its
    ``kv_cache_planning`` sets it: ``num_prefill_lookahead - 1`` on every window)."""
    common: dict[str, object] = {"block_size": block_size, "num_kv_heads": 1, "head_size": 1,
                              "dtype": torch.float32, "use_mla": False}
    if group.kind == "sliding_window":
        cls: Callable[..., _VllmAttentionSpec] = SlidingWindowSpec
        common["sliding_window"] = group.sliding_window
        if extra_retained_tokens:  # only 0.33 has the field (0.10.2 refuses the lookahead)
            common["extra_retained_tokens"] = extra_retained_tokens
    elif group.kind == "chunked_local_attention":
        cls = ChunkedLocalAttentionSpec
        common["attention_chunk_size"] = group.attention_chunk_size
    elif group.kind == "cross_attention":
        cls = CrossAttentionSpec
    elif group.kind == "mamba":
        # Dummy state shapes and dtypes (the manager never reads the page layout); 0.10.2's
        # MambaSpec has no mamba_cache_mode (``accepting`` drops it there).
        mamba: Callable[..., _VllmAttentionSpec] = MambaSpec
        return mamba(**accepting(
            MambaSpec, block_size=block_size, shapes=((2, 3),), dtypes=(torch.float32,),
            mamba_cache_mode=group.mamba_cache_mode or "none",
            num_speculative_blocks=group.num_speculative_blocks,
            num_prefill_checkpoint_blocks=group.num_prefill_checkpoint_blocks,
            prefill_checkpoint_alignment=group.prefill_checkpoint_alignment))
    else:
        cls = FullAttentionSpec
    return cls(**accepting(cls, **common))


def _group_sizes(spec: KVCacheSpec) -> list[int]:
    """The groups' own (per-rank) block sizes: vLLM's specs hold them, its managers scale
    them by the DCP world size."""
    return [spec.group_spec_block_size(i) for i in range(len(spec.groups))]


def _effective_sizes(spec: KVCacheSpec) -> list[int]:
    """Tokens per block of each group's manager (DCP-scaled where sharded)."""
    return [spec.group_block_size(i) for i in range(len(spec.groups))]


def _vllm_groups(spec: KVCacheSpec, sizes: Sequence[int]) -> list[_VllmGroup]:
    extra = max(0, spec.num_prefill_lookahead - 1)
    # is_eagle_group only where set (vLLM 0.33's kv_cache_planning flags the groups holding
    # the drafter's layers); 0.10.2's KVCacheGroupSpec has no such field (refused there).
    return [VLLMKVCacheGroupSpec([f"layer.{i}"], _attention_spec(g, s, extra),
                                 **({"is_eagle_group": True} if g.is_eagle_group else {}))
            for i, (g, s) in enumerate(zip(spec.groups, sizes, strict=True))]


def _vllm_config(spec: KVCacheSpec, groups: Sequence[_VllmGroup]) -> SimpleNamespace:
    """The few ``VllmConfig`` fields vLLM's block-size resolution reads (no connector; the
    spec's DCP world size and ``prefix_match_unit``, as the engine's ``CacheConfig`` and
    ``ParallelConfig`` hold them)."""
    first = groups[0].kv_cache_spec.block_size
    return SimpleNamespace(
        cache_config=SimpleNamespace(block_size=first,
                                     enable_prefix_caching=spec.enable_caching,
                                     prefix_match_unit=spec.prefix_match_unit),
        parallel_config=SimpleNamespace(decode_context_parallel_size=spec.dcp_world_size),
        kv_transfer_config=None)


def block_sizes(spec: KVCacheSpec) -> tuple[int, int]:
    """``(scheduler_block_size, hash_block_size)`` for ``spec`` on this release.

    0.33: vLLM's ``resolve_kv_cache_block_sizes`` on the translated groups. 0.10.x has neither
    (one hash size: the common block size, DCP-scaled as its scheduler hashes
    (``scheduler.py:103-108``); ``spec.block_size`` (times the DCP world size) when sizes
    differ, which only caching off allows, where hashes are unused).

    Raises:
        UnsupportedSpec: a ``prefix_match_unit`` vLLM rejects (its ValueError).
    """
    sizes = _group_sizes(spec)
    if LEGACY_HYBRID:
        # The scheduler hashes at cache_config.block_size * dcp (scheduler.py:103-108).
        scaled = _effective_sizes(spec)
        size = scaled[0] if len(set(scaled)) == 1 else spec.block_size * spec.dcp_world_size
        return size, size
    from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes

    groups = _vllm_groups(spec, sizes)
    config = KVCacheConfig(num_blocks=spec.num_blocks, kv_cache_tensors=[],
                           kv_cache_groups=groups)
    try:
        scheduler, hashed = resolve_kv_cache_block_sizes(config, _vllm_config(spec, groups))
    except ValueError as exc:  # prefix_match_unit (vLLM's engine core fails to start)
        raise UnsupportedSpec(f"vLLM {VERSION}'s resolve_kv_cache_block_sizes raises "
                              f"ValueError: {exc}") from exc
    return int(scheduler), int(hashed)


def unsupported_reason(spec: KVCacheSpec) -> str | None:
    """Why the installed vLLM refuses ``spec``'s groups (a sentence naming the release and
    its rule), or None when it takes them."""
    groups = spec.groups
    lookahead = _hash_lookahead_reason(spec)
    if lookahead is not None:
        return lookahead
    if spec.enable_caching and any(g.kind == "cross_attention" for g in groups):
        return (f"vLLM {VERSION} runs encoder-decoder models (a cross_attention group) with "
                "prefix caching off, and its CrossAttentionManager raises "
                "NotImplementedError on a cache lookup: use enable_caching=False")
    if not HAS_EAGLE_GROUPS and any(g.is_eagle_group for g in groups):
        return (f"vLLM {VERSION}'s KVCacheGroupSpec has no is_eagle_group (vLLM 0.33's "
                "per-group EAGLE flag; every group drops with use_eagle): leave "
                "is_eagle_group=False")
    mamba = _mamba_reason(spec, groups)
    if mamba is not None:
        return mamba
    if spec.mamba_shared_prefix_checkpoint and not HAS_SHARED_PREFIX_CHECKPOINT:
        return (f"vLLM {VERSION}'s KVCacheManager has no enable_mamba_shared_prefix_checkpoint "
                "(vLLM 0.33's Mamba shared-prefix checkpoint): leave "
                "mamba_shared_prefix_checkpoint=False")
    if spec.needs_kv_cache_zeroing and not HAS_BLOCK_ZEROING:
        return (f"vLLM {VERSION}'s KVCacheConfig has no needs_kv_cache_zeroing (vLLM 0.33's "
                "worker-side block zeroing): leave needs_kv_cache_zeroing=False")
    if (spec.watermark or spec.max_in_flight_tokens is not None) and not HAS_ADMISSION_GATES:
        return (f"vLLM {VERSION}'s KVCacheManager has no watermark / max_in_flight_tokens "
                "(vLLM 0.33's admission gates): leave them at 0.0 / None")
    if spec.num_prefill_lookahead and not HAS_PREFILL_LOOKAHEAD:
        return (f"vLLM {VERSION}'s KVCacheManager has no num_prefill_lookahead (vLLM 0.33's "
                "multi-module MTP): use num_prefill_lookahead=0")
    if (spec.enable_caching and spec.num_prefill_lookahead > 1 and spec.use_eagle
            and len(groups) > 1
            and any(g.kind == "mamba" and g.mamba_cache_mode == "align" for g in groups)):
        # One Mamba group alone keys whole blocks only, which hold their state: vLLM runs it
        # right (replayed with kvcheck's laws; conformance/mtp_golden.py).
        return (f"vLLM {VERSION} caches the last num_prefill_lookahead - 1 computed tokens of "
                "EAGLE's groups later and then keys a Mamba 'align' state for fewer tokens "
                "than its block holds (a stale state): use num_prefill_lookahead <= 1 beside "
                "a Mamba 'align' group with use_eagle and caching on")
    dropping = eagle_drop_groups(spec) if spec.enable_caching else frozenset()
    chunked = [i for i in sorted(dropping) if groups[i].kind == "chunked_local_attention"]
    if chunked:
        # Only a chunked group whose hits drop EAGLE's block (flagged, of a flagged group's
        # spec, or every group when none is flagged) reaches the assertion; vLLM 0.33 runs an
        # unflagged one beside a flagged group of another spec.
        return (f"vLLM {VERSION}'s ChunkedLocalAttentionManager asserts 'Hybrid KV cache is "
                "not supported for eagle + chunked local attention' on a cache lookup (group "
                f"{chunked[0]} drops EAGLE's block): flag only groups of another spec "
                "is_eagle_group (vLLM 0.33), or use use_eagle=False or enable_caching=False")
    if spec.use_eagle and spec.enable_caching and any(
            g.kind == "mamba" and g.num_prefill_checkpoint_blocks for g in groups):
        return (f"vLLM {VERSION} fails 'assert block_idx < len(req_blocks)' in "
                "MambaManager._apply_cow once a request hits a Mamba prefill checkpoint that "
                "EAGLE keyed below its table index: use use_eagle=False or "
                "num_prefill_checkpoint_blocks=0")
    dcp = _dcp_reason(spec, groups)
    if dcp is not None:
        return dcp
    if LEGACY_HYBRID:
        if spec.prefix_match_unit is not None:
            return (f"vLLM {VERSION} has no prefix_match_unit (a vLLM 0.33 CacheConfig "
                    "field; hashes are at the block size)")
        return _legacy_reason(spec, groups, _effective_sizes(spec))
    if not spec.enable_caching:
        return None
    sizes = _effective_sizes(spec)
    scheduler = math.lcm(*sizes)
    for i, (group, size) in enumerate(zip(groups, sizes, strict=True)):
        if group.kind == "chunked_local_attention" and size != scheduler:
            return (f"vLLM {VERSION}'s ChunkedLocalAttentionManager asserts that its block "
                    f"size equals the cache-hit alignment (the scheduler block size, "
                    f"lcm{tuple(sizes)} = {scheduler}); group {i} has block size {size}")
    return None


def _hash_lookahead_reason(spec: KVCacheSpec) -> str | None:
    """Why ``spec.num_hash_lookahead_tokens`` cannot run here: a release without hash
    lookahead, or a combination vLLM's config and scheduler never make (caching off: lookahead
    is 0 then; ``use_eagle``: the scheduler clears it when it hashes with lookahead)."""
    lookahead = spec.num_hash_lookahead_tokens
    if not lookahead:
        return None
    if not HAS_HASH_LOOKAHEAD:
        return (f"vLLM {VERSION} has no hash lookahead (its KVCacheManager takes no "
                f"num_hash_lookahead_tokens): num_hash_lookahead_tokens={lookahead} needs "
                "vLLM 0.33")
    if not spec.enable_caching:
        return (f"num_hash_lookahead_tokens={lookahead} with enable_caching=False: vLLM "
                f"{VERSION}'s config turns hash lookahead off without prefix caching")
    if spec.use_eagle:
        return (f"num_hash_lookahead_tokens={lookahead} with use_eagle=True: vLLM {VERSION}'s "
                "scheduler passes use_eagle=False whenever it hashes with lookahead")
    if lookahead > 1 and not any(g.kind == "full_attention" for g in spec.groups):
        return (f"num_hash_lookahead_tokens={lookahead} with prefix caching on and no "
                f"full-attention group: vLLM {VERSION}'s coordinators search the first group "
                "up to num_tokens - 1 tokens, past the request's last lookahead hash, and a "
                "sliding-window, chunked-local or Mamba find_longest_cache_hit indexes the "
                "missing hashes (IndexError); use num_hash_lookahead_tokens <= 1 or a "
                "full-attention group")
    return None


def _dcp_reason(spec: KVCacheSpec, groups: Sequence[KVCacheGroupSpec]) -> str | None:
    """Why this release refuses a layout under DCP: the assertion vLLM's sliding-window and
    chunked-local managers raise at their first cache lookup (``find_longest_cache_hit``),
    taken before the manager is built (the constructor's own DCP assertions are caught as
    they happen, ``make_vllm_cache``)."""
    if spec.dcp_world_size == 1 or not spec.enable_caching:
        return None
    if len(groups) > 1:
        if LEGACY_HYBRID:
            return (f"vLLM {VERSION}'s KVCacheManager asserts one KV-cache group with DCP and "
                    "prefix caching on (kv_cache_manager.py:113-114; its hybrid coordinator: "
                    "'DCP not support hybrid attn now.')")
        return None  # 0.33's HybridKVCacheCoordinator asserts its own rule when built
    kind = groups[0].kind
    if kind in ("sliding_window", "chunked_local_attention"):
        rule = "sliding window" if kind == "sliding_window" else "chunked local"
        return (f"vLLM {VERSION}'s manager asserts 'DCP not support {rule} attn now.' at its "
                f"first cache lookup (dcp_world_size={spec.dcp_world_size}, prefix caching on)")
    return None


def _mamba_reason(spec: KVCacheSpec, groups: Sequence[KVCacheGroupSpec]) -> str | None:
    """Why this release refuses a layout with a ``mamba`` group (None: it takes it)."""
    mamba = [g for g in groups if g.kind == "mamba"]
    if not mamba:
        return None
    if not HAS_MAMBA_CHECKPOINTS and any(
            g.num_prefill_checkpoint_blocks or g.prefill_checkpoint_alignment is not None
            for g in mamba):
        return (f"vLLM {VERSION}'s MambaSpec has no num_prefill_checkpoint_blocks / "
                "prefill_checkpoint_alignment (no Mamba prefill checkpoints): leave them at 0 "
                "and None")
    if LEGACY_HYBRID:
        if any((g.mamba_cache_mode or "none") != "none" for g in mamba):
            return (f"vLLM {VERSION}'s MambaSpec has no mamba_cache_mode (no Mamba prefix "
                    "caching: its behaviour is mode 'none')")
        if spec.enable_caching:
            return (f"vLLM {VERSION} does not support prefix caching with Mamba layers "
                    "(gpu_model_runner raises NotImplementedError('Prefix caching is not "
                    "supported for Mamba yet.'), and MambaModelConfig turns it off): use "
                    "enable_caching=False")
        return None
    if spec.enable_caching and any((g.mamba_cache_mode or "none") != "align" for g in mamba):
        return (f"vLLM {VERSION}'s MambaManager asserts 'Mamba prefix caching requires "
                "mamba_cache_mode='align'' (its config sets 'align' when prefix caching is "
                "on): use mamba_cache_mode='align' or enable_caching=False")
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


def _check_groups(spec: KVCacheSpec) -> None:
    for i, (group, size) in enumerate(zip(spec.groups, _group_sizes(spec), strict=True)):
        _check_group(f"kv_cache_groups[{i}]" if spec.kv_cache_groups else "spec", group, size)


def _kv_cache_config(spec: KVCacheSpec, scheduler: int, hashed: int) -> object:
    """vLLM's ``KVCacheConfig`` for ``spec``'s groups at these block sizes."""
    extra: dict[str, object] = {}
    if not LEGACY_HYBRID:
        extra = accepting(
            KVCacheConfig, prefix_cache_retention_interval=spec.prefix_cache_retention_interval,
            hash_block_size=hashed, cache_hit_alignment_tokens=scheduler)
    # vLLM derives needs_kv_cache_zeroing (a property) from Mamba layers or a mixed-precision
    # cache, which kvcheck's specs do not describe: a spec asking for zeroing gets it from a
    # subclass whose attribute shadows the property (read once, by the coordinator).
    config_cls = _ZeroingKVCacheConfig if spec.needs_kv_cache_zeroing else KVCacheConfig
    return config_cls(num_blocks=spec.num_blocks, kv_cache_tensors=[],
                      kv_cache_groups=_vllm_groups(spec, _group_sizes(spec)), **extra)


class _ZeroingKVCacheConfig(KVCacheConfig):  # type: ignore[misc]
    """vLLM's ``KVCacheConfig`` with ``needs_kv_cache_zeroing`` True whatever the layout
    (only built where the release has the property: ``unsupported_reason``)."""

    needs_kv_cache_zeroing = True


# ------------------------------------------------------------------------------ the manager
class VLLMCache(NamedTuple):
    """vLLM's ``KVCacheManager`` for a spec, with the block sizes it was built with."""

    manager: Any  # Any: vLLM's KVCacheManager (untyped here: vLLM is imported at run time)
    scheduler_block_size: int
    hash_block_size: int


def make_vllm_cache(spec: KVCacheSpec) -> VLLMCache:
    """vLLM's ``KVCacheManager`` for ``spec`` with the arguments this release accepts (the
    ``KVCacheConfig`` above, ``max_model_len``, the block sizes, caching and events).

    Raises:
        UnsupportedSpec: this release refuses the spec's groups (``unsupported_reason``, or an
            ``AssertionError`` of vLLM's own constructor the checks missed).
        KVCheckInputError: a malformed group; DCP or ``prefix_match_unit`` without
            ``kv_cache_groups`` (``check_knobs_grouped``).
    """
    check_knobs_grouped(spec)
    reason = unsupported_reason(spec)
    if reason is not None:
        raise UnsupportedSpec(reason)
    _check_groups(spec)
    scheduler, hashed = block_sizes(spec)
    config = _kv_cache_config(spec, scheduler, hashed)
    try:
        manager = KVCacheManager(**accepting(
            KVCacheManager.__init__,
            kv_cache_config=config,
            max_model_len=spec.max_model_len or _UNCAPPED_MODEL_LEN,
            scheduler_block_size=scheduler, hash_block_size=hashed,
            enable_caching=spec.enable_caching, log_stats=False,
            dcp_world_size=spec.dcp_world_size,
            enable_kv_cache_events=spec.enable_kv_cache_events, use_eagle=spec.use_eagle,
            **({"num_prefill_lookahead": spec.num_prefill_lookahead}
               if spec.num_prefill_lookahead else {}),
            **({"num_hash_lookahead_tokens": spec.num_hash_lookahead_tokens}
               if spec.num_hash_lookahead_tokens else {}),
            # vLLM 0.33's admission gates, only when set (0.10.2 has neither).
            **({"watermark": spec.watermark} if spec.watermark else {}),
            **({"max_in_flight_tokens": spec.max_in_flight_tokens}
               if spec.max_in_flight_tokens is not None else {}),
            # vLLM 0.33's Mamba shared-prefix checkpoint, only when set (0.10.2 has none);
            # vLLM narrows it off itself where it does not apply.
            **({"enable_mamba_shared_prefix_checkpoint": True}
               if spec.mamba_shared_prefix_checkpoint else {})))
    except AssertionError as exc:  # a rule of this release the checks above missed
        raise UnsupportedSpec(f"vLLM {VERSION} refuses these KV-cache groups: "
                              f"AssertionError: {exc}") from exc
    except ValueError as exc:  # 0.33: multi-module MTP past the scheduler block with EAGLE
        raise UnsupportedSpec(f"vLLM {VERSION}'s KVCacheManager raises ValueError: {exc}"
                              ) from exc
    return VLLMCache(manager, scheduler, hashed)
