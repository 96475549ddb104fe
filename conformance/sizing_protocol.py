"""The ``sizing`` capability: module-level KV-cache sizing functions (vLLM's
``KVCacheSpec.page_size_bytes``, KV-cache grouping and ``KVCacheConfig``, view shapes,
``resolve_kv_cache_block_sizes``).

An implementation that declares ``"sizing"`` in ``IMPL_INFO.capabilities`` exposes, at module
level (next to ``make_kv_cache_manager``), the four functions of ``SupportsSizing``:

* ``kv_page_size_bytes(spec, profile) -> int``
* ``kv_sizing_plan(layers, available_memory, profile, num_gpu_blocks_override) ->
  KVSizingPlan``
* ``kv_cache_view_shape(spec, num_blocks, layout, profile) -> tuple[int, ...]``
* ``kv_block_sizes(groups, enable_prefix_caching, prefix_match_unit, profile) ->
  tuple[int, int]``

They take the frozen dataclasses below (vLLM's ``KVCacheSpec`` classes reduced to what sizing
reads) and the active profile name (``"vllm-0.33"`` or ``"vllm-0.10"``), so one module can
answer for both releases. The loader checks that the functions exist when the capability is
declared; ``conformance/test_sizing.py`` checks their answers.

Errors: an input the profile's vLLM rejects (page sizes that are not uniform, a
``page_size_padded`` below the page, ``resolve_kv_cache_block_sizes``'s divisibility errors, a
field that release lacks) raises ``ValueError`` (``KVCheckInputError`` is one). An input the
implementation's design does not model raises ``kvcheck.conformance.protocol.UnsupportedSpec``:
the test is then skipped, not failed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

__all__ = [
    "SIZING_FUNCTIONS",
    "SPEC_KINDS",
    "KVCacheTensorPlan",
    "KVSizingPlan",
    "LayerKVSpec",
    "Layout",
    "SpecKind",
    "SupportsSizing",
]

#: ``LayerKVSpec.kind`` values, one per vLLM spec class sizing models.
SpecKind = Literal["full_attention", "sliding_window", "chunked_local_attention",
                   "mla_attention", "mamba"]
SPEC_KINDS: tuple[str, ...] = ("full_attention", "sliding_window", "chunked_local_attention",
                               "mla_attention", "mamba")
#: Memory order of an attention view: tokens before heads (NHD) or heads before tokens (HND).
Layout = Literal["NHD", "HND"]


@dataclass(frozen=True)
class LayerKVSpec:
    """One layer's KV-cache spec. Compared by value: equal specs are one grouping bucket.

    Attributes:
        kind: ``full_attention`` (vLLM ``FullAttentionSpec``), ``sliding_window``
            (``SlidingWindowSpec``), ``chunked_local_attention``
            (``ChunkedLocalAttentionSpec``), ``mla_attention`` (0.10.2
            ``FullAttentionSpec(use_mla=True)``; 0.33 ``MLAAttentionSpec``), ``mamba``
            (``MambaSpec``).
        block_size: tokens per block, >= 1.
        num_kv_heads, head_size: attention kinds, >= 1 (MLA: 1 head of the latent size).
        dtype: the cache dtype's torch name (``bfloat16``, ``float16``, ``float32``; an fp8
            cache uses a 1-byte dtype: ``uint8``, ``float8_e4m3fn``...).
        head_size_v: vLLM 0.33 ``AttentionSpec.head_size_v`` (None: ``head_size``; MLA: 0).
        sliding_window: ``sliding_window`` kind, tokens >= 1.
        attention_chunk_size: ``chunked_local_attention`` kind, tokens >= 1.
        page_size_padded: bytes per page after padding (Mamba; attention only under 0.33),
            at least the unpadded page.
        shapes, dtypes: Mamba state tensors (per block), one dtype name per shape.
        prefix_cacheable: 0.33 ``KVCacheSpec.prefix_cacheable`` (hash block size).
        mamba_cache_mode: 0.33 ``MambaSpec.mamba_cache_mode`` (``none``, ``align``, ``all``).
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
    """A model's KV-cache configuration (vLLM's ``KVCacheConfig`` reduced to sizing).

    Attributes:
        groups: KV-cache groups in vLLM's order, each the layer names in order.
        page_size: bytes of one block of one layer (uniform).
        group_size: layers per group, padding included (= the number of tensors).
        num_blocks: blocks of the one pool every group draws from.
        tensors: ``group_size`` tensors of ``page_size * num_blocks`` bytes; tensor ``i`` is
            shared by the ``i``-th layer of every group that has one.
    """

    groups: tuple[tuple[str, ...], ...]
    page_size: int
    group_size: int
    num_blocks: int
    tensors: tuple[KVCacheTensorPlan, ...]


@runtime_checkable
class SupportsSizing(Protocol):
    """The module-level functions of the ``sizing`` capability (an adapter module, not an
    object, provides them; written as methods so ``protocol_methods`` can list them)."""

    def kv_page_size_bytes(self, spec: LayerKVSpec, profile: str) -> int:
        """Bytes one block of one layer takes (``KVCacheSpec.page_size_bytes``), padding
        included."""
        ...

    def kv_sizing_plan(self, layers: Mapping[str, LayerKVSpec], available_memory: int,
                       profile: str, num_gpu_blocks_override: int | None) -> KVSizingPlan:
        """The KV-cache configuration of a model whose layers (name -> spec, in model order)
        get ``available_memory`` bytes: groups (bucketed by spec), uniform page size, ``num_blocks =
        available_memory // page_size // group_size`` (>= 0) or the override, and the
        tensors. Page sizes that are not uniform: ValueError naming them."""
        ...

    def kv_cache_view_shape(self, spec: LayerKVSpec, num_blocks: int, layout: str,
                            profile: str) -> tuple[int, ...]:
        """One attention layer's cache view shape, dims in memory order for ``layout``
        (``NHD``/``HND``). vllm-0.10: FlashAttention ``(2, num_blocks, block_size,
        num_kv_heads, head_size)`` (HND swaps the middle two), MLA ``(num_blocks,
        block_size, head_size)``, in dtype elements. vllm-0.33: ``(num_blocks, block_size,
        num_kv_heads, C)`` (HND: heads before tokens), ``C`` the bytes of one head's
        state ``(head_size + head_size_v) * dtype_size``."""
        ...

    def kv_block_sizes(self, groups: Sequence[LayerKVSpec], enable_prefix_caching: bool,
                       prefix_match_unit: int | None, profile: str) -> tuple[int, int]:
        """``(scheduler_block_size, hash_block_size)`` for KV-cache groups with these specs
        (one per group; vLLM 0.33 ``resolve_kv_cache_block_sizes``; DCP 1, no
        connector). vLLM's rejections are ValueErrors."""
        ...


#: The function names an adapter module must define for ``sizing``, in protocol order.
SIZING_FUNCTIONS: tuple[str, ...] = ("kv_page_size_bytes", "kv_sizing_plan",
                                     "kv_cache_view_shape", "kv_block_sizes")
