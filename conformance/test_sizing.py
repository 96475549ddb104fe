"""sizing (capability ``sizing``): page sizes, KV-cache groups, num_blocks, the KV tensor plan,
per-layer view shapes and block sizes across groups, through the module-level functions of
``kvcheck.conformance.sizing_protocol``.

Golden values, recorded from vLLM's own classes: page sizes (both releases); two worked
grouping examples as vLLM 0.10.2 computes them and as 0.33.0 does (0.33.0 gives a bucket's
groups its layers strided, ``layers[i::num_groups]``: its values were recorded from
``_get_kv_cache_groups_uniform_page_size`` / ``get_kv_cache_config_from_groups``); block
sizes across groups (0.33 ``resolve_kv_cache_block_sizes``); view shapes of the FlashAttention
and MLA backends (0.10.2) and of ``compute_layer_kv_cache_shape_bytes`` (0.33.0); the prefix
caching and chunked prefill a model runs with (``kv_feature_defaults``, optional: a module
without it skips those tests, naming the fix), each expectation written from the vLLM lines
cited beside it. Property tests compare random specs, models and model facts with kvcheck's
reference (``kvcheck.reference_impl.sizing``, ``feature_defaults``) and check the tensor plan's
invariants.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any, Literal, TypedDict, TypeVar, overload

import pytest

from kvcheck.conformance.protocol import UnsupportedSpec
from kvcheck.conformance.sizing_answers import (
    check_sizing_answer,
    feature_defaults_answer,
    plan_int,
)
from kvcheck.conformance.sizing_protocol import KVModelFacts, LayerKVSpec, SpecKind
from kvcheck.conformance.spec_seal import call_with_private_args
from kvcheck.errors import KVCheckFailure
from kvcheck.reference_impl import feature_defaults as ref_features
from kvcheck.reference_impl import sizing as ref

if TYPE_CHECKING:
    from hypothesis import settings as Settings
    from hypothesis.strategies import DrawFn, SearchStrategy

    from kvcheck.conformance.loader import ImplHandle

pytestmark = pytest.mark.kv_capability("sizing")

MiB = 1 << 20
F16 = LayerKVSpec("full_attention", 16, 8, 128, "bfloat16")
S16 = LayerKVSpec("sliding_window", 16, 8, 128, "bfloat16", sliding_window=128)
MLA = LayerKVSpec("mla_attention", 64, 1, 576, "bfloat16")
MAMBA = LayerKVSpec("mamba", 16, shapes=((3, 4), (2, 8)), dtypes=("float32", "bfloat16"))
#: 0.33-only fields and functions (head_size_v, attention page_size_padded,
#: resolve_kv_cache_block_sizes): not applicable under vllm-0.10.
ONLY_033 = pytest.mark.kv_profiles("vllm-0.33")
ONLY_010 = pytest.mark.kv_profiles("vllm-0.10")
_T = TypeVar("_T")
#: A plan as plain tuples: ``(groups, page_size, group_size, num_blocks, ((size, shared_by),
#: ...))``; the layer names as the implementation gave them.
PlanTuple = tuple[tuple[tuple[object, ...], ...], int, int, int,
                  tuple[tuple[int, tuple[object, ...]], ...]]
#: The reference's plan as plain tuples (layer names are str).
RefPlanTuple = tuple[tuple[tuple[str, ...], ...], int, int, int,
                     tuple[tuple[int, tuple[str, ...]], ...]]
#: ``_outcome``'s answer: the result, or a ValueError's message.
Outcome = tuple[Literal["ok"], _T] | tuple[Literal["ValueError"], str]


@overload
def _call(kv_impl: ImplHandle, name: Literal["kv_page_size_bytes"], *args: object) -> int: ...
@overload
def _call(kv_impl: ImplHandle, name: Literal["kv_cache_view_shape", "kv_block_sizes"],
          *args: object) -> tuple[int, ...]: ...
@overload
def _call(kv_impl: ImplHandle, name: str, *args: object) -> object: ...
def _call(kv_impl: ImplHandle, name: str, *args: object) -> object:
    """``name(*args)`` under the call limit, on private copies of the specs (a write to one
    is reported as such: ``kvcheck.conformance.spec_seal``), its answer's type checked
    (``kvcheck.conformance.sizing_answers``: a float or str size is a protocol violation)."""
    fn: Callable[..., object] = getattr(kv_impl.module, name)
    answer = call_with_private_args(kv_impl.limit, name, fn, *args)
    return check_sizing_answer(kv_impl.name, name, args, answer)


def _plan(kv_impl: ImplHandle, layers: Mapping[str, LayerKVSpec], memory: int,
          profile: str, override: int | None = None) -> PlanTuple:
    """The implementation's plan as plain tuples:
    ``(groups, page_size, group_size, num_blocks, ((size, shared_by), ...))``."""
    # Any: the answer is read duck-typed (a KVSizingPlan or any object with its fields); a
    # missing field or a wrong shape is the AttributeError / TypeError caught below.
    plan: Any = _call(kv_impl, "kv_sizing_plan", dict(layers), memory, profile, override)
    name = kv_impl.name
    try:
        return (tuple(tuple(g) for g in plan.groups), plan_int(name, "page_size", plan.page_size),
                plan_int(name, "group_size", plan.group_size),
                plan_int(name, "num_blocks", plan.num_blocks),
                tuple((plan_int(name, "tensor size", t.size), tuple(t.shared_by))
                      for t in plan.tensors))
    except (AttributeError, TypeError) as exc:
        raise KVCheckFailure(f"{kv_impl.name}: kv_sizing_plan returned {plan!r}, not a "
                             f"KVSizingPlan ({exc})") from None


def _expect_value_error(kv_impl: ImplHandle, what: str, name: str, *args: object) -> None:
    """``name(*args)`` must raise ValueError (vLLM rejects the input)."""
    try:
        result = _call(kv_impl, name, *args)
    except ValueError:
        return
    raise KVCheckFailure(f"{kv_impl.name}: {name} accepted {what} (returned {result!r}); "
                         "vLLM rejects it: raise ValueError")


def _ref_spec(spec: LayerKVSpec) -> ref.LayerKVSpec:
    return ref.LayerKVSpec(**asdict(spec))


def _ref_plan(layers: Mapping[str, LayerKVSpec], memory: int, profile: str,
              override: int | None = None) -> RefPlanTuple:
    plan = ref.kv_sizing_plan({n: _ref_spec(s) for n, s in layers.items()}, memory, profile,
                              override)
    return (plan.groups, plan.page_size, plan.group_size, plan.num_blocks,
            tuple((t.size, t.shared_by) for t in plan.tensors))


# ------------------------------------------------------------------ page_size_bytes
PAGE_SIZES = [
    pytest.param(F16, 65536, id="full-bs16-h8-d128-bf16"),
    pytest.param(S16, 65536, id="swa-bs16-h8-d128-bf16"),
    pytest.param(LayerKVSpec("full_attention", 16, 8, 128, "uint8"), 32768,
                 id="full-uint8"),
    pytest.param(LayerKVSpec("full_attention", 16, 8, 128, "float8_e4m3fn"), 32768,
                 id="full-fp8"),
    pytest.param(MLA, 73728, id="mla-bs64-d576"),
    pytest.param(LayerKVSpec("full_attention", 16, 8, 128, "bfloat16", head_size_v=64),
                 49152, id="head_size_v-64", marks=ONLY_033),
    pytest.param(MAMBA, 80, id="mamba"),
    pytest.param(LayerKVSpec("mamba", 16, shapes=((3, 4), (2, 8)),
                             dtypes=("float32", "bfloat16"), page_size_padded=1024), 1024,
                 id="mamba-padded"),
]


@pytest.mark.parametrize(("spec", "expected"), PAGE_SIZES)
def test_page_size_golden(kv_impl: ImplHandle, kv_profile: str, spec: LayerKVSpec,
                          expected: int) -> None:
    """The page sizes vLLM's spec classes compute (identical in 0.10.2 and 0.33.0)."""
    got = _call(kv_impl, "kv_page_size_bytes", spec, kv_profile)
    assert got == expected, f"{kv_impl.name}: page_size_bytes({spec}) = {got}, vLLM {expected}"


@pytest.mark.parametrize("spec", [
    pytest.param(LayerKVSpec("full_attention", 16, 8, 128, page_size_padded=1000),
                 id="attention-padded-below-page", marks=ONLY_033),
    pytest.param(LayerKVSpec("mamba", 16, shapes=((3, 4),), dtypes=("float32",),
                             page_size_padded=40), id="mamba-padded-below-page"),
])
def test_page_size_padded_below_page_rejected(kv_impl: ImplHandle, kv_profile: str,
                                              spec: LayerKVSpec) -> None:
    """``page_size_padded`` smaller than the page: vLLM asserts; an implementation raises
    ValueError (attention pages are padded only in 0.33)."""
    _expect_value_error(kv_impl, f"{spec}", "kv_page_size_bytes", spec, kv_profile)


# ------------------------------------------------------------------ grouping and sizing
EXAMPLE_1 = {"l0": F16, "l1": S16, "l2": S16, "l3": F16, "l4": S16, "l5": S16}
EXAMPLE_2 = {"l0": F16, "l1": S16, "l2": S16, "l3": S16}
# profile -> (groups, num_blocks, tensors (size, shared_by)); 0.10.2: its worked example;
# 0.33.0: recorded from vLLM 0.33.0 (strided assignment within a bucket).
GOLDEN_EXAMPLE_1 = {
    "vllm-0.10": ((("l0", "l3"), ("l1", "l2"), ("l4", "l5")), 512,
                  ((33554432, ("l0", "l1", "l4")), (33554432, ("l3", "l2", "l5")))),
    "vllm-0.33": ((("l0", "l3"), ("l1", "l4"), ("l2", "l5")), 512,
                  ((33554432, ("l0", "l1", "l2")), (33554432, ("l3", "l4", "l5")))),
}
GOLDEN_EXAMPLE_2 = ((("l0",), ("l1",), ("l2",), ("l3",)), 1024,
                    ((67108864, ("l0", "l1", "l2", "l3")),))


def test_worked_example_full_swa_2_to_4(kv_impl: ImplHandle, kv_profile: str) -> None:
    """Worked example 1: l0 F, l1 S, l2 S, l3 F, l4 S, l5 S, page 65536, 64 MiB: three groups of
    two, 512 blocks, two 32 MiB tensors each shared by one layer of every group."""
    groups, num_blocks, tensors = GOLDEN_EXAMPLE_1[kv_profile]
    got = _plan(kv_impl, EXAMPLE_1, 64 * MiB, kv_profile)
    assert got == (groups, 65536, 2, num_blocks, tensors), (
        f"{kv_impl.name}: plan {got}\n vLLM: groups {groups}, page 65536, group_size 2, "
        f"num_blocks {num_blocks}, tensors {tensors}")


def test_worked_example_one_full_three_swa(kv_impl: ImplHandle, kv_profile: str) -> None:
    """Worked example 2: l0 F, l1-l3 S: four single-layer groups, 1024 blocks, one 64 MiB tensor
    shared by all four layers."""
    groups, num_blocks, tensors = GOLDEN_EXAMPLE_2
    got = _plan(kv_impl, EXAMPLE_2, 64 * MiB, kv_profile)
    assert got == (groups, 65536, 1, num_blocks, tensors), f"{kv_impl.name}: plan {got}"


def test_one_spec_is_one_group_tensor_per_layer(kv_impl: ImplHandle, kv_profile: str) -> None:
    """One spec for every layer: one group with all layers, one tensor per layer
    (``num_blocks = memory // page // num_layers``)."""
    layers = {f"layer.{i}": F16 for i in range(3)}
    got = _plan(kv_impl, layers, 1 * MiB, kv_profile)
    want_blocks = MiB // 65536 // 3  # vLLM's num_blocks rule
    assert got == ((tuple(layers),), 65536, 3, want_blocks,
                   tuple((65536 * want_blocks, (name,)) for name in layers)), (
        f"{kv_impl.name}: plan {got}")


@pytest.mark.parametrize(("memory", "override", "blocks"), [
    pytest.param(0, None, 0, id="no-memory"),
    pytest.param(2 * 65536 - 1, None, 0, id="less-than-one-block-per-tensor"),
    pytest.param(64 * MiB, 100, 100, id="override"),
    pytest.param(0, 7, 7, id="override-without-memory"),
])
def test_num_blocks_floor_and_override(kv_impl: ImplHandle, kv_profile: str, memory: int,
                                       override: int | None, blocks: int) -> None:
    """``num_blocks`` is floored at 0 and replaced by ``num_gpu_blocks_override``; the
    tensors follow it (``page_size * num_blocks`` bytes each)."""
    got = _plan(kv_impl, EXAMPLE_1, memory, kv_profile, override)
    assert got[3] == blocks, f"{kv_impl.name}: num_blocks {got[3]}, expected {blocks}"
    assert all(size == 65536 * blocks for size, _ in got[4]), (
        f"{kv_impl.name}: tensor sizes {[s for s, _ in got[4]]} != 65536 * {blocks}")


def test_non_uniform_page_sizes_rejected(kv_impl: ImplHandle, kv_profile: str) -> None:
    """Layers whose page sizes differ: ValueError (vLLM 0.10.2: NotImplementedError; the
    uniform-page-size path is the one specified)."""
    layers = {"l0": F16, "l1": LayerKVSpec("sliding_window", 16, 4, 128, sliding_window=64)}
    _expect_value_error(kv_impl, "layers with page sizes 65536 and 32768", "kv_sizing_plan",
                        layers, 64 * MiB, kv_profile, None)


# ------------------------------------------------------------------ view shapes
VIEW_SHAPES = {
    # (spec, num_blocks, layout) -> profile -> shape in memory order
    "full-NHD": (F16, 3, "NHD", {"vllm-0.10": (2, 3, 16, 8, 128),
                                 "vllm-0.33": (3, 16, 8, 512)}),
    "full-HND": (F16, 3, "HND", {"vllm-0.10": (2, 3, 8, 16, 128),
                                 "vllm-0.33": (3, 8, 16, 512)}),
    "mla-NHD": (MLA, 3, "NHD", {"vllm-0.10": (3, 64, 576), "vllm-0.33": (3, 64, 1, 1152)}),
}


@pytest.mark.parametrize("case", sorted(VIEW_SHAPES))
def test_view_shape_golden(kv_impl: ImplHandle, kv_profile: str, case: str) -> None:
    """0.10.2: FlashAttention ``(2, num_blocks, block_size, num_kv_heads, head_size)`` and its
    HND stride order, MLA ``(num_blocks, block_size, head_size)``; 0.33.0: the
    ``[B, H, N, C bytes]`` view in the LBNHC (NHD) / LBHNC (HND) order."""
    spec, num_blocks, layout, shapes = VIEW_SHAPES[case]
    got = tuple(_call(kv_impl, "kv_cache_view_shape", spec, num_blocks, layout, kv_profile))
    assert got == shapes[kv_profile], f"{kv_impl.name}: {case} shape {got}"


@pytest.mark.kv_profiles("vllm-0.10")
def test_view_shape_flash_attention_block_size_16(kv_impl: ImplHandle,
                                                  kv_profile: str) -> None:
    """vLLM 0.10.2's FlashAttention backend refuses block sizes not a multiple of 16."""
    _expect_value_error(kv_impl, "block_size 8 for FlashAttention", "kv_cache_view_shape",
                        LayerKVSpec("full_attention", 8, 8, 128), 3, "NHD", kv_profile)


# ------------------------------------------------------------------ block sizes (0.33)
def _bs(kind: SpecKind, block_size: int, mamba_cache_mode: str = "none") -> LayerKVSpec:
    if kind == "mamba":
        return LayerKVSpec("mamba", block_size, shapes=((4,),), dtypes=("float32",),
                           mamba_cache_mode=mamba_cache_mode)
    window = 8 if kind == "sliding_window" else None
    return LayerKVSpec(kind, block_size, 8, 128, sliding_window=window,
                       mamba_cache_mode=mamba_cache_mode)


BLOCK_SIZES = [
    # id, groups, enable_prefix_caching, prefix_match_unit, expected (scheduler, hash)
    ("one-group", [_bs("full_attention", 16)], True, None, (16, 16)),
    ("one-group-unit-equal", [_bs("full_attention", 16)], True, 16, (16, 16)),
    ("full2-swa4", [_bs("full_attention", 2), _bs("sliding_window", 4)], True, None, (4, 2)),
    ("full4-swa6-gcd", [_bs("full_attention", 4), _bs("sliding_window", 6)], True, None,
     (12, 2)),
    ("unit-1", [_bs("full_attention", 2), _bs("sliding_window", 4)], True, 1, (4, 1)),
    ("caching-off", [_bs("full_attention", 2), _bs("sliding_window", 4)], False, None, (4, 4)),
    ("mamba-not-align", [_bs("full_attention", 2), _bs("mamba", 4)], True, None, (4, 4)),
    ("mamba-align", [_bs("full_attention", 2), _bs("mamba", 4, mamba_cache_mode="align")],
     True, None, (4, 2)),
]


@ONLY_033
@pytest.mark.parametrize(("groups", "caching", "unit", "expected"),
                         [pytest.param(*c[1:], id=c[0]) for c in BLOCK_SIZES])
def test_block_sizes_golden(kv_impl: ImplHandle, kv_profile: str, groups: list[LayerKVSpec],
                            caching: bool, unit: int | None,
                            expected: tuple[int, int]) -> None:
    """Scheduler block size = lcm of the groups' sizes, hash block size = the
    prefix_match_unit or the gcd (= the scheduler size with caching off or a Mamba group not
    in "align" mode); one group: its block size for both."""
    got = tuple(_call(kv_impl, "kv_block_sizes", groups, caching, unit, kv_profile))
    assert got == expected, f"{kv_impl.name}: (scheduler, hash) = {got}, vLLM {expected}"


@ONLY_033
@pytest.mark.parametrize(("groups", "unit"), [
    pytest.param([_bs("full_attention", 16)], 8, id="one-group-other-unit"),
    pytest.param([_bs("full_attention", 2), _bs("sliding_window", 4)], 4, id="unit-4-vs-2"),
    pytest.param([_bs("full_attention", 4), _bs("sliding_window", 6)], 3, id="unit-3-vs-4"),
])
def test_block_sizes_value_errors(kv_impl: ImplHandle, kv_profile: str,
                                  groups: list[LayerKVSpec], unit: int) -> None:
    """``resolve_kv_cache_block_sizes``'s ValueErrors: a prefix_match_unit other than the
    single group's block size, or one that does not divide every prefix-cacheable group's
    size."""
    _expect_value_error(kv_impl, f"prefix_match_unit={unit} for {groups}", "kv_block_sizes",
                        groups, True, unit, kv_profile)


# ------------------------------------------------------------------ properties vs the reference
def _outcome(fn: Callable[[], _T]) -> Outcome[_T]:
    try:
        return "ok", fn()
    except ValueError as exc:
        return "ValueError", str(exc)


def _same_outcome(kv_impl: ImplHandle, what: str, got: tuple[str, object],
                  want: tuple[str, object]) -> None:
    if got[0] != want[0] or (got[0] == "ok" and got[1] != want[1]):
        raise KVCheckFailure(f"{kv_impl.name}: {what}\n  implementation: {got}\n  "
                             f"reference (vLLM's rules): {want}")


_DTYPES = ("bfloat16", "float16", "float32", "uint8", "float8_e4m3fn")


class _AttentionOptions(TypedDict, total=False):
    sliding_window: int
    attention_chunk_size: int
    head_size_v: int | None


def _attention_specs(profile: str) -> SearchStrategy[LayerKVSpec]:
    from hypothesis import strategies as st

    kinds: SearchStrategy[SpecKind] = st.sampled_from(
        ["full_attention", "sliding_window", "chunked_local_attention", "mla_attention"])

    def build(draw: DrawFn) -> LayerKVSpec:
        kind = draw(kinds)
        head = draw(st.sampled_from([64, 128, 576]))
        kw: _AttentionOptions = {}
        if kind == "sliding_window":
            kw["sliding_window"] = draw(st.integers(1, 4096))
        if kind == "chunked_local_attention":
            kw["attention_chunk_size"] = draw(st.integers(1, 4096))
        if profile == "vllm-0.33" and kind != "mla_attention":
            kw["head_size_v"] = draw(st.one_of(st.none(), st.sampled_from([0, 64, head])))
        # MLA stores one latent: one KV head (vLLM's MLA backends assume it).
        heads = 1 if kind == "mla_attention" else draw(st.integers(1, 16))
        return LayerKVSpec(kind, draw(st.sampled_from([1, 2, 16, 32, 64])), heads, head,
                           draw(st.sampled_from(_DTYPES)), **kw)
    return st.composite(build)()


def _mamba_specs() -> SearchStrategy[LayerKVSpec]:
    from hypothesis import strategies as st

    shapes = st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=3).map(tuple),
                      min_size=1, max_size=3).map(tuple)

    def build(draw: DrawFn) -> LayerKVSpec:
        shp = draw(shapes)
        dtypes = tuple(draw(st.sampled_from(_DTYPES)) for _ in shp)
        padded = draw(st.one_of(st.none(), st.integers(1, 4096)))
        return LayerKVSpec("mamba", draw(st.sampled_from([1, 16, 64])), shapes=shp,
                           dtypes=dtypes, page_size_padded=padded)
    return st.composite(build)()


def test_page_size_matches_reference(kv_impl: ImplHandle, kv_profile: str,
                                     kv_settings: Settings) -> None:
    """Random attention and Mamba specs: the implementation's page size equals the
    reference's (both raise ValueError for a padded page below the page)."""
    from hypothesis import given
    from hypothesis import strategies as st

    @kv_settings
    @given(spec=st.one_of(_attention_specs(kv_profile), _mamba_specs()))
    def run(spec: LayerKVSpec) -> None:
        got = _outcome(lambda: _call(kv_impl, "kv_page_size_bytes", spec, kv_profile))
        want = _outcome(lambda: ref.page_size_bytes(_ref_spec(spec), kv_profile))
        _same_outcome(kv_impl, f"kv_page_size_bytes({spec})", got, want)

    run()


def _models(profile: str) -> SearchStrategy[tuple[dict[str, LayerKVSpec], int, int | None]]:
    """Models whose layers share one page size: specs of one (block_size, heads, head,
    dtype) with different kinds and windows, plus MLA layers of twice the head size (same
    page under both releases), in a random order."""
    from hypothesis import strategies as st

    def build(draw: DrawFn) -> tuple[dict[str, LayerKVSpec], int, int | None]:
        bs = draw(st.sampled_from([1, 2, 16]))
        heads = draw(st.integers(1, 4))
        head = draw(st.sampled_from([8, 64]))
        dtype = draw(st.sampled_from(_DTYPES))
        menu = [LayerKVSpec("full_attention", bs, heads, head, dtype)]
        menu += [LayerKVSpec("sliding_window", bs, heads, head, dtype, sliding_window=w)
                 for w in draw(st.lists(st.integers(1, 64), max_size=2, unique=True))]
        if draw(st.booleans()):
            menu.append(LayerKVSpec("chunked_local_attention", bs, heads, head, dtype,
                                    attention_chunk_size=draw(st.integers(1, 64))))
        if heads == 1 and draw(st.booleans()):
            menu.append(LayerKVSpec("mla_attention", bs, 1, 2 * head, dtype))
        picks = draw(st.lists(st.sampled_from(menu), min_size=1, max_size=12))
        layers = {f"model.layers.{i}": spec for i, spec in enumerate(picks)}
        memory = draw(st.integers(0, 1 << 24))
        override = draw(st.one_of(st.none(), st.none(), st.integers(0, 64)))
        return layers, memory, override
    return st.composite(build)()


def test_sizing_plan_matches_reference_and_invariants(kv_impl: ImplHandle, kv_profile: str,
                                                      kv_settings: Settings) -> None:
    """Random models with a uniform page size: the implementation's plan equals the
    reference's, and it is a valid plan: the groups partition the layers, each group holds
    one spec, every layer lies in exactly one tensor, tensor ``i`` holds the ``i``-th layer
    of every group, ``group_size`` tensors of ``page_size * num_blocks`` bytes, and
    ``num_blocks * page_size * group_size <= memory`` (without an override)."""
    from hypothesis import assume, given, reject

    @kv_settings
    @given(model=_models(kv_profile))
    def run(model: tuple[dict[str, LayerKVSpec], int, int | None]) -> None:
        layers, memory, override = model
        ref_layers = {n: _ref_spec(s) for n, s in layers.items()}
        # One type with different specs: 0.33 makes one UniformTypeKVCacheSpecs group, a
        # path the spec does not model.
        assume(kv_profile != "vllm-0.33" or not ref.is_uniform_type(ref_layers))
        try:
            got = _plan(kv_impl, layers, memory, kv_profile, override)
        except UnsupportedSpec:
            reject()
        want = _ref_plan(layers, memory, kv_profile, override)
        if got != want:
            raise KVCheckFailure(f"{kv_impl.name}: plan for {layers}, memory {memory}, "
                                 f"override {override}\n  implementation: {got}\n  "
                                 f"reference: {want}")
        _check_plan(kv_impl.name, layers, memory, override, got)

    run()


def _check_plan(name: str, layers: Mapping[str, LayerKVSpec], memory: int,
                override: int | None, plan: RefPlanTuple) -> None:
    groups, page, group_size, num_blocks, tensors = plan
    flat = [layer for g in groups for layer in g]
    problems = []
    if sorted(flat) != sorted(layers):
        problems.append(f"groups {groups} do not partition the layers {list(layers)}")
    if any(len({layers[x] for x in g}) != 1 for g in groups if g):
        problems.append("a group mixes specs")
    if group_size != max(len(g) for g in groups) or len(tensors) != group_size:
        problems.append(f"group_size {group_size}, {len(tensors)} tensors, groups {groups}")
    shared = [x for _, sb in tensors for x in sb]
    if sorted(shared) != sorted(layers):
        problems.append("a layer is in no tensor or in several")
    for i, (size, shared_by) in enumerate(tensors):
        if size != page * num_blocks:
            problems.append(f"tensor {i} has {size} bytes, not page * num_blocks")
        if tuple(shared_by) != tuple(g[i] for g in groups if i < len(g)):
            problems.append(f"tensor {i} is not shared by the {i}-th layer of every group")
    if override is None and num_blocks * page * group_size > memory:
        problems.append(f"{num_blocks} blocks * {page} B * {group_size} > {memory} B")
    if override is not None and num_blocks != override:
        problems.append(f"num_blocks {num_blocks} ignores num_gpu_blocks_override {override}")
    if problems:
        raise KVCheckFailure(f"{name}: invalid plan {plan}: " + "; ".join(problems))


def test_view_shape_matches_reference(kv_impl: ImplHandle, kv_profile: str,
                                      kv_settings: Settings) -> None:
    """Random attention specs and pool sizes: the view shape equals the reference's, and the
    view covers the layer's blocks exactly (elements x dtype size, or bytes under 0.33, =
    ``num_blocks * page_size``)."""
    from hypothesis import given
    from hypothesis import strategies as st

    @kv_settings
    @given(spec=_attention_specs(kv_profile), num_blocks=st.integers(0, 50),
           layout=st.sampled_from(["NHD", "HND"]))
    def run(spec: LayerKVSpec, num_blocks: int, layout: str) -> None:
        got = _outcome(lambda: tuple(_call(kv_impl, "kv_cache_view_shape", spec, num_blocks,
                                           layout, kv_profile)))
        want = _outcome(lambda: ref.kv_cache_view_shape(
            _ref_spec(spec), num_blocks, "NHD" if layout == "NHD" else "HND", kv_profile))
        _same_outcome(kv_impl, f"kv_cache_view_shape({spec}, {num_blocks}, {layout})", got,
                      want)
        if got[0] == "ok":
            unit = 1 if kv_profile == "vllm-0.33" else ref.dtype_size(spec.dtype)
            page = ref.page_size_bytes(_ref_spec(spec), kv_profile)
            assert math.prod(got[1]) * unit == num_blocks * page, (
                f"{kv_impl.name}: view {got[1]} does not cover {num_blocks} pages of {page} B")

    run()


@ONLY_033
def test_block_sizes_match_reference(kv_impl: ImplHandle, kv_profile: str,
                                     kv_settings: Settings) -> None:
    """Random groups (0.33): ``(scheduler, hash)`` equals the reference's, the scheduler
    size is a multiple of every group's size and the hash size divides every
    prefix-cacheable group's size (or both raise ValueError)."""
    from hypothesis import given
    from hypothesis import strategies as st

    group = st.builds(
        _bs, st.sampled_from(["full_attention", "sliding_window", "mamba"]),
        st.sampled_from([1, 2, 3, 4, 6, 8, 16, 32]),
        mamba_cache_mode=st.sampled_from(["none", "align"]))

    @kv_settings
    @given(groups=st.lists(group, min_size=1, max_size=4), caching=st.booleans(),
           unit=st.one_of(st.none(), st.sampled_from([1, 2, 4, 16])))
    def run(groups: list[LayerKVSpec], caching: bool, unit: int | None) -> None:
        got = _outcome(lambda: tuple(_call(kv_impl, "kv_block_sizes", groups, caching, unit,
                                           kv_profile)))
        want = _outcome(lambda: ref.resolve_block_sizes(
            [_ref_spec(g) for g in groups], enable_prefix_caching=caching,
            prefix_match_unit=unit, profile=kv_profile))
        _same_outcome(kv_impl, f"kv_block_sizes({groups}, caching={caching}, unit={unit})",
                      got, want)
        if got[0] == "ok":
            scheduler, hashing = got[1]
            sizes = [g.block_size for g in groups]
            assert all(scheduler % s == 0 for s in sizes)
            assert all(s % hashing == 0 for s in sizes) or not caching or hashing == scheduler

    run()


# ------------------------------------------------------------------ prefix caching, chunked prefill
#: An answer of ``kv_feature_defaults``: (prefix caching, chunked prefill, sorted reasons).
Features = tuple[bool, bool, tuple[str, ...]]
#: The skip of a module that declares ``sizing`` without the optional function.
MISSING_FEATURE_DEFAULTS = (
    "{name} declares 'sizing' without kv_feature_defaults (an optional sizing function, "
    "kvcheck.conformance.sizing_protocol.SIZING_OPTIONAL_FUNCTIONS); to check it, define "
    "kv_feature_defaults(model: KVModelFacts, profile: str) -> KVFeatureDefaults at module "
    "level (SupportsSizing; docs/writing-an-adapter.md)")


def _features(kv_impl: ImplHandle, model: KVModelFacts, profile: str) -> Features:
    """The implementation's ``kv_feature_defaults(model, profile)``, its answer's type
    checked; a skip naming the fix when the module does not define the function."""
    if not callable(getattr(kv_impl.module, "kv_feature_defaults", None)):
        pytest.skip(MISSING_FEATURE_DEFAULTS.format(name=kv_impl.name))
    fn: Callable[..., object] = kv_impl.module.kv_feature_defaults
    answer = call_with_private_args(kv_impl.limit, "kv_feature_defaults", fn, model, profile)
    return feature_defaults_answer(kv_impl.name, (model, profile), answer)


P, G = "pooling", "generate"
OFF: tuple[str, ...] = ()
#: id -> profile -> (model facts, expected (prefix caching, chunked prefill, reasons) or
#: "ValueError"). A case with one profile runs under that profile only. Expectations written
#: from vLLM 0.33.0 (``config/model.py`` ``attn_type`` 2173-2190,
#: ``is_chunked_prefill_supported`` 2193-2236, ``is_prefix_caching_supported`` 2239-2291;
#: ``engine/arg_utils.py:3041-3095`` defaults, an explicit choice wins;
#: ``config/scheduler.py:295-304``; ``models/config.py:750-787`` Mamba;
#: ``v1/engine/core.py:259-280`` non-causal layers) and 0.10.2
#: (``engine/arg_utils.py:1615-1642`` ``_set_default_args_v1``; ``config/__init__.py:3443-3484``
#: forced off;
#: ``config/__init__.py:3681-3701`` + ``models/config.py:289-311`` Mamba / hybrid).
FEATURE_CASES: dict[str, dict[str, tuple[KVModelFacts, Features | str]]] = {
    # generate decoder: 0.33 model.py:2236 / 2291; 0.10.2 arg_utils.py:1621-1625
    "decoder-generate": {"vllm-0.33": (KVModelFacts(), (True, True, OFF)),
                         "vllm-0.10": (KVModelFacts(), (True, True, OFF))},
    # Whisper: 0.33 model.py:2231-2233, 2286-2288 (+ scheduler.py:296-299); 0.10.2
    # config/__init__.py:3456-3466 then 3476-3484
    "whisper-encoder-decoder": {
        "vllm-0.33": (KVModelFacts(is_encoder_decoder=True),
                      (False, False, ("encoder_decoder",))),
        "vllm-0.10": (KVModelFacts(is_encoder_decoder=True),
                      (False, False, ("encoder_decoder",)))},
    # user asks for both: 0.33 arg_utils.py:3047-3091 keeps them, scheduler.py:296-299 turns
    # chunked prefill off only; 0.10.2 config/__init__.py:3476-3484 forces both off
    "whisper-user-asks-both": {
        "vllm-0.33": (KVModelFacts(is_encoder_decoder=True, enable_prefix_caching=True,
                                   enable_chunked_prefill=True),
                      (True, False, ("encoder_decoder",))),
        "vllm-0.10": (KVModelFacts(is_encoder_decoder=True, enable_prefix_caching=True,
                                   enable_chunked_prefill=True),
                      (False, False, ("encoder_decoder",)))},
    # hf is_causal False: 0.33 model.py:2182 encoder_only -> 2198-2203, 2244-2249; 0.10.2
    # arg_utils.py:1631-1642 default off, config/__init__.py:3452-3455 forced off
    "non-causal-pooling": {
        "vllm-0.33": (KVModelFacts(P, is_causal=False), (False, False, ("encoder_only",))),
        "vllm-0.10": (KVModelFacts(P, is_causal=False), (False, False, ("non_causal",)))},
    # explicit True on a non-causal pooling model: 0.33 arg_utils.py:3064-3073, 3082-3091 warn
    # and keep it; 0.10.2 config/__init__.py:3452-3455 + 3476-3484 force both off
    "non-causal-pooling-user-asks-both": {
        "vllm-0.33": (KVModelFacts(P, is_causal=False, enable_prefix_caching=True,
                                   enable_chunked_prefill=True), (True, True, OFF)),
        "vllm-0.10": (KVModelFacts(P, is_causal=False, enable_prefix_caching=True,
                                   enable_chunked_prefill=True),
                      (False, False, ("non_causal",)))},
    # a CLS-pooling class (BERT): 0.33 model.py:2178-2179 encoder_only; 0.10.2 its
    # default_pooling_type CLS != "last": config/__init__.py:3447-3451
    "cls-pooling": {
        "vllm-0.33": (KVModelFacts(P, default_seq_pooling_type="CLS"),
                      (False, False, ("encoder_only",))),
        "vllm-0.10": (KVModelFacts(P, default_pooling_type="CLS"),
                      (False, False, ("pooling_type",)))},
    # 0.33 attn_type reads the class default, not the user's LAST: model.py:2177-2179
    "cls-class-user-last": {
        "vllm-0.33": (KVModelFacts(P, default_seq_pooling_type="CLS", seq_pooling_type="LAST"),
                      (False, False, ("encoder_only",)))},
    # causal MEAN: 0.33 model.py:2205-2216, 2251-2262; 0.10.2 arg_utils.py:1631-1642,
    # config/__init__.py:3447-3451
    "mean-pooling-causal": {
        "vllm-0.33": (KVModelFacts(P, seq_pooling_type="MEAN"),
                      (False, False, ("pooling_type",))),
        "vllm-0.10": (KVModelFacts(P, pooling_type="MEAN"), (False, False, ("pooling_type",)))},
    # causal LAST: 0.33 model.py:2217-2224, 2263-2270; 0.10.2 arg_utils.py:1631-1642
    # (lower-cased: "last")
    "last-pooling-causal": {
        "vllm-0.33": (KVModelFacts(P, seq_pooling_type="LAST"), (True, True, OFF)),
        "vllm-0.10": (KVModelFacts(P, pooling_type="last"), (True, True, OFF))},
    # STEP token pooling (reward models): 0.33 model.py:2208 (tok_pooling_type == "STEP");
    # 0.10.2 STEP != "last"
    "step-pooling": {
        "vllm-0.33": (KVModelFacts(P, tok_pooling_type="STEP"),
                      (False, False, ("pooling_type",))),
        "vllm-0.10": (KVModelFacts(P, pooling_type="STEP"), (False, False, ("pooling_type",)))},
    # an attention-free pooling class (Terratorch): 0.33 model.py:2228 (chunked: attn_type !=
    # encoder_decoder), 2274 (no prefix caching)
    "attention-free-pooling-class": {
        "vllm-0.33": (KVModelFacts(P, model_attn_type="attention_free"),
                      (False, True, ("attention_free",)))},
    # hybrid generate: 0.33 model.py:2277-2279, models/config.py:763-779 (chunked on: no
    # assertion); 0.10.2 config/__init__.py:3700-3701 -> models/config.py:346 -> 309
    "hybrid-generate": {
        "vllm-0.33": (KVModelFacts(is_hybrid=True), (True, True, OFF)),
        "vllm-0.10": (KVModelFacts(is_hybrid=True), (False, True, ("hybrid",)))},
    # hybrid with chunked prefill off: 0.33 models/config.py:772 asserts; 0.10.2
    # arg_utils.py:1622 turns it back on, models/config.py:309 turns prefix caching off
    "hybrid-user-disables-chunked": {
        "vllm-0.33": (KVModelFacts(is_hybrid=True, enable_chunked_prefill=False), "ValueError"),
        "vllm-0.10": (KVModelFacts(is_hybrid=True, enable_chunked_prefill=False),
                      (False, True, ("hybrid",)))},
    # Mamba: 0.33 model.py:2280-2285; 0.10.2 models/config.py:431-433 -> 309
    "attention-free-mamba": {
        "vllm-0.33": (KVModelFacts(is_attention_free=True),
                      (False, True, ("attention_free",))),
        "vllm-0.10": (KVModelFacts(is_attention_free=True),
                      (False, True, ("attention_free",)))},
    # explicit prefix caching on Mamba: 0.33 arg_utils.py:3075-3091 keeps it; 0.10.2
    # models/config.py:309 forces it off
    "attention-free-user-asks-prefix": {
        "vllm-0.33": (KVModelFacts(is_attention_free=True, enable_prefix_caching=True),
                      (True, True, OFF)),
        "vllm-0.10": (KVModelFacts(is_attention_free=True, enable_prefix_caching=True),
                      (False, True, ("attention_free",)))},
    # explicit chunked prefill off: 0.33 arg_utils.py:3047-3063 keeps it (a warning); 0.10.2
    # arg_utils.py:1622 sets it True whatever the user said (V1 always chunks)
    "user-disables-chunked-prefill": {
        "vllm-0.33": (KVModelFacts(enable_chunked_prefill=False), (True, False, ("user",))),
        "vllm-0.10": (KVModelFacts(enable_chunked_prefill=False), (True, True, OFF))},
    # explicit prefix caching off: 0.33 arg_utils.py:3075-3091; 0.10.2 arg_utils.py:1624-1625
    "user-disables-prefix-caching": {
        "vllm-0.33": (KVModelFacts(enable_prefix_caching=False), (False, True, ("user",))),
        "vllm-0.10": (KVModelFacts(enable_prefix_caching=False), (False, True, ("user",)))},
    # Prefix LM (a FullAttentionSpec with non_causal=True): 0.33 v1/engine/core.py:265-280
    # forces both off even when asked
    "prefix-lm-non-causal-layers": {
        "vllm-0.33": (KVModelFacts(non_causal_layers=True, enable_prefix_caching=True,
                                   enable_chunked_prefill=True),
                      (False, False, ("non_causal_layers",)))},
}


def _feature_params() -> list[object]:
    out: list[object] = []
    for case, by_profile in FEATURE_CASES.items():
        marks = [pytest.mark.kv_profiles(*by_profile)] if len(by_profile) == 1 else []
        out.append(pytest.param(by_profile, id=case, marks=marks))
    return out


@pytest.mark.parametrize("by_profile", _feature_params())
def test_feature_defaults_golden(kv_impl: ImplHandle, kv_profile: str,
                                 by_profile: dict[str, tuple[KVModelFacts, Features | str]]
                                 ) -> None:
    """The prefix caching and chunked prefill vLLM runs a model with, and why one is off:
    decoder, Whisper, non-causal / CLS / MEAN / LAST / STEP pooling, hybrid, Mamba, Prefix LM,
    explicit choices (0.33 keeps them; 0.10.2 forces non-causal pooling and encoder-decoder
    models off and always chunks a generate model); 0.33's Mamba assertion is a ValueError."""
    model, want = by_profile[kv_profile]
    if want == "ValueError":
        if not callable(getattr(kv_impl.module, "kv_feature_defaults", None)):
            pytest.skip(MISSING_FEATURE_DEFAULTS.format(name=kv_impl.name))
        _expect_value_error(kv_impl, f"{model}", "kv_feature_defaults", model, kv_profile)
        return
    got = _features(kv_impl, model, kv_profile)
    assert got == want, (f"{kv_impl.name}: kv_feature_defaults({model}) = (prefix caching, "
                         f"chunked prefill, reasons) {got}; vLLM: {want}")


@pytest.mark.parametrize(("changes", "field"), [
    pytest.param({"runner": "embed"}, "runner", id="unknown-runner"),
    pytest.param({"enable_prefix_caching": "yes"}, "enable_prefix_caching", id="flag-not-bool"),
    pytest.param({"runner": P, "seq_pooling_type": "SUM"}, "seq_pooling_type",
                 id="unknown-seq-pooling-type", marks=ONLY_033),
    pytest.param({"runner": P, "pooling_type": "MEAN"}, "pooling_type",
                 id="0.10-pooling_type-under-0.33", marks=ONLY_033),
    pytest.param({"runner": P, "pooling_type": "SUM"}, "pooling_type",
                 id="unknown-pooling-type", marks=ONLY_010),
    pytest.param({"runner": P, "seq_pooling_type": "MEAN"}, "seq_pooling_type",
                 id="0.33-seq_pooling_type-under-0.10", marks=ONLY_010),
    pytest.param({"non_causal_layers": True}, "non_causal_layers",
                 id="0.33-non_causal_layers-under-0.10", marks=ONLY_010),
])
# Any: changes of the wrong type on purpose, for dataclasses.replace (typed per field).
def test_feature_defaults_bad_input(kv_impl: ImplHandle, kv_profile: str,
                                    changes: dict[str, Any], field: str) -> None:
    """An unknown runner or pooling type, a flag that is not a bool, or a field the profile's
    vLLM does not have: a ValueError whose message names the field."""
    if not callable(getattr(kv_impl.module, "kv_feature_defaults", None)):
        pytest.skip(MISSING_FEATURE_DEFAULTS.format(name=kv_impl.name))
    model = replace(KVModelFacts(), **changes)
    try:
        result = _call(kv_impl, "kv_feature_defaults", model, kv_profile)
    except ValueError as exc:
        message = str(exc)
    else:
        raise KVCheckFailure(f"{kv_impl.name}: kv_feature_defaults accepted {changes} "
                             f"(returned {result!r}); vLLM has no such value under "
                             f"{kv_profile}: raise ValueError naming the field")
    if field not in message:
        raise KVCheckFailure(f"{kv_impl.name}: the ValueError for {changes} does not name the "
                             f"field {field!r}: {message}")


def _model_facts(profile: str) -> SearchStrategy[KVModelFacts]:
    """Random model facts valid under ``profile``."""
    from hypothesis import strategies as st

    flags = st.sampled_from([None, True, False])

    def build(draw: DrawFn) -> KVModelFacts:
        base = KVModelFacts(
            draw(st.sampled_from(["generate", "pooling"])), draw(st.booleans()),
            draw(st.booleans()), draw(st.booleans()), draw(st.booleans()), draw(flags),
            draw(flags))
        if profile == "vllm-0.10":
            types = st.one_of(st.none(), st.sampled_from(["LAST", "last", "MEAN", "CLS",
                                                          "ALL", "STEP"]))
            return replace(base, pooling_type=draw(types), default_pooling_type=draw(types))
        seq = st.one_of(st.none(), st.sampled_from(ref_features.SEQ_POOLING_TYPES))
        tok = st.one_of(st.none(), st.sampled_from(ref_features.TOK_POOLING_TYPES))
        return replace(base, seq_pooling_type=draw(seq), tok_pooling_type=draw(tok),
                       default_seq_pooling_type=draw(seq), default_tok_pooling_type=draw(tok),
                       model_attn_type=draw(st.one_of(
                           st.none(), st.sampled_from(ref_features.MODEL_ATTN_TYPES))),
                       non_causal_layers=draw(st.booleans()))
    return st.composite(build)()


def test_feature_defaults_match_reference(kv_impl: ImplHandle, kv_profile: str,
                                          kv_settings: Settings) -> None:
    """Random model facts and user choices: the same settings and reasons as the reference,
    or a ValueError from both (0.33's Mamba assertion)."""
    from hypothesis import given

    if not callable(getattr(kv_impl.module, "kv_feature_defaults", None)):
        pytest.skip(MISSING_FEATURE_DEFAULTS.format(name=kv_impl.name))

    @kv_settings
    @given(model=_model_facts(kv_profile))
    def run(model: KVModelFacts) -> None:
        got = _outcome(lambda: _features(kv_impl, model, kv_profile))
        want = _outcome(lambda: _reference_features(model, kv_profile))
        _same_outcome(kv_impl, f"kv_feature_defaults({model})", got, want)

    run()


def _reference_features(model: KVModelFacts, profile: str) -> Features:
    answer = ref_features.kv_feature_defaults(model, profile)
    return answer.enable_prefix_caching, answer.enable_chunked_prefill, answer.reasons
