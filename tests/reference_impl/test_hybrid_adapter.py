"""The reference adapter's grouped form (``SupportsKVCacheGroups``): per-group lists, event
group fields per profile, declined layouts, and the single-group form: the same adapter and
engine, with group 0 unwrapped to flat lists."""

from __future__ import annotations

import pytest

from kvcheck.adapters.reference import (
    IMPL_INFO,
    ReferenceManager,
    make_kv_cache_manager,
)
from kvcheck.conformance.protocol import (
    KVCacheGroupSpec,
    KVCacheSpec,
    RequestView,
    UnsupportedSpec,
)
from kvcheck.errors import KVCheckInputError
from kvcheck.reference_impl.kv_cache_coordinator import (
    HybridKVCacheCoordinator,
    UnitaryKVCacheCoordinator,
)

FULL = KVCacheGroupSpec("full_attention")
SWA4 = KVCacheGroupSpec("sliding_window", sliding_window=4)
CHUNK4 = KVCacheGroupSpec("chunked_local_attention", attention_chunk_size=4)


def spec(*groups: KVCacheGroupSpec, profile: str = "vllm-0.33", **kw: object) -> KVCacheSpec:
    return KVCacheSpec(num_blocks=16, block_size=2, enable_kv_cache_events=True,
                       profile=profile, kv_cache_groups=groups, **kw)  # type: ignore[arg-type]


def test_capabilities_declared() -> None:
    assert {"kv_cache_groups", "sliding_window", "chunked_local_attention"} <= (
        IMPL_INFO.capabilities)


def test_single_group_spec_unwraps_group_0() -> None:
    m = make_kv_cache_manager(KVCacheSpec(num_blocks=8, block_size=2))
    assert type(m) is ReferenceManager
    assert type(m.manager.coordinator) is UnitaryKVCacheCoordinator
    view = RequestView("A", (1, 2, 3))
    assert m.get_computed_blocks(view) == ([], 0)
    assert m.allocate_slots(view, 3) == [1, 2]
    assert m.get_block_ids("A") == [1, 2]
    assert m.manager.get_block_ids("A") == ([1, 2],)  # the engine answers per group
    m.allocate_slots(RequestView("B", (1, 2, 3, 4, 5)), 5)
    view = RequestView("C", (1, 2, 3, 4, 5))
    assert m.get_computed_blocks(view) == ([1, 4], 4)  # A's [1, 2], then B's [3, 4]
    assert m.allocate_slots(view, 1, 4, [1, 4]) == [6]  # flat hits in, flat blocks out
    assert m.get_block_ids("C") == [1, 4, 6]


def test_grouped_lists_g1_rows_1_to_3() -> None:
    """G1 (0.33): prefill 10, then one decode step, through the protocol."""
    m = make_kv_cache_manager(spec(FULL, SWA4))
    assert type(m) is ReferenceManager  # one adapter class for every spec
    assert type(m.manager.coordinator) is HybridKVCacheCoordinator
    prompt = tuple(range(100, 110))
    view = RequestView("A", prompt)
    hits, num = m.get_computed_blocks(view)
    assert (hits, num) == ([[], []], 0)
    assert m.allocate_slots(view, 10, num, hits) == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]
    stored = m.take_events()
    assert [(e["type"], e["group_idx"], e["kv_cache_spec_kind"],
             e["kv_cache_spec_sliding_window"]) for e in stored] == [
        ("BlockStored", 0, "full_attention", None), ("BlockStored", 1, "sliding_window", 4)]
    view = RequestView("A", prompt, (110,), num_computed_tokens=10)
    assert m.allocate_slots(view, 1) == [[11], [12]]
    assert m.get_block_ids("A") == [[1, 2, 3, 4, 5, 11], [0, 0, 0, 9, 10, 12]]
    assert m.free_block_ids() == [13, 14, 15, 8, 7, 6]
    assert [m.ref_cnt(i) for i in (0, 8, 9)] == [0, 0, 1]
    assert len(m.block_hashes("A")) == 5
    m.check_invariants()
    m.free("A")
    assert m.get_block_ids("A") == [[], []]
    assert m.num_free_blocks() == 15


def test_events_carry_no_group_field_under_v010() -> None:
    m = make_kv_cache_manager(spec(FULL, SWA4, profile="vllm-0.10"))
    view = RequestView("A", tuple(range(100, 110)))
    m.allocate_slots(view, 10, 0, [[], []])
    events = m.take_events()
    assert [e["type"] for e in events] == ["BlockStored", "BlockStored"]
    assert all("group_idx" not in e and "kv_cache_spec_kind" not in e for e in events)


def test_layouts_vllm_refuses_are_declined() -> None:
    with pytest.raises(UnsupportedSpec, match="one full-attention spec and one other"):
        make_kv_cache_manager(spec(SWA4, KVCacheGroupSpec("sliding_window", sliding_window=8),
                                   profile="vllm-0.10"))
    with pytest.raises(UnsupportedSpec, match="enable_kv_cache_events=False"):
        make_kv_cache_manager(spec(CHUNK4, profile="vllm-0.10"))


def test_group_without_its_window_is_an_input_error() -> None:
    with pytest.raises(KVCheckInputError, match="sliding_window group without"):
        make_kv_cache_manager(spec(FULL, KVCacheGroupSpec("sliding_window")))
    with pytest.raises(KVCheckInputError, match="unknown kind"):
        make_kv_cache_manager(spec(KVCacheGroupSpec("mamba")))
