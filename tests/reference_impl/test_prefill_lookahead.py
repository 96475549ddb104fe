"""vLLM 0.33's multi-module MTP in the reference (``KVCacheManager(num_prefill_lookahead=K)``;
docs/semantics.md#multi-module-mtp): the parts below the golden scenarios. The skipped-token
counts are what vLLM 0.33.0's own ``SlidingWindowManager.get_num_skipped_tokens`` gave (window
4, block 4, ``extra_retained_tokens`` 0 and 2, printed by a throwaway script on a CPU install
and copied here as literals); the answers op by op, one group and several, are the suite's
golden scenarios (``conformance/test_prefill_lookahead.py``,
``kvcheck.conformance.mtp_golden``)."""

from __future__ import annotations

import pytest

from kvcheck.reference_impl.errors import KVCacheMisuseError
from kvcheck.reference_impl.kv_cache_interface import (
    FullAttentionSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager
from kvcheck.reference_impl.request import Request

#: extra_retained_tokens -> get_num_skipped_tokens(n) for n in (3, 5, 6, 13, 15), vLLM 0.33.0.
SKIPPED = {0: [0, 2, 3, 10, 12], 2: [0, 0, 1, 8, 10]}


@pytest.mark.parametrize("extra", sorted(SKIPPED))
def test_window_skips_extra_retained_tokens_later(extra: int) -> None:
    mgr = KVCacheManager(16, kv_cache_specs=[SlidingWindowSpec(4, 4)],
                         num_prefill_lookahead=extra + 1 if extra else 0)
    window = mgr.coordinator.single_type_managers[0]
    assert [window.get_num_skipped_tokens(n) for n in (3, 5, 6, 13, 15)] == SKIPPED[extra]


@pytest.mark.parametrize("caching", [True, False])
def test_every_window_is_tagged_with_the_reprefillable_tail(caching: bool) -> None:
    """As vLLM 0.33's KV-cache planning: every sliding-window spec gets
    ``extra_retained_tokens = K - 1``, caching on or off; other specs are left as they are."""
    mgr = KVCacheManager(64, kv_cache_specs=[FullAttentionSpec(4), SlidingWindowSpec(4, 8),
                                             SlidingWindowSpec(8, 16)],
                         enable_caching=caching, num_prefill_lookahead=4)
    assert mgr.kv_cache_specs == (FullAttentionSpec(4), SlidingWindowSpec(4, 8, 3),
                                  SlidingWindowSpec(8, 16, 3))
    assert mgr.coordinator.num_reprefillable_tokens == 3
    for k in (0, 1):
        plain = KVCacheManager(64, kv_cache_specs=[SlidingWindowSpec(4, 8)],
                               num_prefill_lookahead=k)
        assert plain.kv_cache_specs == (SlidingWindowSpec(4, 8),)
        assert plain.coordinator.num_reprefillable_tokens == 0


@pytest.mark.parametrize("eagle", [False, True])
def test_one_group_caches_all_but_the_reprefillable_tail(eagle: bool) -> None:
    """One group, any ``use_eagle``: ``allocate_slots`` caches up to the tokens it makes
    computed less ``K - 1``. With K 4 a 12-token prompt caches 9 tokens (2 blocks), then one
    decode token at a time 10, 11, 12 (3 blocks), 13: vLLM 0.33.0's KVCacheManager held
    [2, 2, 2, 3, 3] cached blocks after those five calls, with and without EAGLE."""
    mgr = KVCacheManager(32, 4, use_eagle=eagle, num_prefill_lookahead=4)
    req = Request("a", list(range(100, 112)), block_hasher=mgr.block_hasher)
    mgr.allocate_slots(req, 12)

    def cached() -> int:
        return sum(b.block_hash is not None for b in mgr.get_blocks("a")[0])

    assert cached() == 2
    req.num_computed_tokens = 12
    for token, want in ((1, 2), (2, 2), (3, 3), (4, 3)):
        req.append_output_token_ids(token)
        mgr.allocate_slots(req, 1)
        req.num_computed_tokens += 1
        assert cached() == want, (token, cached())


def test_extra_retained_tokens_is_checked() -> None:
    with pytest.raises(KVCacheMisuseError, match="extra_retained_tokens must be an int >= 0"):
        SlidingWindowSpec(4, 8, -1)
    with pytest.raises(KVCacheMisuseError, match="num_prefill_lookahead must be an int >= 0"):
        KVCacheManager(16, 4, num_prefill_lookahead=-1)


def test_mamba_align_with_the_caching_lag_is_refused_beside_other_groups() -> None:
    """Where the lag applies to several groups (EAGLE's) a Mamba "align" group with caching on
    is refused (vLLM 0.33.0 keys a stale state there, found by the multi-group differential);
    without EAGLE beside full attention, with caching off (mode "none" then), and one Mamba
    group alone (it keys whole blocks only: its hits are golden scenarios,
    conformance/mtp_golden.py), the layout runs."""
    align = MambaSpec(8, mamba_cache_mode="align")
    with pytest.raises(KVCacheMisuseError, match=r"Mamba 'align' group .* not modelled"):
        KVCacheManager(64, kv_cache_specs=[FullAttentionSpec(8), align], use_eagle=True,
                       num_prefill_lookahead=2)
    KVCacheManager(64, kv_cache_specs=[FullAttentionSpec(8), align], num_prefill_lookahead=2)
    KVCacheManager(64, kv_cache_specs=[FullAttentionSpec(8), MambaSpec(8)], use_eagle=True,
                   enable_caching=False, num_prefill_lookahead=2)
    for eagle in (False, True):
        KVCacheManager(64, kv_cache_specs=[align], use_eagle=eagle, num_prefill_lookahead=2)
