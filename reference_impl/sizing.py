"""KV-cache sizing: page sizes, grouping layers into KV-cache groups, num_blocks, the KV
tensor plan, per-layer view shapes and block sizes across groups, as vLLM computes them.

Pure functions of small frozen dataclasses; no torch. Behaviour that differs between vLLM
releases takes a ``profile`` (``"vllm-0.33"``, the default, or ``"vllm-0.10"``;
``"generic"`` is read as ``"vllm-0.33"``):

* ``page_size_bytes`` (0.10.2 ``v1/kv_cache_interface.py:66-71,200-207``; 0.33
  ``:586-602,1121-1130``): attention ``coef * block_size * num_kv_heads * head_size *
  dtype_size`` with ``coef = 1`` for MLA, else 2 (0.10.2); ``num_kv_heads * block_size *
  (head_size + head_size_v) * dtype_size`` with ``head_size_v = head_size`` by default and
  ``0`` for MLA (0.33), ``page_size_padded`` overriding (0.33 attention, both Mamba).
* grouping (0.10.2 ``kv_cache_utils.py:895-1035``; 0.33 ``kv_cache_planning.py:416-557``):
  layers bucketed by spec in insertion order. 0.10.2: ``group_size = min(len(bucket))`` and
  every bucket is cut into consecutive chunks of ``group_size``. 0.33: ``group_size`` is the
  largest bucket when that is under 1.5 x the smallest (else the smallest), and a bucket of
  ``n`` layers becomes ``ceil(n / group_size)`` groups, group ``i`` taking
  ``layers[i::num_groups]``. Only the uniform-page-size path is modelled (0.33's packing of
  mixed page sizes, block-size unification and ``UniformTypeKVCacheSpecs`` groups of one
  type with different shapes are not: see ``is_uniform_type``).
* ``num_blocks`` (0.10.2 ``get_num_blocks`` ``:786-807``; 0.33
  ``get_kv_cache_config_from_groups``): ``available_memory // page_size // group_size``,
  at least 0, then ``num_gpu_blocks_override`` when given.
* tensors: ``group_size`` tensors of ``page_size * num_blocks`` bytes, tensor ``i`` shared by
  the ``i``-th layer of every group that has one (0.33 describes the same aliasing as one
  per-group tensor with a layer stride; the byte regions are identical).
* block sizes (0.33 ``resolve_kv_cache_block_sizes``, ``kv_cache_utils.py:816-918``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from kvcheck.errors import KVCheckInputError
from kvcheck.reference_impl.errors import KVCacheConfigError

__all__ = [
    "DTYPE_SIZES",
    "SPEC_KINDS",
    "KVCacheTensorPlan",
    "KVSizingPlan",
    "LayerKVSpec",
    "Layout",
    "SpecKind",
    "dtype_size",
    "group_layers",
    "is_uniform_type",
    "kv_cache_view_shape",
    "kv_sizing_plan",
    "num_blocks_for",
    "page_size_bytes",
    "resolve_block_sizes",
    "tensor_plan",
    "uniform_page_size",
]

# The spec and plan types below are also the ``sizing`` capability's protocol types:
# ``kvcheck.conformance.sizing_protocol`` re-exports them (the reference may not import
# conformance), so a field is defined once, here, for the reference and every adapter.

#: ``LayerKVSpec.kind`` values, one per vLLM spec class sizing models.
SpecKind = Literal["full_attention", "sliding_window", "chunked_local_attention",
                   "mla_attention", "mamba"]
SPEC_KINDS: tuple[str, ...] = ("full_attention", "sliding_window", "chunked_local_attention",
                               "mla_attention", "mamba")
_ATTENTION_KINDS = frozenset(SPEC_KINDS) - {"mamba"}

#: Bytes per element of the dtype names vLLM's ``get_dtype_size`` sees (torch names).
DTYPE_SIZES: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int32": 4, "int16": 2,
    "int8": 1, "uint8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
}
_PROFILES = ("vllm-0.33", "vllm-0.10", "generic")
#: Memory order of an attention view: tokens before heads (NHD) or heads before tokens (HND).
Layout = Literal["NHD", "HND"]


@dataclass(frozen=True)
class LayerKVSpec:
    """One layer's KV-cache spec (a vLLM ``KVCacheSpec`` reduced to what sizing reads).
    Compared by value: equal specs are one grouping bucket.

    Attributes:
        kind: ``full_attention`` (``FullAttentionSpec``), ``sliding_window``
            (``SlidingWindowSpec``), ``chunked_local_attention``
            (``ChunkedLocalAttentionSpec``), ``mla_attention`` (0.10.2
            ``FullAttentionSpec(use_mla=True)``, 0.33 ``MLAAttentionSpec``), ``mamba``
            (``MambaSpec``).
        block_size: tokens per block (>= 1).
        num_kv_heads, head_size: attention only (>= 1; MLA: 1 head of the latent size).
        dtype: the cache dtype by its torch name (``DTYPE_SIZES``: ``bfloat16``,
            ``float16``, ``float32``...; fp8 caches use a 1-byte dtype such as ``uint8`` or
            ``float8_e4m3fn``).
        head_size_v: 0.33 only: ``AttentionSpec.head_size_v``, the value head size (None:
            ``head_size``; MLA: always 0).
        sliding_window / attention_chunk_size: required by their kinds (tokens, >= 1).
        page_size_padded: bytes per page after padding (Mamba; attention under 0.33 only),
            at least the unpadded page.
        shapes, dtypes: Mamba state tensors' shapes (per block) and dtype names, one dtype
            per shape.
        prefix_cacheable: 0.33 ``KVCacheSpec.prefix_cacheable`` (hash block size).
        mamba_cache_mode: 0.33 ``MambaSpec.mamba_cache_mode`` ("none", "align", "all").
    """

    kind: SpecKind
    block_size: int
    num_kv_heads: int = 0
    head_size: int = 0
    dtype: str = "bfloat16"
    head_size_v: int | None = None
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    page_size_padded: int | None = None
    shapes: tuple[tuple[int, ...], ...] = ()
    dtypes: tuple[str, ...] = ()
    prefix_cacheable: bool = True
    mamba_cache_mode: str = "none"


@dataclass(frozen=True)
class KVCacheTensorPlan:
    """One KV-cache tensor: ``size`` bytes, aliased by every layer in ``shared_by`` (vLLM
    0.10.2 ``KVCacheTensor(size, shared_by)``; 0.33 describes the same byte regions as one
    tensor per group with a layer stride)."""

    size: int
    shared_by: tuple[str, ...]


@dataclass(frozen=True)
class KVSizingPlan:
    """A model's KV-cache configuration on one worker (vLLM's ``KVCacheConfig`` reduced to
    sizing).

    Attributes:
        groups: the KV-cache groups in vLLM's order, each the layer names in group order.
        page_size: bytes of one block of one layer (uniform across layers).
        group_size: layers per group (padding counted): the number of tensors.
        num_blocks: blocks of the one pool every group draws from.
        tensors: ``group_size`` tensors of ``page_size * num_blocks`` bytes; tensor ``i`` is
            shared by the ``i``-th layer of every group that has one.
    """

    groups: tuple[tuple[str, ...], ...]
    page_size: int
    group_size: int
    num_blocks: int
    tensors: tuple[KVCacheTensorPlan, ...]


def _profile(profile: str) -> str:
    if profile not in _PROFILES:
        raise KVCheckInputError(f"unknown profile {profile!r}; use one of {list(_PROFILES)}")
    return "vllm-0.33" if profile == "generic" else profile


def dtype_size(name: str) -> int:
    """Bytes per element of the dtype ``name`` (a torch dtype name, ``torch.`` optional)."""
    key = name.removeprefix("torch.")
    if key not in DTYPE_SIZES:
        raise KVCheckInputError(f"unknown dtype {name!r}; use one of {sorted(DTYPE_SIZES)}")
    return DTYPE_SIZES[key]


def _positive(spec: LayerKVSpec, name: str) -> int:
    value = getattr(spec, name)
    if type(value) is not int or value < 1:
        raise KVCheckInputError(f"{spec.kind} spec: {name}={value!r} must be an int >= 1")
    return value


def _check_spec(spec: LayerKVSpec, profile: str) -> None:
    if spec.kind not in SPEC_KINDS:
        raise KVCheckInputError(f"unknown spec kind {spec.kind!r}; use one of {SPEC_KINDS}")
    _positive(spec, "block_size")
    if spec.page_size_padded is not None:
        _positive(spec, "page_size_padded")
    if spec.kind == "mamba":
        if not spec.shapes or len(spec.shapes) != len(spec.dtypes):
            raise KVCheckInputError(
                f"mamba spec: {len(spec.shapes)} shapes and {len(spec.dtypes)} dtypes; give "
                "one dtype per state shape (at least one)")
        if any(type(d) is not int or d < 0 for shape in spec.shapes for d in shape):
            raise KVCheckInputError(f"mamba spec: shapes {spec.shapes!r} must hold ints >= 0")
        for name in spec.dtypes:
            dtype_size(name)
        return
    _positive(spec, "num_kv_heads")
    _positive(spec, "head_size")
    dtype_size(spec.dtype)
    if spec.kind == "sliding_window":
        _positive(spec, "sliding_window")
    if spec.kind == "chunked_local_attention":
        _positive(spec, "attention_chunk_size")
    if spec.head_size_v is not None:
        if type(spec.head_size_v) is not int or spec.head_size_v < 0:
            raise KVCheckInputError(f"head_size_v={spec.head_size_v!r} must be an int >= 0")
        if profile == "vllm-0.10" and spec.head_size_v != spec.head_size:
            raise KVCheckInputError(
                "head_size_v differing from head_size is a vLLM 0.33 AttentionSpec field; "
                "vLLM 0.10.2 has none (use profile vllm-0.33 or drop head_size_v)")
    if profile == "vllm-0.10" and spec.page_size_padded is not None:
        raise KVCheckInputError("page_size_padded on an attention spec is a vLLM 0.33 field "
                                "(0.10.2 pads Mamba pages only)")


def _unpadded_page_size(spec: LayerKVSpec, profile: str) -> int:
    if spec.kind == "mamba":
        return sum(math.prod(shape) * dtype_size(d)
                   for shape, d in zip(spec.shapes, spec.dtypes, strict=True))
    size = dtype_size(spec.dtype)
    if profile == "vllm-0.10":
        coef = 1 if spec.kind == "mla_attention" else 2
        return coef * spec.block_size * spec.num_kv_heads * spec.head_size * size
    if spec.kind == "mla_attention":
        head_size_v = 0
    else:
        head_size_v = spec.head_size if spec.head_size_v is None else spec.head_size_v
    return spec.num_kv_heads * spec.block_size * (spec.head_size + head_size_v) * size


def page_size_bytes(spec: LayerKVSpec, profile: str = "vllm-0.33") -> int:
    """Bytes one block of one layer takes (vLLM's ``KVCacheSpec.page_size_bytes``).

    Raises:
        KVCheckInputError: a malformed spec, a field the profile's vLLM lacks, or a
            ``page_size_padded`` smaller than the unpadded page (vLLM asserts).
    """
    profile = _profile(profile)
    _check_spec(spec, profile)
    unpadded = _unpadded_page_size(spec, profile)
    if spec.page_size_padded is None:
        return unpadded
    if spec.page_size_padded < unpadded:
        raise KVCheckInputError(f"page_size_padded={spec.page_size_padded} is smaller than "
                                f"the unpadded page ({unpadded} bytes)")
    return spec.page_size_padded


def _check_layers(layers: Mapping[str, LayerKVSpec]) -> None:
    if not layers:
        raise KVCheckInputError("no layers: give at least one layer name -> LayerKVSpec "
                                "(attention-free models have no KV cache to size)")
    bad = [n for n in layers if not isinstance(n, str) or not n]
    if bad:
        raise KVCheckInputError(f"layer names must be non-empty str, got {bad!r}")


def uniform_page_size(layers: Mapping[str, LayerKVSpec], profile: str = "vllm-0.33") -> int:
    """The one page size of every layer.

    Raises:
        KVCheckInputError: the layers' page sizes differ (only the uniform-page-size path
            is modelled; vLLM 0.10.2 raises NotImplementedError there).
    """
    _check_layers(layers)
    sizes: dict[int, list[str]] = {}
    for name, spec in layers.items():
        sizes.setdefault(page_size_bytes(spec, profile), []).append(name)
    if len(sizes) != 1:
        detail = "; ".join(f"{size} B: {', '.join(names)}" for size, names in sizes.items())
        raise KVCheckInputError(
            f"KV-cache page sizes are not uniform across layers ({detail}); every layer "
            "must take the same bytes per block (adjust block_size, heads or dtype, or pad "
            "with page_size_padded)")
    return next(iter(sizes))


def is_uniform_type(layers: Mapping[str, LayerKVSpec]) -> bool:
    """vLLM 0.33's ``UniformTypeKVCacheSpecs.from_specs`` for these kinds: layers whose specs
    differ but share one block size and one "type" (full attention and MLA; sliding window
    with one window; chunked local attention with one chunk size; Mamba), which 0.33 keeps
    in ONE group of per-layer specs instead of bucketing them. False when every spec is
    equal (the one-group path) or there are no layers."""
    specs = list(layers.values())
    if not specs or all(s == specs[0] for s in specs) or len({s.block_size for s in specs}) > 1:
        return False
    kinds = {s.kind for s in specs}
    if kinds <= {"full_attention", "mla_attention"} or kinds == {"mamba"}:
        return True
    if kinds == {"sliding_window"}:
        return len({s.sliding_window for s in specs}) == 1
    if kinds == {"chunked_local_attention"}:
        return len({s.attention_chunk_size for s in specs}) == 1
    return False


def group_layers(layers: Mapping[str, LayerKVSpec],
                 profile: str = "vllm-0.33") -> tuple[tuple[str, ...], ...]:
    """The KV-cache groups, layer names in order (see the module docstring per profile).

    Raises:
        KVCheckInputError: no layers, a malformed spec, page sizes that are not uniform, or
            (0.33) layers of one type with different specs (``is_uniform_type``: vLLM 0.33
            groups them as ``UniformTypeKVCacheSpecs``, which is not modelled).
    """
    profile = _profile(profile)
    uniform_page_size(layers, profile)
    if profile == "vllm-0.33" and is_uniform_type(layers):
        raise KVCheckInputError(
            "vLLM 0.33 keeps layers of one attention type with different specs in one "
            "UniformTypeKVCacheSpecs group (kv_cache_planning.get_kv_cache_groups); kvcheck "
            "models only the uniform-page-size grouping of different types")
    buckets: dict[LayerKVSpec, list[str]] = {}
    for name, spec in layers.items():
        buckets.setdefault(spec, []).append(name)
    lengths = [len(b) for b in buckets.values()]
    group_size = min(lengths)
    groups: list[tuple[str, ...]] = []
    if profile == "vllm-0.10":
        for names in buckets.values():
            groups.extend(tuple(names[i:i + group_size])
                          for i in range(0, len(names), group_size))
        return tuple(groups)
    if max(lengths) < group_size * 1.5:
        group_size = max(lengths)
    for names in buckets.values():
        num_groups = -(-len(names) // group_size)
        groups.extend(tuple(names[i::num_groups]) for i in range(num_groups))
    return tuple(groups)


def num_blocks_for(available_memory: int, page_size: int, group_size: int,
                   num_gpu_blocks_override: int | None = None) -> int:
    """Blocks of the shared pool: ``int(available_memory // page_size // group_size)``,
    at least 0, replaced by ``num_gpu_blocks_override`` when that is not None.

    Raises:
        KVCheckInputError: ``page_size`` or ``group_size`` < 1, a negative override.
    """
    if page_size < 1 or group_size < 1:
        raise KVCheckInputError(f"page_size={page_size} and group_size={group_size} must be "
                                ">= 1")
    if num_gpu_blocks_override is not None:
        if num_gpu_blocks_override < 0:
            raise KVCheckInputError(
                f"num_gpu_blocks_override={num_gpu_blocks_override} must be >= 0")
        return num_gpu_blocks_override
    return max(int(available_memory // page_size // group_size), 0)


def tensor_plan(groups: Sequence[Sequence[str]], page_size: int,
                num_blocks: int) -> tuple[KVCacheTensorPlan, ...]:
    """``max(len(group))`` tensors of ``page_size * num_blocks`` bytes; tensor ``i`` is
    shared by the ``i``-th layer of every group that has one."""
    group_size = max((len(g) for g in groups), default=0)
    return tuple(KVCacheTensorPlan(page_size * num_blocks,
                                   tuple(g[i] for g in groups if i < len(g)))
                 for i in range(group_size))


def kv_sizing_plan(layers: Mapping[str, LayerKVSpec], available_memory: int,
                   profile: str = "vllm-0.33",
                   num_gpu_blocks_override: int | None = None) -> KVSizingPlan:
    """Groups, page size, num_blocks and tensors for ``layers`` (insertion order matters)
    given ``available_memory`` bytes of KV cache on the worker.

    Raises:
        KVCheckInputError: no layers, a malformed spec, non-uniform page sizes, negative
            memory.
    """
    if type(available_memory) is not int or available_memory < 0:
        raise KVCheckInputError(f"available_memory={available_memory!r} must be an int >= 0")
    groups = group_layers(layers, profile)
    page_size = uniform_page_size(layers, profile)
    group_size = max(len(g) for g in groups)
    blocks = num_blocks_for(available_memory, page_size, group_size, num_gpu_blocks_override)
    return KVSizingPlan(groups, page_size, group_size, blocks,
                        tensor_plan(groups, page_size, blocks))


def kv_cache_view_shape(spec: LayerKVSpec, num_blocks: int, layout: Layout = "NHD",
                        profile: str = "vllm-0.33") -> tuple[int, ...]:
    """The shape of one attention layer's cache view, dims in memory order.

    * ``vllm-0.10`` (FlashAttention ``get_kv_cache_shape`` and ``get_kv_cache_stride_order``):
      NHD ``(2, num_blocks, block_size, num_kv_heads, head_size)``, HND
      ``(2, num_blocks, num_kv_heads, block_size, head_size)``, in dtype elements, a
      ``block_size`` not a multiple of 16 being FlashAttention's ValueError; MLA
      (``MLACommonBackend``) ``(num_blocks, block_size, head_size)`` for either layout.
    * ``vllm-0.33`` (``compute_layer_kv_cache_shape_bytes`` permuted by the layout's
      ``layer_view_order``; NHD = ``LBNHC``, HND = ``LBHNC``): the last dim is the bytes of
      one head's K||V state, ``(head_size + head_size_v) * dtype_size`` (MLA:
      ``head_size_v = 0``). NHD ``(num_blocks, block_size, num_kv_heads, C)``, HND
      ``(num_blocks, num_kv_heads, block_size, C)``.

    Raises:
        KVCheckInputError: a Mamba spec (no attention view), bad layout or num_blocks.
        KVCacheConfigError: vllm-0.10 FlashAttention with a block size not a multiple of 16
            (vLLM's ValueError; this class is one).
    """
    profile = _profile(profile)
    _check_spec(spec, profile)
    if spec.kind == "mamba":
        raise KVCheckInputError("a Mamba spec has state tensors, not an attention KV view")
    if layout not in ("NHD", "HND"):
        raise KVCheckInputError(f"layout={layout!r}: use 'NHD' or 'HND'")
    if type(num_blocks) is not int or num_blocks < 0:
        raise KVCheckInputError(f"num_blocks={num_blocks!r} must be an int >= 0")
    bs, heads = spec.block_size, spec.num_kv_heads
    if profile == "vllm-0.10":
        if spec.kind == "mla_attention":
            return (num_blocks, bs, spec.head_size)
        if bs % 16:
            raise KVCacheConfigError(
                f"block_size={bs}: vLLM 0.10.2's FlashAttention backend needs a multiple of 16 "
                "(Block size must be a multiple of 16.)")
        if layout == "NHD":
            return (2, num_blocks, bs, heads, spec.head_size)
        return (2, num_blocks, heads, bs, spec.head_size)
    head_size_v = (0 if spec.kind == "mla_attention" else
                   spec.head_size if spec.head_size_v is None else spec.head_size_v)
    content = (spec.head_size + head_size_v) * dtype_size(spec.dtype)
    if layout == "NHD":
        return (num_blocks, bs, heads, content)
    return (num_blocks, heads, bs, content)


def resolve_block_sizes(groups: Sequence[LayerKVSpec], *, enable_prefix_caching: bool = True,
                        prefix_match_unit: int | None = None,
                        profile: str = "vllm-0.33") -> tuple[int, int]:
    """``(scheduler_block_size, hash_block_size)`` of a model whose KV-cache groups have the
    specs ``groups`` (one per group; DCP 1, no KV connector).

    * ``vllm-0.33``: one group: both are its block size, and a ``prefix_match_unit`` other
      than it is a ValueError when prefix caching is on. Several groups: the scheduler size
      is the lcm of the groups' sizes; with prefix caching off, or a Mamba group not in
      ``"align"`` mode, the hash size equals it; else it is ``prefix_match_unit`` or the gcd
      of the prefix-cacheable groups' sizes (all groups' when none is), and each of those
      sizes must be divisible by it (ValueError).
    * ``vllm-0.10``: no LCM/GCD: groups must share one block size when prefix caching is on
      (ValueError otherwise; vLLM asserts), and both sizes are it. Mixed sizes with caching
      off have no scheduler/hash block size in 0.10.2 (KVCheckInputError);
      ``prefix_match_unit`` does not exist (KVCheckInputError).

    Raises:
        KVCacheConfigError: as vLLM (vLLM's ValueError; this class is one).
        KVCheckInputError: no groups, malformed specs, a field the profile lacks.
    """
    profile = _profile(profile)
    if not groups:
        raise KVCheckInputError("no groups: give one LayerKVSpec per KV-cache group")
    for spec in groups:
        _check_spec(spec, profile)
    if prefix_match_unit is not None and (type(prefix_match_unit) is not int
                                          or prefix_match_unit < 1):
        raise KVCheckInputError(f"prefix_match_unit={prefix_match_unit!r} must be an int >= 1")
    sizes = [g.block_size for g in groups]
    if profile == "vllm-0.10":
        if prefix_match_unit is not None:
            raise KVCheckInputError("prefix_match_unit is a vLLM 0.33 setting")
        if len(set(sizes)) == 1:
            return sizes[0], sizes[0]
        if enable_prefix_caching:
            raise KVCacheConfigError(f"vLLM 0.10.2 needs one block size across KV-cache groups "
                                     f"with prefix caching on; got {sizes}")
        raise KVCheckInputError("vLLM 0.10.2 has no scheduler/hash block size for groups of "
                                f"different block sizes ({sizes})")
    if len(groups) == 1:
        bs = sizes[0]
        if prefix_match_unit not in (None, bs) and enable_prefix_caching:
            raise KVCacheConfigError(
                f"Invalid prefix_match_unit={prefix_match_unit}; with a single KV cache group, "
                f"prefix-cache hits land on the block size ({bs})")
        return bs, bs
    scheduler = math.lcm(*sizes)
    if not enable_prefix_caching or any(
            g.kind == "mamba" and g.mamba_cache_mode != "align" for g in groups):
        return scheduler, scheduler
    hashing = [g.block_size for g in groups if g.prefix_cacheable] or sizes
    hash_size = prefix_match_unit if prefix_match_unit is not None else math.gcd(*hashing)
    if any(bs % hash_size for bs in hashing):
        raise KVCacheConfigError(
            f"Invalid prefix_match_unit={hash_size}; prefix-cacheable KV cache group block "
            f"sizes must be divisible by it (sizes {sizes}, prefix-cacheable {hashing})")
    return scheduler, hash_size
