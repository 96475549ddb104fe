"""The reference's worker-side block zeroing (vLLM 0.33's ``needs_kv_cache_zeroing``;
docs/semantics.md#worker-side-block-zeroing) on the manager itself: what is recorded and
drained (the suite's golden scenarios, ``conformance/block_zeroing_golden.py``, pin the
answers recorded from vLLM 0.33.0), and the misuse errors, which name the problem and the fix.
"""

from __future__ import annotations

import pytest

from kvcheck.reference_impl.errors import KVCacheMisuseError
from kvcheck.reference_impl.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager
from kvcheck.reference_impl.request import Request


def _windowed(**kwargs: object) -> KVCacheManager:
    return KVCacheManager(24, kv_cache_specs=[FullAttentionSpec(4), SlidingWindowSpec(4, 8)],
                          **kwargs)  # type: ignore[arg-type]


def test_nothing_is_recorded_without_zeroing() -> None:
    """Without ``needs_kv_cache_zeroing`` no group records and the drain is always empty."""
    m = KVCacheManager(16, 4)
    assert m.allocate_slots(Request("a", list(range(10))), 10) is not None
    assert m.take_new_block_ids() == []
    assert not any(g.records_new_block_ids for g in m.coordinator.single_type_managers)


def test_failed_load_records_the_table_again_nulls_included() -> None:
    """``record_blocks_for_zeroing`` adds the request's blocks from the token on, in every
    recording group: the window's null blocks below its window too (as vLLM adds them)."""
    m = _windowed(needs_kv_cache_zeroing=True)
    req = Request("a", list(range(20)))
    new = m.allocate_slots(req, 16)
    assert new is not None
    assert m.take_new_block_ids() == [b.block_id for g in new for b in g]
    req.num_computed_tokens = 16
    m.allocate_slots(req, 4)
    m.take_new_block_ids()
    tables = m.coordinator.get_block_ids("a")
    m.record_blocks_for_zeroing("a", 4)
    assert m.take_new_block_ids() == tables[0][1:] + tables[1][1:]
    assert 0 in tables[1][1:]  # a null block the window left


@pytest.mark.parametrize(("start", "rule"), [(2, "multiple"), (-4, "non-negative")])
def test_record_blocks_for_zeroing_refuses_an_unaligned_start(start: int, rule: str) -> None:
    m = KVCacheManager(16, 4, needs_kv_cache_zeroing=True)
    m.allocate_slots(Request("a", list(range(10))), 10)
    with pytest.raises(KVCacheMisuseError, match=rule):
        m.record_blocks_for_zeroing("a", start)


def test_skipped_group_ids_are_checked() -> None:
    """``zeroing_skipped`` names a group id outside the model (and its range)."""
    m = _windowed(needs_kv_cache_zeroing=True)
    with (pytest.raises(KVCacheMisuseError, match=r"\[2\] not a KV-cache group id .*0 to 1"),
          m.zeroing_skipped([2])):
        pass


def test_vllm_010_has_no_zeroing() -> None:
    with pytest.raises(KVCacheMisuseError, match=r"vLLM 0\.10\.2 has no worker-side block"):
        KVCacheManager(16, 4, profile="vllm-0.10", needs_kv_cache_zeroing=True)
    m = KVCacheManager(16, 4, profile="vllm-0.10")
    with (pytest.raises(KVCacheMisuseError, match=r"use profile vllm-0\.33"),
          m.zeroing_skipped([0])):
        pass
    with pytest.raises(KVCacheMisuseError, match="True or False"):
        KVCacheManager(16, 4, needs_kv_cache_zeroing=1)  # type: ignore[arg-type]
