"""The reference's cross-attention groups (an encoder-decoder model's KV cache;
docs/semantics.md#cross-attention-groups): sized by ``num_encoder_tokens`` at admission, left
alone by decode steps, never cached, freed with the request; the layouts and arguments vLLM
never runs refused by name.

The expected block ids were read from vLLM 0.33.0's and 0.10.2's own ``KVCacheManager`` on the
same calls (``conformance/hybrid_cross_attention.py`` holds the recorded scenarios the suite
replays; these are the unit-level rules under them).
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from kvcheck.reference_impl.block import KVCacheBlock
from kvcheck.reference_impl.errors import KVCacheMisuseError
from kvcheck.reference_impl.kv_cache_interface import (
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    SlidingWindowSpec,
    get_kv_cache_spec_kind,
)
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager

PROFILES = ("vllm-0.33", "vllm-0.10")


def _manager(profile: str, num_blocks: int = 9, *, caching: bool = False,
             specs: tuple[KVCacheSpec, ...] = (FullAttentionSpec(2), CrossAttentionSpec(2)),
             ) -> KVCacheManager:
    return KVCacheManager(num_blocks, kv_cache_specs=specs, enable_caching=caching,
                          profile=profile, pythonhashseed="0")


def _ids(blocks: Sequence[Sequence[KVCacheBlock]] | None) -> list[list[int]] | None:
    return None if blocks is None else [[b.block_id for b in g] for g in blocks]


@pytest.mark.parametrize("profile", PROFILES)
def test_encoder_tokens_size_the_cross_group_at_admission_only(profile: str) -> None:
    m = _manager(profile)
    req = m.make_request("a", range(100, 105))
    # 5 prompt tokens: 3 decoder blocks; 6 encoder tokens: 3 cross-attention blocks.
    assert _ids(m.allocate_slots(req, 5, num_encoder_tokens=6)) == [[1, 2, 3], [4, 5, 6]]
    req.num_computed_tokens = 5
    req.append_output_token_ids(7)
    assert _ids(m.allocate_slots(req, 1)) == [[], []]  # 6 tokens: still 3 decoder blocks
    req.num_computed_tokens = 6
    req.append_output_token_ids(8)
    # The 7th token needs a 4th decoder block; the cross-attention table stays at 3.
    assert _ids(m.allocate_slots(req, 1)) == [[7], []]
    assert m.get_block_ids("a") == ([1, 2, 3, 7], [4, 5, 6])
    assert m.get_computed_blocks(m.make_request("b", range(100, 105)))[1] == 0  # no caching


def test_kind_name_is_vllms() -> None:
    assert get_kv_cache_spec_kind(CrossAttentionSpec(4)) == "cross_attention"


def test_a_larger_cross_block_rounds_the_encoder_up() -> None:
    m = _manager("vllm-0.33", 10, specs=(CrossAttentionSpec(4), FullAttentionSpec(2)))
    req = m.make_request("a", range(100, 107))
    # Group 0 (cross, 5 encoder tokens in blocks of 4) takes the queue head first.
    assert _ids(m.allocate_slots(req, 7, num_encoder_tokens=5)) == [[1, 2], [3, 4, 5, 6]]


def test_v033_refuses_a_decode_at_a_full_pool() -> None:
    m = _manager("vllm-0.33", 7)
    req = m.make_request("a", range(100, 105))
    assert m.allocate_slots(req, 5, num_encoder_tokens=6) is not None
    req.num_computed_tokens = 5
    req.append_output_token_ids(7)
    req.num_computed_tokens = 6
    req.append_output_token_ids(8)
    assert m.allocate_slots(req, 1) is None  # needs a 4th decoder block; 0 free


def test_v010_names_its_crash_at_a_full_pool() -> None:
    """vLLM 0.10.2 counts the cross blocks a running request holds as a negative need, passes
    the check, and raises ValueError in get_new_blocks; the reference raises naming it, before
    anything changes."""
    m = _manager("vllm-0.10", 7)
    req = m.make_request("a", range(100, 105))
    assert m.allocate_slots(req, 5, num_encoder_tokens=6) is not None
    req.num_computed_tokens = 6
    req.append_output_token_ids(7)
    req.append_output_token_ids(8)
    with pytest.raises(KVCacheMisuseError, match=r"vLLM 0\.10\.2 raises ValueError.*negative"):
        m.allocate_slots(req, 1)
    assert m.get_block_ids("a") == ([1, 2, 3], [4, 5, 6])


@pytest.mark.parametrize("profile", PROFILES)
def test_cross_attention_with_prefix_caching_is_refused(profile: str) -> None:
    with pytest.raises(KVCacheMisuseError, match="needs prefix caching off"):
        _manager(profile, caching=True)


def test_encoder_tokens_without_a_cross_group_are_refused() -> None:
    m = _manager("vllm-0.33", specs=(FullAttentionSpec(2), SlidingWindowSpec(2, 4)))
    req = m.make_request("a", range(100, 105))
    with pytest.raises(KVCacheMisuseError, match="no cross-attention KV-cache group"):
        m.allocate_slots(req, 5, num_encoder_tokens=6)
    assert m.get_block_ids("a") == ([], [])


def test_negative_encoder_tokens_are_refused() -> None:
    m = _manager("vllm-0.33")
    with pytest.raises(KVCacheMisuseError, match="num_encoder_tokens must be >= 0"):
        m.allocate_slots(m.make_request("a", range(4)), 4, num_encoder_tokens=-1)


@pytest.mark.parametrize("profile", PROFILES)
def test_free_returns_both_tables_group_by_group(profile: str) -> None:
    m = _manager(profile)
    req = m.make_request("a", range(100, 105))
    m.allocate_slots(req, 5, num_encoder_tokens=6)
    m.free(req)
    queue = [b.block_id for b in m.block_pool.free_block_queue.get_all_free_blocks()]
    # 0.33: unhashed blocks go to the head, group 1's in front of group 0's; 0.10.2 appends
    # every freed block at the tail, group 0's first.
    expected = {"vllm-0.33": [6, 5, 4, 3, 2, 1, 7, 8],
                "vllm-0.10": [7, 8, 3, 2, 1, 6, 5, 4]}[profile]
    assert queue == expected
