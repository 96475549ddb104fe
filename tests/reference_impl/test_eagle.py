"""EAGLE / MTP in the reference (``KVCacheManager(use_eagle=True)``;
docs/semantics.md#prefix-cache-hits): the helpers and checks, against values vLLM 0.33.0's own
functions gave (``kv_cache_coordinator.replay_boundaries``,
``kv_cache_interface.get_mamba_prefill_checkpoint_position``, and ``KVCacheManager``'s
constructor with ``num_prefill_lookahead``, printed by a throwaway script on a CPU install and
copied here as literals). The hit answers, one group and several, are the suite's golden
scenarios (``conformance/test_eagle.py``, ``kvcheck.conformance.eagle_golden``)."""

from __future__ import annotations

from typing import Any

import pytest

from kvcheck.reference_impl.errors import KVCacheMisuseError
from kvcheck.reference_impl.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager
from kvcheck.reference_impl.single_type_kv_cache_manager import (
    mamba_prefill_checkpoint_position,
    replay_boundaries,
)

#: (num_prompt_tokens, scheduler_block_size, use_eagle) -> vLLM 0.33.0's replay_boundaries.
REPLAY = [((13, 4, False), [12]), ((13, 4, True), [8]), ((16, 4, True), [8, 12]),
          ((17, 8, True), [8]), ((3, 4, True), [0]), ((8, 4, True), [0, 4])]
#: (num_tokens, hash_block_size, drop_eagle_block) -> get_mamba_prefill_checkpoint_position.
CHECKPOINT = [((19, 4, True), 12), ((19, 4, False), 16), ((20, 4, True), 16),
              ((20, 4, False), 16), ((3, 4, True), 0), ((4, 4, True), 0), ((1, 4, False), 0)]


@pytest.mark.parametrize(("args", "want"), REPLAY)
def test_replay_boundaries_match_vllm(args: tuple[int, int, bool], want: list[int]) -> None:
    assert replay_boundaries(*args) == want


@pytest.mark.parametrize(("args", "want"), CHECKPOINT)
def test_mamba_checkpoint_position_matches_vllm(args: tuple[int, int, bool], want: int) -> None:
    assert mamba_prefill_checkpoint_position(*args) == want


def test_mtp_lookahead_larger_than_the_scheduler_block_is_refused() -> None:
    """vLLM 0.33.0 raised ValueError('Multi-module MTP with prefix caching requires
    scheduler_block_size (=4) >= num_speculative_tokens (=5).') for one full-attention group of
    4 with use_eagle, caching on and num_prefill_lookahead 5; (=8) >= (=9) for full attention 4
    beside a window at 8; and took 4 (and 8) at those sizes, 5 without EAGLE or caching."""
    with pytest.raises(KVCacheMisuseError, match=r"requires scheduler_block_size \(=4\) >= "
                       r"num_speculative_tokens \(=5\)"):
        KVCacheManager(16, 4, use_eagle=True, num_prefill_lookahead=5)
    with pytest.raises(KVCacheMisuseError, match=r"\(=8\) >= num_speculative_tokens \(=9\)"):
        KVCacheManager(32, kv_cache_specs=[FullAttentionSpec(4), SlidingWindowSpec(8, 8)],
                       use_eagle=True, num_prefill_lookahead=9)
    KVCacheManager(16, 4, use_eagle=True, enable_caching=False, num_prefill_lookahead=5)
    KVCacheManager(16, 4, use_eagle=True, num_prefill_lookahead=1)


def test_mtp_lookahead_is_a_vllm_033_argument() -> None:
    with pytest.raises(KVCacheMisuseError, match=r"0\.10\.2 has none"):
        KVCacheManager(16, 4, profile="vllm-0.10", num_prefill_lookahead=1)


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.10"])
def test_eagle_beside_chunked_local_attention_is_refused(profile: str) -> None:
    specs = [FullAttentionSpec(4), ChunkedLocalAttentionSpec(4, 8)]
    with pytest.raises(KVCacheMisuseError, match="eagle \\+ chunked local attention"):
        KVCacheManager(32, kv_cache_specs=specs, profile=profile, use_eagle=True)
    KVCacheManager(32, kv_cache_specs=specs, profile=profile, use_eagle=True,
                   enable_caching=False)
    KVCacheManager(32, kv_cache_specs=specs, profile=profile)


def test_eagle_beside_chunked_local_attention_runs_when_it_does_not_drop() -> None:
    """vLLM 0.33.0 asserts (its ChunkedLocalAttentionManager, on the first lookup) for a
    chunked group flagged ``is_eagle_group``, for one sharing its spec with a flagged group
    and for any when none is flagged, and ran an unflagged one beside a flagged group of
    another spec (full attention, a window, another chunk size), replayed by a throwaway
    script on a CPU install."""
    full, chunk8 = FullAttentionSpec(4), ChunkedLocalAttentionSpec(4, 8)
    refused = [([full, chunk8], [1], "it is flagged"), ([full, chunk8, chunk8], [2], "of its spec"),
               ([chunk8], [], "every group drops")]
    for specs, ids, why in refused:
        with pytest.raises(KVCacheMisuseError, match=why):
            KVCacheManager(32, kv_cache_specs=specs, use_eagle=True, eagle_group_ids=ids)
    runs = [([full, chunk8], [0]), ([chunk8, full], [1]), ([full, chunk8, chunk8], [0]),
            ([SlidingWindowSpec(4, 8), chunk8], [0]),
            ([full, chunk8, ChunkedLocalAttentionSpec(4, 16)], [0])]
    for specs, ids in runs:
        coordinator = KVCacheManager(32, kv_cache_specs=specs, use_eagle=True,
                                     eagle_group_ids=ids).coordinator
        assert [m.use_eagle for m in coordinator.single_type_managers] == [
            i in ids for i in range(len(specs))]


def test_eagle_beside_mamba_prefill_checkpoints_is_refused() -> None:
    """vLLM 0.33.0 fails ``assert block_idx < len(req_blocks)`` (MambaManager._apply_cow) once
    a request hits a checkpoint EAGLE keyed below its table index (found by the multi-group
    differential, seed 3): the reference refuses the layout instead of inventing an answer;
    without EAGLE, or with caching off, or without checkpoint blocks it is built."""
    ckpt = MambaSpec(4, mamba_cache_mode="align", num_prefill_checkpoint_blocks=1,
                     prefill_checkpoint_alignment=4)
    specs = [FullAttentionSpec(4), ckpt]
    with pytest.raises(KVCacheMisuseError, match="_apply_cow"):
        KVCacheManager(32, kv_cache_specs=specs, use_eagle=True)
    KVCacheManager(32, kv_cache_specs=specs)
    KVCacheManager(32, kv_cache_specs=[FullAttentionSpec(4), MambaSpec(4)], use_eagle=True,
                   enable_caching=False)
    align = MambaSpec(4, mamba_cache_mode="align")
    KVCacheManager(32, kv_cache_specs=[FullAttentionSpec(4), align], use_eagle=True)


def test_use_eagle_must_be_a_bool() -> None:
    with pytest.raises(KVCacheMisuseError, match="use_eagle must be a bool"):
        KVCacheManager(16, 4, use_eagle=1)  # type: ignore[arg-type]


def test_unitary_hit_drops_its_last_block() -> None:
    """A 13-token prompt cached, resent: 12 tokens without EAGLE, 8 with (vLLM 0.33.0 and
    0.10.2: conformance/eagle_golden.py, full_attention_drops_last_block)."""
    for profile in ("vllm-0.33", "vllm-0.10"):
        hits = []
        for eagle in (False, True):
            m = KVCacheManager(16, 4, profile=profile, use_eagle=eagle)
            a = m.make_request("a", list(range(100, 113)))
            m.allocate_slots(a, 13)
            a.num_computed_tokens = 13
            m.free(a)
            hits.append(m.get_computed_blocks(m.make_request("b", list(range(100, 113))))[1])
        assert hits == [12, 8], (profile, hits)


# Any: KVCacheManager's keyword arguments, of several types.
def _full_and_window(**kw: Any) -> KVCacheManager:
    return KVCacheManager(24, kv_cache_specs=(FullAttentionSpec(4), SlidingWindowSpec(4, 4)),
                          **kw)


def test_eagle_group_ids_are_group_indices_under_vllm_033_only() -> None:
    """``eagle_group_ids`` (vLLM 0.33's ``KVCacheGroupSpec.is_eagle_group`` flags): group
    indices in range; none under vllm-0.10, whose ``KVCacheGroupSpec`` has no flag."""
    with pytest.raises(KVCacheMisuseError, match=r"eagle_group_ids \[2\]: each must be a group"):
        _full_and_window(use_eagle=True, eagle_group_ids=[2])
    with pytest.raises(KVCacheMisuseError, match="has no is_eagle_group"):
        _full_and_window(use_eagle=True, eagle_group_ids=[0], profile="vllm-0.10")


def test_only_flagged_groups_drop() -> None:
    """With flags only the flagged groups' managers drop (vLLM 0.33's
    ``drop_eagle_group_ids``); none flagged: every group (vLLM's fallback); without
    ``use_eagle`` none, flagged or not."""
    flagged = _full_and_window(use_eagle=True, eagle_group_ids=[1]).coordinator
    assert [m.use_eagle for m in flagged.single_type_managers] == [False, True]
    fallback = _full_and_window(use_eagle=True).coordinator
    assert [m.use_eagle for m in fallback.single_type_managers] == [True, True]
    off = _full_and_window(eagle_group_ids=[1]).coordinator
    assert [m.use_eagle for m in off.single_type_managers] == [False, False]


def test_mtp_check_applies_to_flagged_groups_without_use_eagle() -> None:
    """vLLM 0.33 checks multi-module MTP's lookahead against the scheduler block whenever a
    group is flagged (``eagle_group_ids``), ``use_eagle`` or not: vLLM 0.33.0's
    ``KVCacheManager`` raised ValueError for a flagged full-attention group beside a window
    (block 4, ``num_prefill_lookahead=8``, ``use_eagle=False``) and took it unflagged."""
    with pytest.raises(KVCacheMisuseError, match="scheduler_block_size"):
        _full_and_window(num_prefill_lookahead=8, eagle_group_ids=[0])
    _full_and_window(num_prefill_lookahead=8)  # must not raise
