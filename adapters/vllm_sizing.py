"""The installed vLLM's own KV-cache sizing behind ``kvcheck.conformance.sizing_protocol``.

Every answer is computed by vLLM's code, never re-derived here:

* page sizes: the ``KVCacheSpec`` classes' ``page_size_bytes`` (``v1/kv_cache_interface.py``);
* groups, num_blocks and tensors: vLLM 0.10.x ``v1/core/kv_cache_utils.py``
  (``_get_kv_cache_config_uniform_type`` / ``_get_kv_cache_config_uniform_page_size``, the
  dispatch of ``get_kv_cache_config``); vLLM 0.33 ``v1/core/kv_cache_planning.py``
  (``_get_kv_cache_groups_uniform_spec`` / ``_get_kv_cache_groups_uniform_page_size`` then
  ``get_kv_cache_config_from_groups`` with the layer-outer ``LBNHC`` layout; the other
  branches of ``get_kv_cache_groups`` (``UniformTypeKVCacheSpecs``, packed groups,
  page-size unification) are declined with ``UnsupportedSpec``). 0.33's
  per-group ``KVCacheTensor(size, layers, layer_stride, offset)`` are turned into the
  protocol's ``shared_by`` tensors by the byte regions the layers occupy;
* view shapes: 0.10.x ``FlashAttentionBackend.get_kv_cache_shape`` permuted by its
  ``get_kv_cache_stride_order`` (MLA: ``MLACommonBackend``); 0.33
  ``compute_layer_kv_cache_shape_bytes`` permuted by ``KVCacheLayout.layer_view_order``;
* block sizes: 0.33 ``resolve_kv_cache_block_sizes``.

The engine's configuration objects are replaced by namespaces holding only the fields these
functions read (DCP 1, no KV connector, hybrid KV-cache manager on). A profile other than
the installed release's, or a feature the release lacks (0.10.x: ``head_size_v``, attention
``page_size_padded``, ``resolve_kv_cache_block_sizes``), raises ``UnsupportedSpec``.
Importing this module imports vLLM (and torch).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType, SimpleNamespace
from typing import Any, Protocol

if importlib.util.find_spec("vllm") is None:
    raise ImportError("vLLM is not installed in this environment; build one with "
                      "scripts/vllm-cpu-env.sh VERSION DIR (kvcheck.adapters.vllm_sizing "
                      "computes KV-cache sizes with vLLM's own code)")

import torch  # only once vLLM is known to be there

from kvcheck.conformance.protocol import UnsupportedSpec
from kvcheck.conformance.sizing_protocol import (
    KVCacheTensorPlan,
    KVSizingPlan,
    LayerKVSpec,
)
from kvcheck.errors import KVCheckInputError

kvi = importlib.import_module("vllm.v1.kv_cache_interface")
try:
    _planning: ModuleType | None = importlib.import_module("vllm.v1.core.kv_cache_planning")
except ImportError:
    _planning = None
_utils = importlib.import_module("vllm.v1.core.kv_cache_utils")


class VllmKVCacheSpec(Protocol):
    """What kvcheck reads of a vLLM ``KVCacheSpec`` (the rest goes to vLLM's functions)."""

    @property
    def page_size_bytes(self) -> int: ...


class VllmKVCacheTensor(Protocol):
    """What kvcheck reads of a vLLM 0.33 per-group KV-cache tensor."""

    @property
    def layers(self) -> Sequence[str]: ...
    @property
    def offset(self) -> int: ...
    @property
    def layer_stride(self) -> int: ...

__all__ = ["SIZING_PROFILE", "kv_block_sizes", "kv_cache_view_shape", "kv_page_size_bytes",
           "kv_sizing_plan", "vllm_spec"]

#: The profile whose sizing the installed vLLM computes ("vllm-0.33": the planning module
#: and ``AttentionSpec.head_size_v``; "vllm-0.10": ``AttentionSpec.use_mla``).
#: None: a release between the two (neither), whose sizing code kvcheck does not drive.
_HAS_USE_MLA = "use_mla" in getattr(kvi.AttentionSpec, "__dataclass_fields__", {})
SIZING_PROFILE: str | None = ("vllm-0.33" if _planning is not None
                              else "vllm-0.10" if _HAS_USE_MLA else None)
_OLD = SIZING_PROFILE == "vllm-0.10"
_MAX_MODEL_LEN = 4096  # read only by vLLM's log lines (max concurrency)


def _check_profile(profile: str) -> None:
    wanted = "vllm-0.33" if profile == "generic" else profile
    if SIZING_PROFILE is None:
        raise UnsupportedSpec("this vLLM release has neither 0.10.x's nor 0.33's KV-cache "
                              "sizing code (kv_cache_utils with use_mla / kv_cache_planning)")
    if wanted != SIZING_PROFILE:
        raise UnsupportedSpec(f"the installed vLLM sizes KV caches as {SIZING_PROFILE}, "
                              f"not {profile}")


def _dtype(name: str) -> torch.dtype:
    value = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise KVCheckInputError(f"unknown dtype {name!r}: use a torch dtype name")
    return value


def vllm_spec(spec: LayerKVSpec) -> VllmKVCacheSpec:
    """The installed vLLM's ``KVCacheSpec`` object for ``spec``.

    Raises:
        UnsupportedSpec: a field or kind the installed release does not have.
        KVCheckInputError: vLLM rejects the spec (its assertion, as a ValueError).
    """
    if not spec.prefix_cacheable:
        raise UnsupportedSpec("prefix_cacheable=False belongs to spec classes kvcheck does not "
                              "model (0.33 CircularBufferSpec...); vLLM's kinds here are all "
                              "prefix-cacheable")
    if spec.kind == "mamba":
        kwargs: dict[str, object] = {"block_size": spec.block_size, "shapes": spec.shapes,
                                  "dtypes": tuple(_dtype(d) for d in spec.dtypes),
                                  "page_size_padded": spec.page_size_padded}
        if not _OLD:
            kwargs["mamba_cache_mode"] = spec.mamba_cache_mode
        return _build(kvi.MambaSpec, kwargs)
    common: dict[str, object] = {"block_size": spec.block_size, "num_kv_heads": spec.num_kv_heads,
                              "head_size": spec.head_size, "dtype": _dtype(spec.dtype)}
    if _OLD:
        if spec.head_size_v not in (None, spec.head_size):
            raise UnsupportedSpec("vLLM 0.10.x AttentionSpec has no head_size_v")
        if spec.page_size_padded is not None:
            raise UnsupportedSpec("vLLM 0.10.x AttentionSpec has no page_size_padded")
        common["use_mla"] = spec.kind == "mla_attention"
    else:
        if spec.head_size_v is not None and spec.kind != "mla_attention":
            common["head_size_v"] = spec.head_size_v
        common["page_size_padded"] = spec.page_size_padded
    classes: dict[str, tuple[Callable[..., VllmKVCacheSpec], dict[str, object]]] = {
        "full_attention": (kvi.FullAttentionSpec, {}),
        "sliding_window": (kvi.SlidingWindowSpec, {"sliding_window": spec.sliding_window}),
        "chunked_local_attention": (kvi.ChunkedLocalAttentionSpec,
                                    {"attention_chunk_size": spec.attention_chunk_size}),
        "mla_attention": (kvi.FullAttentionSpec if _OLD else kvi.MLAAttentionSpec, {}),
    }
    if spec.kind not in classes:
        raise KVCheckInputError(f"unknown spec kind {spec.kind!r}")
    cls, extra = classes[spec.kind]
    return _build(cls, {**common, **extra})


def _build(cls: Callable[..., VllmKVCacheSpec], kwargs: dict[str, object]) -> VllmKVCacheSpec:
    try:
        return cls(**kwargs)
    except (AssertionError, TypeError) as exc:
        raise KVCheckInputError(f"vLLM's {getattr(cls, '__name__', cls)} rejects "
                                f"{kwargs}: {exc}") from None


def _page_size(vspec: VllmKVCacheSpec) -> int:
    try:
        return int(vspec.page_size_bytes)
    except AssertionError as exc:  # page_size_padded below the page
        raise KVCheckInputError(f"vLLM's page_size_bytes assertion failed for {vspec}: "
                                f"{exc or 'page_size_padded is smaller than the page'}") from None


def kv_page_size_bytes(spec: LayerKVSpec, profile: str) -> int:
    """``KVCacheSpec.page_size_bytes`` of the installed vLLM."""
    _check_profile(profile)
    return _page_size(vllm_spec(spec))


def _config(num_gpu_blocks_override: int | None, block_size: int) -> SimpleNamespace:
    """The fields of ``VllmConfig`` the sizing functions read."""
    if not _OLD:
        from vllm.v1.kv_cache_layout import KVCacheLayout  # 0.33 only

        return SimpleNamespace(
            attention_config=SimpleNamespace(hisparse_config=None),
            cache_config=SimpleNamespace(
                get_resolved_kv_cache_layout=lambda: KVCacheLayout.LBNHC,
                num_gpu_blocks_override=num_gpu_blocks_override,
                prefix_cache_retention_interval=None, block_size=block_size))
    return SimpleNamespace(
        cache_config=SimpleNamespace(num_gpu_blocks_override=num_gpu_blocks_override,
                                     block_size=block_size),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
        model_config=SimpleNamespace(max_model_len=_MAX_MODEL_LEN),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=2048,
                                         disable_hybrid_kv_cache_manager=False),
    )


def _non_uniform(specs: Mapping[str, VllmKVCacheSpec]) -> None:
    sizes: dict[int, list[str]] = {}
    for name, vspec in specs.items():
        sizes.setdefault(_page_size(vspec), []).append(name)
    if len(sizes) > 1:
        detail = "; ".join(f"{size} B: {', '.join(names)}" for size, names in sizes.items())
        raise KVCheckInputError(f"KV-cache page sizes are not uniform across layers "
                                f"({detail})")


def kv_sizing_plan(layers: Mapping[str, LayerKVSpec], available_memory: int, profile: str,
                   num_gpu_blocks_override: int | None = None) -> KVSizingPlan:
    """Groups, num_blocks and tensors as the installed vLLM computes them."""
    _check_profile(profile)
    if not layers:
        raise KVCheckInputError("no layers")
    specs = {name: vllm_spec(s) for name, s in layers.items()}
    _non_uniform(specs)
    page = _page_size(next(iter(specs.values())))
    config = _config(num_gpu_blocks_override, next(iter(layers.values())).block_size)
    if _OLD:
        if _utils.is_kv_cache_type_uniform(specs):
            cfg = _utils._get_kv_cache_config_uniform_type(config, specs, available_memory)
        else:
            cfg = _utils._get_kv_cache_config_uniform_page_size(config, specs,
                                                                 available_memory)
        groups = tuple(tuple(g.layer_names) for g in cfg.kv_cache_groups)
        tensors = tuple(KVCacheTensorPlan(int(t.size), tuple(t.shared_by))
                        for t in cfg.kv_cache_tensors)
        return KVSizingPlan(groups, page, len(tensors), int(cfg.num_blocks), tensors)
    planning = _planning
    # _check_profile passed: the installed vLLM sizes as 0.33, which has the planning module.
    assert planning is not None
    if planning.is_kv_cache_spec_uniform(specs):
        vgroups = planning._get_kv_cache_groups_uniform_spec(specs)
    elif kvi.UniformTypeKVCacheSpecs.from_specs(specs) is not None:
        raise UnsupportedSpec("vLLM 0.33 keeps these layers (one type, different specs) in "
                              "one UniformTypeKVCacheSpecs group; the protocol models the "
                              "uniform-page-size grouping only")
    else:
        vgroups = planning._get_kv_cache_groups_uniform_page_size(specs)
    cfg = planning.get_kv_cache_config_from_groups(config, vgroups, available_memory)
    groups = tuple(tuple(g.layer_names) for g in cfg.kv_cache_groups)
    num_blocks = int(cfg.num_blocks)
    return KVSizingPlan(groups, page, max(len(g) for g in groups), num_blocks,
                        _shared_regions(cfg.kv_cache_tensors, groups, page * num_blocks))


def _shared_regions(tensors: Sequence[VllmKVCacheTensor], groups: tuple[tuple[str, ...], ...],
                    region: int) -> tuple[KVCacheTensorPlan, ...]:
    """0.33's per-group tensors as ``shared_by`` tensors: layer ``k`` of a tensor occupies
    ``[offset + k * layer_stride, + region)`` of the aliased allocation; layers at the same
    start share. Ordered by start, layers by group order."""
    start_of: dict[str, int] = {}
    for tensor in tensors:
        for k, name in enumerate(tensor.layers):
            # With no blocks every region is empty (stride 0): the position names it.
            start_of[name] = (int(tensor.offset) + k * int(tensor.layer_stride) if region
                              else k)
    by_start: dict[int, list[str]] = {}
    for group in groups:
        for name in group:
            by_start.setdefault(start_of[name], []).append(name)
    return tuple(KVCacheTensorPlan(region, tuple(by_start[s])) for s in sorted(by_start))


def kv_cache_view_shape(spec: LayerKVSpec, num_blocks: int, layout: str,
                        profile: str) -> tuple[int, ...]:
    """One layer's view shape in memory order, from vLLM's backends / layout code."""
    _check_profile(profile)
    if layout not in ("NHD", "HND"):
        raise KVCheckInputError(f"layout={layout!r}: use 'NHD' or 'HND'")
    if spec.kind == "mamba":
        raise KVCheckInputError("a Mamba spec has no attention KV view")
    vspec = vllm_spec(spec)
    if not _OLD:
        from vllm.v1.kv_cache_layout import KVCacheLayout

        shape = kvi.compute_layer_kv_cache_shape_bytes(vspec, num_blocks)
        order = (KVCacheLayout.LBNHC if layout == "NHD" else KVCacheLayout.LBHNC
                 ).layer_view_order
        return tuple(int(shape[i]) for i in order)
    if spec.kind == "mla_attention":
        mla = importlib.import_module("vllm.v1.attention.backends.mla.common")
        return tuple(mla.MLACommonBackend.get_kv_cache_shape(
            num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size))
    # Any: vLLM's module, whose get_kv_cache_layout is swapped below (a module attribute
    # assigned, which ModuleType does not type).
    fa: Any = importlib.import_module("vllm.v1.attention.backends.flash_attn")
    shape = fa.FlashAttentionBackend.get_kv_cache_shape(
        num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size)
    saved = fa.get_kv_cache_layout
    fa.get_kv_cache_layout = lambda: layout
    try:
        order = fa.FlashAttentionBackend.get_kv_cache_stride_order()
    finally:
        fa.get_kv_cache_layout = saved
    return tuple(int(shape[i]) for i in order)


def kv_block_sizes(groups: Sequence[LayerKVSpec], enable_prefix_caching: bool = True,
                   prefix_match_unit: int | None = None,
                   profile: str = "vllm-0.33") -> tuple[int, int]:
    """0.33 ``resolve_kv_cache_block_sizes`` on a ``KVCacheConfig`` with one single-layer
    group per spec (``cache_config.block_size`` = the first group's)."""
    _check_profile(profile)
    if _OLD or not hasattr(_utils, "resolve_kv_cache_block_sizes"):
        raise UnsupportedSpec("this vLLM has no resolve_kv_cache_block_sizes (0.33)")
    if not groups:
        raise KVCheckInputError("no groups")
    vgroups = [kvi.KVCacheGroupSpec([f"layer.{i}"], vllm_spec(g))
               for i, g in enumerate(groups)]
    cfg = kvi.KVCacheConfig(num_blocks=1, kv_cache_tensors=[], kv_cache_groups=vgroups)
    vllm_config = SimpleNamespace(
        cache_config=SimpleNamespace(block_size=groups[0].block_size,
                                     prefix_match_unit=prefix_match_unit,
                                     enable_prefix_caching=enable_prefix_caching),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
        kv_transfer_config=None)
    scheduler, hashing = _utils.resolve_kv_cache_block_sizes(cfg, vllm_config)
    return int(scheduler), int(hashing)
