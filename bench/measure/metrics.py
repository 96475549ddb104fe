"""Napkin math in one place: sample statistics, throughputs, ratios and the bytes-moved models.

Everything here is plain Python on plain numbers (no torch, no numpy), so each formula is
unit-tested with hand-computed values. Units are in the names: ``_s`` seconds, ``_us``
microseconds, ``_bytes``, ``_gbps`` decimal gigabytes (1e9 bytes) per second, ``per_s`` events
per second.

Bytes models count *compulsory* traffic: every byte a kernel must read or write at least once
(inputs read once, outputs written once, index tensors only where they are dereferenced). Real
kernels move at least this much (re-reads across tiles, split-KV partials and padding come on
top), so achieved GB/s computed from these models is a lower bound of the DRAM traffic and a
fair "speed of light" comparison across implementations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvcheck.errors import KVCheckInputError

__all__ = [
    "NOISY_CV",
    "Metric",
    "PairedRatio",
    "SampleSummary",
    "gbps",
    "paged_decode_bytes",
    "paged_varlen_bytes",
    "pct_of_peak",
    "per_s",
    "percentile",
    "ratio",
    "store_kv_cache_bytes",
    "summarize",
]

#: Coefficient of variation above which a figure is flagged as noisy (harness lessons §3, 7).
NOISY_CV = 0.05


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between closest ranks.

    The same rule as numpy's default (``method="linear"``): position ``(n - 1) * q / 100`` in
    the sorted samples, interpolated between its two neighbours. E.g. ``[1, 2, 3, 4]`` at 50
    -> position 1.5 -> 2.5; at 99 -> position 2.97 -> 3.97.

    Raises:
        KVCheckInputError: no samples, or ``q`` outside [0, 100].
    """
    if not samples:
        raise KVCheckInputError("percentile of an empty sample list")
    if not 0.0 <= q <= 100.0:
        raise KVCheckInputError(f"percentile q must lie in [0, 100], got {q}")
    ordered = sorted(samples)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    frac = pos - lo
    return ordered[lo] + (ordered[hi] - ordered[lo]) * frac


@dataclass(frozen=True)
class SampleSummary:
    """Location and spread of a list of samples (same unit as the samples)."""

    n: int
    median: float
    p99: float
    mean: float
    min: float
    max: float
    iqr: float  # p75 - p25
    cv: float  # stdev / mean (sample stdev, n - 1); 0 for a single sample

    @property
    def is_noisy(self) -> bool:
        """True when the coefficient of variation exceeds ``NOISY_CV`` (5 %)."""
        return self.cv > NOISY_CV


def summarize(samples: Sequence[float]) -> SampleSummary:
    """Median, p99, mean, min, max, IQR and CV of ``samples`` (outliers are kept, not removed).

    Example: ``[1, 2, 3, 4]`` -> median 2.5, p99 3.97, mean 2.5, iqr 1.5 (3.25 - 1.75),
    cv = stdev 1.2910 / 2.5 = 0.5164.
    """
    if not samples:
        raise KVCheckInputError("summarize: no samples")
    n = len(samples)
    mean = sum(samples) / n
    if n > 1 and mean != 0:
        var = sum((x - mean) ** 2 for x in samples) / (n - 1)
        cv = math.sqrt(var) / abs(mean)
    else:
        cv = 0.0
    return SampleSummary(
        n=n,
        median=percentile(samples, 50),
        p99=percentile(samples, 99),
        mean=mean,
        min=min(samples),
        max=max(samples),
        iqr=percentile(samples, 75) - percentile(samples, 25),
        cv=cv,
    )


def per_s(count: float, seconds: float) -> float:
    """Events per second: ``count / seconds`` (e.g. tokens/s, calls/s, blocks/s).

    Raises:
        KVCheckInputError: ``seconds <= 0`` (a zero duration means the clock did not advance; a
            figure computed from it would be infinite, never a measurement).
    """
    if seconds <= 0:
        raise KVCheckInputError(f"per_s: duration must be > 0 s, got {seconds}")
    return count / seconds


def gbps(num_bytes: float, seconds: float) -> float:
    """Decimal GB/s: ``num_bytes / seconds / 1e9`` (FlashInfer's older scripts mix 1024s in;
    we never do)."""
    return per_s(num_bytes, seconds) / 1e9


def pct_of_peak(achieved_gbps: float, peak_gbps: float | None) -> float | None:
    """``100 * achieved / peak``, or None when the peak is unknown (or not positive)."""
    if peak_gbps is None or peak_gbps <= 0:
        return None
    return 100.0 * achieved_gbps / peak_gbps


def ratio(value: float | None, reference: float | None) -> float | None:
    """``value / reference``: the implementation's figure over the reference's, same unit.

    Not inverted for lower-is-better figures: a ratio of 0.5 on a latency is twice as fast, on
    a throughput half as fast; the metric's direction says which. None when either side is
    missing or the reference is 0 (e.g. zero preemptions in the reference run).
    """
    if value is None or reference is None or reference == 0:
        return None
    return value / reference


@dataclass(frozen=True)
class PairedRatio:
    """The median of per-pair ratios ``implementation / reference`` of one figure (computed
    by ``kvcheck.bench.measure.paired.paired_ratio``; kept here beside the ``Metric`` that carries
    it).

    ``ci_low`` / ``ci_high`` bound the median at ``confidence`` (``median_ci``); the
    direction of the figure is the metric's (a throughput ratio of 2 is twice as fast).
    """

    ratio: float
    ci_low: float
    ci_high: float
    confidence: float
    pairs: int
    ratios: tuple[float, ...]

    def as_extra(self) -> dict[str, object]:
        """The fields a result record's metric ``extra`` carries."""
        return {"ratio_method": "median of paired ratios, rounds interleaved A B B A",
                "ratio_ci": [self.ci_low, self.ci_high], "ratio_ci_confidence": self.confidence,
                "paired_ratios": list(self.ratios)}


@dataclass
class Metric:
    """One reported figure: the headline value, its per-round samples and, once known, the
    reference implementation's value of the same figure measured in the same run.

    When the reference was measured interleaved with the implementation (``bench.paired``),
    ``reference_samples`` holds its per-round samples and ``paired`` the median of the
    per-pair ratios, which is then the reported ``ratio_to_reference``.
    """

    name: str
    unit: str
    direction: str  # "higher_is_better" | "lower_is_better"
    value: float
    samples: list[float]
    stat: str = "median"
    reference_value: float | None = None
    reference_samples: list[float] | None = None
    paired: PairedRatio | None = None

    @property
    def ratio_to_reference(self) -> float | None:
        """The paired ratio when there is one, else ``value / reference_value`` (see
        ``kvcheck.bench.measure.metrics.ratio``)."""
        if self.paired is not None:
            return self.paired.ratio
        return ratio(self.value, self.reference_value)


# -------------------------------------------------------------------------------- bytes models
def store_kv_cache_bytes(
    num_tokens: int,
    num_real_tokens: int,
    num_kv_heads: int,
    head_size: int,
    input_itemsize: int,
    cache_itemsize: int,
    slot_itemsize: int = 8,
    num_scales: int = 0,
) -> int:
    """Compulsory bytes of one ``store_kv_cache`` call.

    ``slot_mapping`` is read for every token (``num_tokens * slot_itemsize``); a padding token
    (``PAD_SLOT_ID``) stops there. Each real token reads its key and value rows
    (``2 * H_kv * D * input_itemsize``) and writes them to the cache
    (``2 * H_kv * D * cache_itemsize``); fp8 adds ``num_scales`` float32 scales (4 B each).

    Example: 256 tokens (250 real), 8 KV heads, head 128, bf16 in and out, int64 slots:
    ``256*8 + 250*8*128*2*2 + 250*8*128*2*2 = 2048 + 1_024_000 + 1_024_000 = 2_050_048``.
    """
    row = num_kv_heads * head_size
    read = num_tokens * slot_itemsize + 2 * num_real_tokens * row * input_itemsize
    write = 2 * num_real_tokens * row * cache_itemsize
    return read + write + 4 * num_scales


def _visible_kv_tokens(seq_len: int, query_len: int, sliding_window: int | None) -> int:
    """Keys at least one of the last ``query_len`` query positions attends to (causal)."""
    if query_len <= 0 or seq_len <= 0:
        return 0
    if sliding_window is None:
        return seq_len
    first_query_pos = seq_len - query_len
    first_key = max(0, first_query_pos - sliding_window + 1)
    return seq_len - first_key


def _blocks_read(seq_len: int, query_len: int, block_size: int,
                 sliding_window: int | None) -> int:
    """Block-table entries dereferenced: blocks overlapping the visible key range."""
    visible = _visible_kv_tokens(seq_len, query_len, sliding_window)
    if visible == 0:
        return 0
    first_key = seq_len - visible
    return (seq_len - 1) // block_size - first_key // block_size + 1


def paged_varlen_bytes(
    seq_lens: Sequence[int],
    query_lens: Sequence[int],
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    q_itemsize: int,
    kv_itemsize: int,
    out_itemsize: int,
    index_itemsize: int = 4,
    sliding_window: int | None = None,
    num_scales: int = 0,
) -> int:
    """Compulsory bytes of one ``paged_attention_varlen`` call (decode: all query lens 1).

    Per sequence ``b`` with ``L_b`` cached tokens and ``q_b`` new ones: the queries
    (``q_b * H_q * D * q_itemsize``) are read and the outputs written (``... * out_itemsize``);
    every visible key and value row is read once (``2 * V_b * H_kv * D * kv_itemsize`` with
    ``V_b = L_b``, or the window's share); the block-table entries covering the visible keys
    and ``seq_lens`` (+ ``query_start_loc`` for varlen, ``B + 1`` entries) are read once.
    Sequences with ``q_b = 0`` read no K/V.

    Example (decode): seq_lens [100, 17], H_q 32, H_kv 8, D 128, block 16, bf16, int32:
    q = o = 2*32*128*2 = 16_384 each; kv = (100 + 17)*8*128*2*2 = 479_232; block-table
    entries 7 + 2 = 9 -> 36; seq_lens 8: total 512_044 (plus query_start_loc for varlen).
    """
    if len(seq_lens) != len(query_lens):
        raise KVCheckInputError(f"{len(seq_lens)} seq_lens but {len(query_lens)} query_lens")
    total = 0
    for seq_len, query_len in zip(seq_lens, query_lens, strict=True):  # lengths checked above
        if query_len > seq_len:
            raise KVCheckInputError(f"query_len {query_len} > seq_len {seq_len}")
        total += query_len * num_heads * head_size * (q_itemsize + out_itemsize)
        kv_tokens = _visible_kv_tokens(seq_len, query_len, sliding_window)
        total += 2 * kv_tokens * num_kv_heads * head_size * kv_itemsize
        total += _blocks_read(seq_len, query_len, block_size, sliding_window) * index_itemsize
    total += len(seq_lens) * index_itemsize  # seq_lens
    return total + 4 * num_scales


def paged_decode_bytes(
    seq_lens: Sequence[int],
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    q_itemsize: int,
    kv_itemsize: int,
    out_itemsize: int,
    index_itemsize: int = 4,
    sliding_window: int | None = None,
    num_scales: int = 0,
) -> int:
    """Compulsory bytes of one ``paged_attention_decode`` call: the varlen model with one
    query token per sequence with ``seq_len > 0`` (no ``query_start_loc``).

    See ``paged_varlen_bytes`` for the worked example (512_044 bytes).
    """
    query_lens = [1 if n > 0 else 0 for n in seq_lens]
    return paged_varlen_bytes(
        seq_lens, query_lens, num_heads, num_kv_heads, head_size, block_size, q_itemsize,
        kv_itemsize, out_itemsize, index_itemsize, sliding_window, num_scales,
    )
