"""The reference ``KVCacheManager``'s decode context parallelism (``dcp_world_size``) and vLLM
0.33's ``prefix_match_unit`` (docs/semantics.md#decode-context-parallelism-and-prefix_match_unit).

Expected values are vLLM's: the block sizes come from running vLLM 0.33.0's
``resolve_kv_cache_block_sizes`` on these layouts (``kvcheck.adapters.vllm_kv_config``; the
values are copied here), the refusals name the assertions and ValueErrors of vLLM 0.33.0 and
0.10.2. The answers of whole scenarios on vLLM's own ``KVCacheManager`` are the suite's
(``kvcheck.conformance.hybrid_knobs``).
"""

from __future__ import annotations

import itertools

import pytest

from kvcheck.reference_impl.batch_metadata import build_batch
from kvcheck.reference_impl.errors import KVCacheConfigError, KVCacheMisuseError
from kvcheck.reference_impl.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager
from kvcheck.reference_impl.sizing import LayerKVSpec, resolve_block_sizes

F2, F4, F8 = FullAttentionSpec(2), FullAttentionSpec(4), FullAttentionSpec(8)
SWA4 = SlidingWindowSpec(4, 4)
M4 = MambaSpec(4, "align")


def _sizes(specs: list[KVCacheSpec], **kw: object) -> tuple[int, int]:
    m = KVCacheManager(40, kv_cache_specs=specs, **kw)  # type: ignore[arg-type]
    return m.scheduler_block_size, m.hash_block_size


# (specs, dcp, prefix_match_unit, caching) -> vLLM 0.33.0's (scheduler, hash) block sizes.
_V033 = [
    ([F4], 2, None, True, (8, 8)),
    ([F4], 2, 8, True, (8, 8)),  # the single group's own (scaled) size is allowed
    ([M4], 2, None, True, (4, 4)),  # Mamba is not sharded
    ([F2, F4], 2, None, True, (8, 4)),
    ([F2, F4], 2, 2, True, (8, 2)),
    ([F4, SWA4], 1, 2, True, (4, 2)),
    ([F4, SWA4], 1, 3, False, (4, 4)),  # caching off: the unit is not checked
    ([F4], 1, 2, False, (4, 4)),
]


@pytest.mark.parametrize(("specs", "dcp", "unit", "caching", "want"), _V033)
def test_block_sizes_are_vllm_033s(specs: list[KVCacheSpec], dcp: int, unit: int | None,
                                   caching: bool, want: tuple[int, int]) -> None:
    assert _sizes(specs, dcp_world_size=dcp, prefix_match_unit=unit,
                  enable_caching=caching) == want


def test_dcp_scales_sharded_groups_only() -> None:
    """0.33 scales attention groups, not Mamba; 0.10.2 scales every manager."""
    m = KVCacheManager(40, kv_cache_specs=[F4], dcp_world_size=4)
    assert [s.block_size for s in m.kv_cache_specs] == [16]
    m = KVCacheManager(40, kv_cache_specs=[F4, M4], dcp_world_size=2, enable_caching=False)
    assert [s.block_size for s in m.kv_cache_specs] == [8, 4]
    m = KVCacheManager(40, kv_cache_specs=[F4, SWA4], dcp_world_size=2, enable_caching=False,
                       profile="vllm-0.10")
    assert [s.block_size for s in m.kv_cache_specs] == [8, 8]


def test_a_block_holds_block_size_times_dcp_tokens() -> None:
    """10 tokens at block size 2 and DCP 2: 3 blocks, 2 hashes of 4 tokens, hits of 8."""
    for profile in ("vllm-0.33", "vllm-0.10"):
        m = KVCacheManager(12, kv_cache_specs=[F2], dcp_world_size=2, profile=profile)
        a = m.make_request("a", list(range(10)))
        assert len(a.block_hashes) == 2
        assert [len(g) for g in m.allocate_slots(a, 10)] == [3]
        a.num_computed_tokens = 10
        m.free(a)
        b = m.make_request("b", list(range(10)) + [7])
        blocks, num = m.get_computed_blocks(b)
        assert (num, [len(g) for g in blocks]) == (8, [2]), profile


@pytest.mark.parametrize(("kw", "words"), [
    ({"kv_cache_specs": [F2, SWA4], "dcp_world_size": 2},
     "DCP with hybrid KV cache layouts only supports"),
    ({"kv_cache_specs": [SWA4], "dcp_world_size": 2}, "DCP not support sliding window attn"),
    ({"kv_cache_specs": [ChunkedLocalAttentionSpec(4, 8)], "dcp_world_size": 2},
     "DCP not support chunked local attn"),
    ({"kv_cache_specs": [F2, F2], "dcp_world_size": 2, "profile": "vllm-0.10"},
     "kv_cache_manager.py:113-114"),
    ({"kv_cache_specs": [F4, SWA4], "prefix_match_unit": 3},
     "must be divisible by prefix_match_unit"),
    ({"kv_cache_specs": [F4], "prefix_match_unit": 2}, "with a single KV cache group"),
    ({"kv_cache_specs": [F4, SWA4], "prefix_match_unit": 2, "profile": "vllm-0.10"},
     "vLLM 0.33 CacheConfig field"),
    ({"kv_cache_specs": [F4], "dcp_world_size": 0}, "dcp_world_size must be an int >= 1"),
    ({"kv_cache_specs": [F4], "prefix_match_unit": 0}, "prefix_match_unit must be an int >= 1"),
])
def test_refusals_name_the_rule(kw: dict[str, object], words: str) -> None:
    with pytest.raises(KVCacheMisuseError, match=words):
        KVCacheManager(40, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("dcp", "mamba_block", "sizes", "enabled"), [
    (1, 4, (4, 4), False),  # a Mamba block equal to the hash block: off without DCP
    (1, 8, (8, 4), True),
    (2, 4, (8, 4), True),  # full attention scaled to 8, Mamba stays at 4 = the hash block
    (2, 8, (8, 8), True),
])
def test_mamba_under_dcp_has_fine_grained_hits_at_the_hash_block(
        dcp: int, mamba_block: int, sizes: tuple[int, int], enabled: bool) -> None:
    """Full attention 4 beside Mamba "align": the scheduler and hash blocks and whether
    fine-grained hits are on, as vLLM 0.33.0's ``resolve_kv_cache_block_sizes`` and
    ``partial_hash_hits_enabled`` answered for these groups (DCP takes a Mamba block *equal*
    to the hash block, without DCP it must be larger)."""
    m = KVCacheManager(40, kv_cache_specs=[F4, MambaSpec(mamba_block, "align")],
                       dcp_world_size=dcp)
    assert (m.scheduler_block_size, m.hash_block_size) == sizes
    assert m.enable_partial_hash_hits is enabled


def test_v010_mamba_under_dcp_adds_speculative_slots_at_its_own_block_size() -> None:
    """vLLM 0.10.2, caching off, DCP 2, Mamba 2 with one speculative block: its manager's
    block covers 4 tokens but the speculative slots are 2 (the spec's block), so 10 tokens
    take cdiv(10 + 2, 4) = 3 blocks (vLLM 0.10.2's answer,
    hybrid_knobs.dcp_mamba_speculative_block_with_caching_off); 0.33 leaves Mamba at 2: 6."""
    for profile, want in (("vllm-0.10", [3, 3]), ("vllm-0.33", [3, 6])):
        m = KVCacheManager(40, kv_cache_specs=[F2, MambaSpec(2, num_speculative_blocks=1)],
                           dcp_world_size=2, enable_caching=False, profile=profile)
        a = m.make_request("a", list(range(10)))
        assert [len(g) for g in m.allocate_slots(a, 10)] == want, profile


def test_caching_off_takes_any_layout_under_dcp() -> None:
    """vLLM's no-prefix-cache coordinator asserts nothing about DCP."""
    m = KVCacheManager(40, kv_cache_specs=[F2, SWA4], dcp_world_size=2, enable_caching=False)
    assert (m.scheduler_block_size, m.hash_block_size) == (8, 8)


@pytest.mark.parametrize(("dcp", "interleave"), [(2, 1), (4, 1), (2, 2)])
def test_manager_tables_agree_with_the_dcp_slot_mapping(dcp: int, interleave: int) -> None:
    """A block id of the manager covers ``block_size * dcp`` tokens of the request, as a row
    entry of the worker's block table does under DCP (``build_batch``): every token lands, on
    the rank that stores it, in the block the manager gave its position, at an offset below
    ``block_size``."""
    bs, n = 4, 29
    m = KVCacheManager(32, kv_cache_specs=[FullAttentionSpec(bs)], dcp_world_size=dcp)
    req = m.make_request("r", list(range(n)))
    (ids,) = m.allocate_slots(req, n)
    row = [b.block_id for b in ids]
    assert len(row) == -(-n // (bs * dcp))
    owners = {}
    for rank in range(dcp):
        meta = build_batch([row], [0], [n], bs, dcp_world_size=dcp, dcp_rank=rank,
                           cp_kv_cache_interleave_size=interleave)
        for pos, slot in zip(meta.positions.tolist(), meta.slot_mapping.tolist(), strict=False):
            if slot < 0:
                continue
            assert slot // bs == row[pos // (bs * dcp)], (pos, slot, rank)
            owners[pos] = owners.get(pos, 0) + 1
    assert owners == dict.fromkeys(range(n), 1)  # each token on exactly one rank


def _layer(spec: KVCacheSpec) -> LayerKVSpec:
    if isinstance(spec, MambaSpec):
        return LayerKVSpec("mamba", spec.block_size, shapes=((4,),), dtypes=("float32",),
                           mamba_cache_mode=spec.mamba_cache_mode)
    if isinstance(spec, SlidingWindowSpec):
        return LayerKVSpec("sliding_window", spec.block_size, 8, 128,
                           sliding_window=spec.sliding_window)
    return LayerKVSpec("full_attention", spec.block_size, 8, 128)


@pytest.mark.parametrize("specs", [[F4], [F2, F4], [F4, SWA4], [F8, SWA4], [F4, M4],
                                   [F2, SlidingWindowSpec(8, 8), F4]])
def test_sizing_and_the_manager_resolve_the_same_block_sizes(specs: list[KVCacheSpec]) -> None:
    """``reference_impl.sizing.resolve_block_sizes`` (a model's groups) and the manager
    (``KVCacheManager.scheduler_block_size`` / ``hash_block_size``) agree, refusals included,
    for every ``prefix_match_unit`` up to 8, caching on and off (DCP 1: the sizing function's
    groups carry their per-rank block sizes)."""
    layers = [_layer(s) for s in specs]
    for unit, caching in itertools.product([None, *range(1, 9)], [True, False]):
        try:
            want: object = resolve_block_sizes(layers, enable_prefix_caching=caching,
                                               prefix_match_unit=unit)
        except KVCacheConfigError:  # vLLM's ValueError
            want = "ValueError"
        try:
            got: object = _sizes(specs, prefix_match_unit=unit, enable_caching=caching)
        except KVCacheMisuseError:
            got = "ValueError"
        assert got == want, (specs, unit, caching)


def test_the_knobs_need_the_grouped_protocol() -> None:
    """A flat spec (no ``kv_cache_groups``) counts a block as ``block_size`` tokens all
    through the harness: DCP or a ``prefix_match_unit`` there is an input error naming the
    fix."""
    from kvcheck.adapters.reference import ReferenceManager
    from kvcheck.conformance.protocol import KVCacheGroupSpec
    from kvcheck.conformance.protocol import KVCacheSpec as Spec
    from kvcheck.errors import KVCheckInputError

    for knobs in ({"dcp_world_size": 2}, {"prefix_match_unit": 4}):
        with pytest.raises(KVCheckInputError, match="give the groups"):
            ReferenceManager(Spec(num_blocks=8, block_size=4, **knobs))  # type: ignore[arg-type]
    grouped = Spec(num_blocks=8, block_size=4, dcp_world_size=2,
                   kv_cache_groups=(KVCacheGroupSpec("full_attention", 4),))
    assert ReferenceManager(grouped).manager.block_size == 8
