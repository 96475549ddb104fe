"""The ``sizing`` capability: module-level KV-cache sizing functions (vLLM's
``KVCacheSpec.page_size_bytes``, KV-cache grouping and ``KVCacheConfig``, view shapes,
``resolve_kv_cache_block_sizes``).

An implementation that declares ``"sizing"`` in ``IMPL_INFO.capabilities`` exposes, at module
level (next to ``make_kv_cache_manager``), the functions of ``SupportsSizing``:

* ``kv_page_size_bytes(spec, profile) -> int``
* ``kv_sizing_plan(layers, available_memory, profile, num_gpu_blocks_override) ->
  KVSizingPlan``
* ``kv_cache_view_shape(spec, num_blocks, layout, profile) -> tuple[int, ...]``
* ``kv_block_sizes(groups, enable_prefix_caching, prefix_match_unit, profile) ->
  tuple[int, int]``
* ``kv_feature_defaults(model, profile) -> KVFeatureDefaults`` (added after the first four,
  so optional: ``SIZING_OPTIONAL_FUNCTIONS``): the prefix caching and chunked prefill a model
  runs with (vLLM turns both off for non-causal layers, non-causal pooling models,
  encoder-decoder models...)

They take the frozen dataclasses re-exported here (vLLM's ``KVCacheSpec`` classes reduced to
what sizing reads, and ``KVModelFacts`` / ``KVFeatureDefaults``; defined once, in
``kvcheck.reference_impl.sizing`` and ``kvcheck.reference_impl.feature_defaults``) and the
active profile name (``"vllm-0.33"`` or ``"vllm-0.10"``), so one module can answer for both
releases. The loader checks that the ``SIZING_FUNCTIONS`` exist when the capability is
declared; a module without an optional function (``SIZING_OPTIONAL_FUNCTIONS``) still loads,
and the tests of that function skip, naming it and how to add it.
``conformance/test_sizing.py`` checks the answers.

Errors: an input the profile's vLLM rejects (page sizes that are not uniform, a
``page_size_padded`` below the page, ``resolve_kv_cache_block_sizes``'s divisibility errors, a
field that release lacks) raises ``ValueError`` (``KVCheckInputError`` is one). An input the
implementation's design does not model raises ``kvcheck.conformance.protocol.UnsupportedSpec``:
the test is then skipped, not failed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

# One definition of the spec and plan types, the reference's, serves the reference, the
# protocol and every adapter (the layering lets conformance import the reference, not the
# reverse): a field added there is added everywhere.
from kvcheck.reference_impl.feature_defaults import (
    FEATURE_OFF_REASONS,
    KVFeatureDefaults,
    KVModelFacts,
)
from kvcheck.reference_impl.sizing import (
    SPEC_KINDS,
    KVCacheTensorPlan,
    KVSizingPlan,
    LayerKVSpec,
    Layout,
    SpecKind,
)

__all__ = [
    "FEATURE_OFF_REASONS",
    "SIZING_FUNCTIONS",
    "SIZING_OPTIONAL_FUNCTIONS",
    "SPEC_KINDS",
    "KVCacheTensorPlan",
    "KVFeatureDefaults",
    "KVModelFacts",
    "KVSizingPlan",
    "LayerKVSpec",
    "Layout",
    "SpecKind",
    "SupportsSizing",
]


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

    def kv_feature_defaults(self, model: KVModelFacts, profile: str) -> KVFeatureDefaults:
        """The ``enable_prefix_caching`` / chunked prefill settings the model runs with and
        the sorted codes (``FEATURE_OFF_REASONS``) of the rules that turned one off: vLLM's
        defaults per model kind, the user's explicit choice, then the rules that force both
        off (encoder-decoder, non-causal pooling or layers, hybrid / Mamba under 0.10.2);
        docs/semantics.md, "KV-cache sizing". A field the release lacks, an unknown runner or
        pooling type: ValueError naming the field. Optional (``SIZING_OPTIONAL_FUNCTIONS``)."""
        ...


#: The function names an adapter module must define for ``sizing``, in protocol order.
SIZING_FUNCTIONS: tuple[str, ...] = ("kv_page_size_bytes", "kv_sizing_plan",
                                     "kv_cache_view_shape", "kv_block_sizes")
#: Functions added to ``SupportsSizing`` later, in protocol order: a module declaring
#: ``sizing`` without one still loads, and the tests of that function skip with the fix.
SIZING_OPTIONAL_FUNCTIONS: tuple[str, ...] = ("kv_feature_defaults",)
