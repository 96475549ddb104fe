"""Metric arithmetic and the bytes-moved models, against hand-computed numbers."""

from __future__ import annotations

import math

import pytest

from kvcheck.bench.measure.metrics import (
    Metric,
    gbps,
    paged_decode_bytes,
    paged_varlen_bytes,
    pct_of_peak,
    per_s,
    percentile,
    ratio,
    store_kv_cache_bytes,
    summarize,
)


def test_percentile_interpolates_linearly_between_ranks() -> None:
    """[1, 2, 3, 4]: p50 at position 1.5 = 2.5; p99 at 2.97 = 3.97; p0 = 1; p100 = 4."""
    data = [4, 1, 3, 2]
    assert percentile(data, 50) == 2.5
    assert percentile(data, 99) == pytest.approx(3.97)
    assert percentile(data, 0) == 1 and percentile(data, 100) == 4
    assert percentile([7], 99) == 7
    with pytest.raises(ValueError, match="empty"):
        percentile([], 50)
    with pytest.raises(ValueError, match=r"\[0, 100\]"):
        percentile([1], 101)


def test_summarize_hand_computed() -> None:
    """[1, 2, 3, 4]: mean 2.5, IQR 3.25 - 1.75 = 1.5, CV = sqrt(5/3) / 2.5 = 0.5164."""
    s = summarize([1, 2, 3, 4])
    assert (s.n, s.median, s.mean, s.min, s.max) == (4, 2.5, 2.5, 1, 4)
    assert s.iqr == pytest.approx(1.5)
    assert s.cv == pytest.approx(math.sqrt(5 / 3) / 2.5)
    assert s.is_noisy
    assert not summarize([100.0, 101.0, 99.0]).is_noisy  # CV 1 %
    assert summarize([3.0]).cv == 0.0


def test_rates_and_their_errors() -> None:
    """per_s = count / s; gbps = bytes / s / 1e9 (decimal); a zero duration is an error."""
    assert per_s(1000, 0.5) == 2000
    assert gbps(3_000_000_000, 1.5) == 2.0
    with pytest.raises(ValueError, match="must be > 0"):
        per_s(1, 0.0)


def test_pct_of_peak_and_ratio() -> None:
    """% of peak needs a known positive peak; ratios are value / reference, None at 0."""
    assert pct_of_peak(1676.16, 3352.32) == pytest.approx(50.0)
    assert pct_of_peak(10, None) is None and pct_of_peak(10, 0) is None
    assert ratio(3.0, 4.0) == 0.75
    assert ratio(1.0, 0) is None and ratio(None, 1.0) is None
    m = Metric("x", "us", "lower_is_better", 5.0, [5.0], reference_value=10.0)
    assert m.ratio_to_reference == 0.5


def test_store_kv_cache_bytes_hand_computed() -> None:
    """256 tokens (250 real), 8 heads x 128, bf16 in and out, int64 slots:
    slots 256*8 = 2048; read K+V 250*8*128*2*2 = 1_024_000; write the same."""
    assert store_kv_cache_bytes(256, 250, 8, 128, 2, 2) == 2048 + 1_024_000 + 1_024_000
    # fp8 cache: writes are 1 byte per element, plus two float32 scales.
    assert store_kv_cache_bytes(1, 1, 1, 16, 2, 1, num_scales=2) == 8 + 64 + 32 + 8


def test_paged_decode_bytes_hand_computed() -> None:
    """seq_lens [100, 17], 32 q heads, 8 KV heads, head 128, block 16, bf16, int32 indices:
    q + o = 2 * (32*128*2) * 2 = 32_768; KV (100+17)*8*128*2*2 = 479_232;
    table entries ceil(100/16) + ceil(17/16) = 7 + 2 -> 36; seq_lens 8. Total 512_044."""
    assert paged_decode_bytes([100, 17], 32, 8, 128, 16, 2, 2, 2) == 512_044


def test_paged_bytes_with_a_sliding_window() -> None:
    """Window 10 on a 100-token sequence: keys 90..99 (10 rows) in blocks 5 and 6 (2 entries).
    1 q head = 1 KV head, head 4, fp32: q + o = 32, KV 2*10*4*4 = 320, table 8, seq_lens 4."""
    assert paged_decode_bytes([100], 1, 1, 4, 16, 4, 4, 4, sliding_window=10) == 32 + 320 + 8 + 4


def test_paged_varlen_bytes_skips_idle_sequences() -> None:
    """A 40-token prefill (all 40 keys, 3 blocks of 16) and a sequence with no new tokens
    (reads nothing but its seq_lens entry). 1 head, head 4, fp32:
    q + o = 40*4*4*2 = 1280; KV 2*40*4*4 = 1280; table 12; seq_lens 8."""
    assert paged_varlen_bytes([40, 20], [40, 0], 1, 1, 4, 16, 4, 4, 4) == 1280 + 1280 + 12 + 8
    with pytest.raises(ValueError, match="query_len 5 > seq_len 4"):
        paged_varlen_bytes([4], [5], 1, 1, 4, 16, 4, 4, 4)
