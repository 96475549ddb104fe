"""The reference's ``sizing`` capability: ``kvcheck.reference_impl.sizing`` behind the
module-level functions of ``kvcheck.conformance.sizing_protocol``.

``adapters/reference.py`` re-exports these five functions and declares ``"sizing"``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvcheck.conformance.sizing_protocol import (
    KVFeatureDefaults,
    KVModelFacts,
    KVSizingPlan,
    LayerKVSpec,
)
from kvcheck.errors import KVCheckInputError
from kvcheck.reference_impl import feature_defaults
from kvcheck.reference_impl import sizing as ref

__all__ = ["kv_block_sizes", "kv_cache_view_shape", "kv_feature_defaults", "kv_page_size_bytes",
           "kv_sizing_plan", "to_reference_spec"]


def to_reference_spec(spec: LayerKVSpec) -> ref.LayerKVSpec:
    """``spec`` itself, checked to be a ``LayerKVSpec`` (the protocol's class is the
    reference's, so there is nothing to convert)."""
    if not isinstance(spec, LayerKVSpec):
        raise KVCheckInputError(f"expected a sizing_protocol.LayerKVSpec, got "
                                f"{type(spec).__name__}")
    return spec


def kv_page_size_bytes(spec: LayerKVSpec, profile: str) -> int:
    """See ``SupportsSizing.kv_page_size_bytes``."""
    return ref.page_size_bytes(to_reference_spec(spec), profile)


def kv_sizing_plan(layers: Mapping[str, LayerKVSpec], available_memory: int, profile: str,
                   num_gpu_blocks_override: int | None = None) -> KVSizingPlan:
    """See ``SupportsSizing.kv_sizing_plan``."""
    return ref.kv_sizing_plan({name: to_reference_spec(s) for name, s in layers.items()},
                              available_memory, profile, num_gpu_blocks_override)


def kv_cache_view_shape(spec: LayerKVSpec, num_blocks: int, layout: str,
                        profile: str) -> tuple[int, ...]:
    """See ``SupportsSizing.kv_cache_view_shape``."""
    if layout not in ("NHD", "HND"):
        raise KVCheckInputError(f"layout={layout!r}: use 'NHD' or 'HND'")
    return ref.kv_cache_view_shape(to_reference_spec(spec), num_blocks,
                                   "NHD" if layout == "NHD" else "HND", profile)


def kv_block_sizes(groups: Sequence[LayerKVSpec], enable_prefix_caching: bool = True,
                   prefix_match_unit: int | None = None,
                   profile: str = "vllm-0.33") -> tuple[int, int]:
    """See ``SupportsSizing.kv_block_sizes``."""
    return ref.resolve_block_sizes([to_reference_spec(g) for g in groups],
                                   enable_prefix_caching=enable_prefix_caching,
                                   prefix_match_unit=prefix_match_unit, profile=profile)


def kv_feature_defaults(model: KVModelFacts, profile: str) -> KVFeatureDefaults:
    """See ``SupportsSizing.kv_feature_defaults``."""
    return feature_defaults.kv_feature_defaults(model, profile)
