"""kvcheck.reference_impl.sizing: page sizes, grouping, num_blocks, tensors and block sizes
per profile (values recorded from vLLM 0.10.2 and 0.33.0), vLLM's code-comment examples of
the grouping, and the errors."""

from __future__ import annotations

import pytest

from kvcheck.errors import KVCheckInputError
from kvcheck.reference_impl.sizing import (
    KVCacheTensorPlan,
    LayerKVSpec,
    dtype_size,
    group_layers,
    is_uniform_type,
    kv_cache_view_shape,
    kv_sizing_plan,
    num_blocks_for,
    page_size_bytes,
    resolve_block_sizes,
    tensor_plan,
    uniform_page_size,
)

MiB = 1 << 20
BOTH = ["vllm-0.33", "vllm-0.10"]
F = LayerKVSpec("full_attention", 16, 8, 128, "bfloat16")
S = LayerKVSpec("sliding_window", 16, 8, 128, "bfloat16", sliding_window=128)
MLA = LayerKVSpec("mla_attention", 64, 1, 576, "bfloat16")


# ------------------------------------------------------------------ page sizes
@pytest.mark.parametrize("profile", BOTH)
@pytest.mark.parametrize(("spec", "expected"), [
    (F, 65536),
    (S, 65536),
    (LayerKVSpec("chunked_local_attention", 16, 8, 128, attention_chunk_size=64), 65536),
    (LayerKVSpec("full_attention", 16, 8, 128, "uint8"), 32768),
    (LayerKVSpec("full_attention", 16, 8, 128, "torch.float8_e4m3fn"), 32768),
    (MLA, 73728),
    (LayerKVSpec("mamba", 16, shapes=((3, 4), (2, 8)), dtypes=("float32", "bfloat16")), 80),
    (LayerKVSpec("mamba", 16, shapes=((3, 4), (2, 8)), dtypes=("float32", "bfloat16"),
                 page_size_padded=1024), 1024),
])
def test_page_size_table(profile: str, spec: LayerKVSpec, expected: int) -> None:
    assert page_size_bytes(spec, profile) == expected


def test_page_size_033_fields() -> None:
    v64 = LayerKVSpec("full_attention", 16, 8, 128, head_size_v=64)
    assert page_size_bytes(v64, "vllm-0.33") == 49152  # 16·8·(128+64)·2
    assert page_size_bytes(v64, "generic") == 49152  # generic reads as the newest release
    # MLA has head_size_v = 0 whatever is given; attention pages may be padded in 0.33.
    assert page_size_bytes(LayerKVSpec("mla_attention", 64, 1, 576, head_size_v=576)) == 73728
    assert page_size_bytes(LayerKVSpec("full_attention", 16, 8, 128,
                                       page_size_padded=70000)) == 70000
    with pytest.raises(KVCheckInputError, match=r"vLLM 0\.33 AttentionSpec field"):
        page_size_bytes(v64, "vllm-0.10")
    with pytest.raises(KVCheckInputError, match=r"0\.10\.2 pads Mamba pages only"):
        page_size_bytes(LayerKVSpec("full_attention", 16, 8, 128, page_size_padded=70000),
                        "vllm-0.10")
    # head_size_v == head_size is the default, so 0.10.2 accepts it.
    assert page_size_bytes(LayerKVSpec("full_attention", 16, 8, 128, head_size_v=128),
                           "vllm-0.10") == 65536


@pytest.mark.parametrize(("spec", "match"), [
    (LayerKVSpec("full_attention", 16, 8, 128, page_size_padded=100), "smaller than the"),
    (LayerKVSpec("mamba", 16, shapes=((4,),), dtypes=("float32",), page_size_padded=8),
     "smaller than the"),
    (LayerKVSpec("full_attention", 0, 8, 128), "block_size=0"),
    (LayerKVSpec("full_attention", 16, 0, 128), "num_kv_heads=0"),
    (LayerKVSpec("sliding_window", 16, 8, 128), "sliding_window=None"),
    (LayerKVSpec("chunked_local_attention", 16, 8, 128), "attention_chunk_size=None"),
    (LayerKVSpec("full_attention", 16, 8, 128, "complex64"), "unknown dtype"),
    (LayerKVSpec("mamba", 16, shapes=((4,),), dtypes=()), "one dtype per state shape"),
    (LayerKVSpec("cross_attention", 16, 8, 128), "unknown spec kind"),  # type: ignore[arg-type]
])
def test_bad_specs_are_input_errors(spec: LayerKVSpec, match: str) -> None:
    with pytest.raises(KVCheckInputError, match=match):
        page_size_bytes(spec)


def test_dtype_sizes_and_profiles() -> None:
    assert [dtype_size(d) for d in ("float32", "bfloat16", "float16", "uint8")] == [4, 2, 2, 1]
    with pytest.raises(KVCheckInputError, match="unknown profile"):
        page_size_bytes(F, "vllm-0.5")


# ------------------------------------------------------------------ grouping
EXAMPLE_1 = {"l0": F, "l1": S, "l2": S, "l3": F, "l4": S, "l5": S}


def test_worked_example_1_vllm_010() -> None:
    """Worked example 1 (0.10.2 ``_get_kv_cache_config_uniform_page_size``)."""
    plan = kv_sizing_plan(EXAMPLE_1, 64 * MiB, "vllm-0.10")
    assert plan.groups == (("l0", "l3"), ("l1", "l2"), ("l4", "l5"))
    assert (plan.page_size, plan.group_size, plan.num_blocks) == (65536, 2, 512)
    assert plan.tensors == (KVCacheTensorPlan(33554432, ("l0", "l1", "l4")),
                            KVCacheTensorPlan(33554432, ("l3", "l2", "l5")))


def test_worked_example_1_vllm_033_strided() -> None:
    """0.33.0 gives a bucket's groups ``layers[i::num_groups]`` (recorded from vLLM 0.33.0)."""
    plan = kv_sizing_plan(EXAMPLE_1, 64 * MiB, "vllm-0.33")
    assert plan.groups == (("l0", "l3"), ("l1", "l4"), ("l2", "l5"))
    assert plan.num_blocks == 512
    assert plan.tensors == (KVCacheTensorPlan(33554432, ("l0", "l1", "l2")),
                            KVCacheTensorPlan(33554432, ("l3", "l4", "l5")))


@pytest.mark.parametrize("profile", BOTH)
def test_worked_example_2(profile: str) -> None:
    """Worked example 2: l0 F, l1-l3 S -> four groups, 1024 blocks, one shared tensor."""
    plan = kv_sizing_plan({"l0": F, "l1": S, "l2": S, "l3": S}, 64 * MiB, profile)
    assert plan.groups == (("l0",), ("l1",), ("l2",), ("l3",))
    assert (plan.group_size, plan.num_blocks) == (1, 1024)
    assert plan.tensors == (KVCacheTensorPlan(67108864, ("l0", "l1", "l2", "l3")),)


@pytest.mark.parametrize(("profile", "groups"), [
    # The examples in vLLM's comments: (full.0, full.1), (sw.0, sw.1, sw.2).
    ("vllm-0.10", (("f0", "f1"), ("s0", "s1"), ("s2",))),
    ("vllm-0.33", (("f0", "f1"), ("s0", "s2"), ("s1",))),
])
def test_padding_group_per_release(profile: str, groups: tuple[tuple[str, ...], ...]) -> None:
    layers = {"f0": F, "f1": F, "s0": S, "s1": S, "s2": S}
    plan = kv_sizing_plan(layers, 64 * MiB, profile)
    assert plan.groups == groups
    assert plan.group_size == 2 and plan.num_blocks == 64 * MiB // 65536 // 2
    assert [t.shared_by for t in plan.tensors] == [tuple(g[0] for g in groups),
                                                   tuple(g[1] for g in groups if len(g) > 1)]


def test_033_pads_to_the_largest_bucket_when_close() -> None:
    """0.33: 12 SWA + 13 full (gpt-oss-20b + eagle in vLLM's comment) -> two groups of 13
    slots (one padding), not 12 + 24; 0.10.2 cuts the full bucket at 12."""
    layers = {f"s{i}": S for i in range(12)} | {f"f{i}": F for i in range(13)}
    assert [len(g) for g in group_layers(layers, "vllm-0.33")] == [12, 13]
    assert [len(g) for g in group_layers(layers, "vllm-0.10")] == [12, 12, 1]
    assert kv_sizing_plan(layers, 64 * MiB, "vllm-0.33").group_size == 13


@pytest.mark.parametrize("profile", BOTH)
def test_one_spec_one_group(profile: str) -> None:
    layers = {f"layer.{i}": F for i in range(4)}
    plan = kv_sizing_plan(layers, MiB, profile)
    assert plan.groups == (tuple(layers),)
    assert plan.num_blocks == MiB // 65536 // 4
    assert [t.shared_by for t in plan.tensors] == [(n,) for n in layers]


def test_num_blocks_rules() -> None:
    assert num_blocks_for(64 * MiB, 65536, 2) == 512
    assert num_blocks_for(2 * 65536 - 1, 65536, 2) == 0
    assert num_blocks_for(0, 65536, 2, num_gpu_blocks_override=9) == 9
    with pytest.raises(KVCheckInputError, match="must be >= 1"):
        num_blocks_for(MiB, 0, 1)
    with pytest.raises(KVCheckInputError, match="override"):
        num_blocks_for(MiB, 1, 1, num_gpu_blocks_override=-1)
    plan = kv_sizing_plan(EXAMPLE_1, 64 * MiB, num_gpu_blocks_override=3)
    assert plan.num_blocks == 3 and {t.size for t in plan.tensors} == {3 * 65536}


def test_tensor_plan_ragged_groups() -> None:
    assert tensor_plan([("a", "b"), ("c",)], 10, 2) == (
        KVCacheTensorPlan(20, ("a", "c")), KVCacheTensorPlan(20, ("b",)))


def test_non_uniform_page_sizes_name_the_layers() -> None:
    small = LayerKVSpec("sliding_window", 16, 4, 128, sliding_window=64)
    with pytest.raises(KVCheckInputError,
                       match=r"not uniform across layers \(65536 B: l0; 32768 B: l1\)"):
        kv_sizing_plan({"l0": F, "l1": small}, 64 * MiB)
    assert uniform_page_size({"a": F, "b": S}) == 65536


def test_plan_input_errors() -> None:
    with pytest.raises(KVCheckInputError, match="no layers"):
        kv_sizing_plan({}, MiB)
    with pytest.raises(KVCheckInputError, match="available_memory"):
        kv_sizing_plan({"a": F}, -1)


# ------------------------------------------------------------------ view shapes
def test_view_shapes() -> None:
    assert kv_cache_view_shape(F, 3, "NHD", "vllm-0.10") == (2, 3, 16, 8, 128)
    assert kv_cache_view_shape(F, 3, "HND", "vllm-0.10") == (2, 3, 8, 16, 128)
    assert kv_cache_view_shape(MLA, 3, "HND", "vllm-0.10") == (3, 64, 576)
    assert kv_cache_view_shape(F, 3, "NHD", "vllm-0.33") == (3, 16, 8, 512)
    assert kv_cache_view_shape(F, 3, "HND", "vllm-0.33") == (3, 8, 16, 512)
    assert kv_cache_view_shape(MLA, 3, "NHD", "vllm-0.33") == (3, 64, 1, 1152)
    with pytest.raises(ValueError, match="multiple of 16"):
        kv_cache_view_shape(LayerKVSpec("full_attention", 8, 8, 128), 3, "NHD", "vllm-0.10")
    with pytest.raises(KVCheckInputError, match="Mamba"):
        kv_cache_view_shape(LayerKVSpec("mamba", 16, shapes=((4,),), dtypes=("float32",)), 3)
    with pytest.raises(KVCheckInputError, match="layout"):
        kv_cache_view_shape(F, 3, "XYZ")  # type: ignore[arg-type]


# ------------------------------------------------------------------ block sizes
def _g(kind: str, bs: int, **kw: object) -> LayerKVSpec:
    if kind == "mamba":
        return LayerKVSpec("mamba", bs, shapes=((4,),), dtypes=("float32",), **kw)  # type: ignore[arg-type]
    extra = {"sliding_window": 8} if kind == "sliding_window" else {}
    return LayerKVSpec(kind, bs, 8, 128, **extra, **kw)  # type: ignore[arg-type]


def test_block_sizes_033() -> None:
    full2, swa4 = _g("full_attention", 2), _g("sliding_window", 4)
    assert resolve_block_sizes([full2, swa4]) == (4, 2)  # full bs 2 + SWA bs 4
    assert resolve_block_sizes([_g("full_attention", 16)]) == (16, 16)
    assert resolve_block_sizes([full2, swa4], prefix_match_unit=1) == (4, 1)
    assert resolve_block_sizes([full2, swa4], enable_prefix_caching=False) == (4, 4)
    assert resolve_block_sizes([full2, _g("mamba", 4)]) == (4, 4)
    assert resolve_block_sizes([full2, _g("mamba", 4, mamba_cache_mode="align")]) == (4, 2)
    # Only prefix-cacheable groups set the gcd.
    assert resolve_block_sizes([_g("full_attention", 4),
                                _g("sliding_window", 6, prefix_cacheable=False)]) == (12, 4)
    with pytest.raises(ValueError, match="single KV cache group"):
        resolve_block_sizes([_g("full_attention", 16)], prefix_match_unit=8)
    with pytest.raises(ValueError, match="divisible"):
        resolve_block_sizes([full2, swa4], prefix_match_unit=4)
    # Caching off: a single group's prefix_match_unit is not checked.
    assert resolve_block_sizes([_g("full_attention", 16)], enable_prefix_caching=False,
                               prefix_match_unit=8) == (16, 16)


def test_block_sizes_010() -> None:
    assert resolve_block_sizes([_g("full_attention", 16)] * 2, profile="vllm-0.10") == (16, 16)
    with pytest.raises(ValueError, match="one block size"):
        resolve_block_sizes([_g("full_attention", 2), _g("sliding_window", 4)],
                            profile="vllm-0.10")
    with pytest.raises(KVCheckInputError, match="no scheduler/hash block size"):
        resolve_block_sizes([_g("full_attention", 2), _g("sliding_window", 4)],
                            enable_prefix_caching=False, profile="vllm-0.10")
    with pytest.raises(KVCheckInputError, match=r"0\.33 setting"):
        resolve_block_sizes([_g("full_attention", 2)], prefix_match_unit=2,
                            profile="vllm-0.10")
    with pytest.raises(KVCheckInputError, match="no groups"):
        resolve_block_sizes([])


# ------------------------------------------------------------------ 0.33 uniform-type groups
@pytest.mark.parametrize(("specs", "uniform"), [
    # vLLM 0.33.0's UniformTypeKVCacheSpecs.from_specs on these pairs (equal specs: the
    # one-spec path, checked first by get_kv_cache_groups).
    ([F, LayerKVSpec("full_attention", 16, 4, 256)], True),
    ([LayerKVSpec("full_attention", 16, 1, 128), LayerKVSpec("mla_attention", 16, 1, 256)],
     True),
    ([S, LayerKVSpec("sliding_window", 16, 4, 256, sliding_window=128)], True),
    ([LayerKVSpec("sliding_window", 16, 8, 128, sliding_window=4), S], False),
    ([F, S], False),
    ([F, LayerKVSpec("full_attention", 32, 8, 128)], False),
    ([F, F], False),
])
def test_is_uniform_type(specs: list[LayerKVSpec], uniform: bool) -> None:
    layers = {f"l{i}": s for i, s in enumerate(specs)}
    assert is_uniform_type(layers) is uniform


def test_uniform_type_is_not_modelled_under_033() -> None:
    layers = {"a": F, "b": LayerKVSpec("full_attention", 16, 4, 256)}
    with pytest.raises(KVCheckInputError, match="UniformTypeKVCacheSpecs"):
        kv_sizing_plan(layers, MiB, "vllm-0.33")
    # 0.10.2 has no such path: two groups of one layer (uniform page size).
    assert kv_sizing_plan(layers, MiB, "vllm-0.10").groups == (("a",), ("b",))
