"""Interleaved, paired measurement: implementation and reference rounds on the same inputs.

A ratio measured as ``median(implementation rounds) / median(reference rounds)`` with the two
sides measured minutes apart moves with whatever else the machine does in between (another
process, a frequency change, the allocator's arenas). Here the two sides alternate round by
round in the order A B B A A B ... (``abba_first``): pair ``i`` runs both sides back to back on
the same inputs (each bench draws round ``i``'s inputs from the same seeded stream), with a
``gc.collect()`` before and the collector off during each side's round. Slow drifts hit both
members of a pair alike and cancel in the pair's ratio; the alternating order cancels a
first-or-second position effect. The reported figure is the median of the per-pair ratios,
with a distribution-free confidence interval for that median (``median_ci``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvcheck.bench.measure.metrics import Metric, PairedRatio, percentile
from kvcheck.bench.measure.rounds import Bench, SetupArgs
from kvcheck.bench.measure.timing import collector_off, long_lived_frozen
from kvcheck.errors import KVCheckInputError

__all__ = [
    "PairedBench",
    "abba_first",
    "median_ci",
    "paired_ratio",
    "run_one_round",
]

#: Confidence level of the interval reported with every paired ratio.
CONFIDENCE = 0.95


def abba_first(pair_index: int) -> str:
    """Which side runs first in pair ``pair_index``: ``"impl"`` for even pairs, ``"ref"`` for
    odd ones, giving A B B A A B ... over consecutive pairs."""
    if pair_index < 0:
        raise KVCheckInputError(f"pair index must be >= 0, got {pair_index}")
    return "impl" if pair_index % 2 == 0 else "ref"


def _binom_cdf_half(k: int, n: int) -> float:
    """``P(X <= k)`` for ``X ~ Binomial(n, 1/2)`` (exact, integer arithmetic)."""
    if k < 0:
        return 0.0
    return sum(math.comb(n, i) for i in range(min(k, n) + 1)) / (1 << n)


def median_ci(values: Sequence[float], confidence: float = CONFIDENCE
              ) -> tuple[float, float, float]:
    """A distribution-free confidence interval for the median: ``(low, high, achieved)``.

    Order statistics: with the values sorted, ``[x_(k), x_(n+1-k)]`` (1-based) covers the
    population median with probability ``1 - 2 * P(Binomial(n, 1/2) <= k - 1)``; ``k`` is the
    largest rank whose coverage still reaches ``confidence``. With too few values for that
    (n <= 5 at 95 %) the interval is ``[min, max]`` and ``achieved`` says its real coverage
    (e.g. n = 5: 1 - 2/32 = 0.9375). Example: n = 9 at 95 % -> k = 2, coverage
    1 - 2 * 10/512 = 0.9609.

    Raises:
        KVCheckInputError: no values, or ``confidence`` outside (0, 1).
    """
    if not values:
        raise KVCheckInputError("median_ci: no values")
    if not 0.0 < confidence < 1.0:
        raise KVCheckInputError(f"confidence must lie in (0, 1), got {confidence}")
    ordered = sorted(values)
    n = len(ordered)
    k = 1
    while k + 1 <= (n + 1) // 2 and 1 - 2 * _binom_cdf_half(k, n) >= confidence:
        k += 1
    achieved = 1 - 2 * _binom_cdf_half(k - 1, n) if n > 1 else 0.0
    return ordered[k - 1], ordered[n - k], achieved


def paired_ratio(impl_samples: Sequence[float], ref_samples: Sequence[float],
                 confidence: float = CONFIDENCE) -> PairedRatio | None:
    """The paired ratio of two equally long sample lists (round ``i`` with round ``i``).

    Pairs whose reference sample is 0 carry no ratio and are left out; None when none is left
    (e.g. preemption counts that are 0 on both sides).

    Raises:
        KVCheckInputError: the lists differ in length.
    """
    if len(impl_samples) != len(ref_samples):
        raise KVCheckInputError(f"{len(impl_samples)} implementation samples but "
                                f"{len(ref_samples)} reference samples: rounds must pair up")
    ratios = [a / b for a, b in zip(impl_samples, ref_samples, strict=True) if b != 0]
    if not ratios:
        return None
    low, high, achieved = median_ci(ratios, confidence)
    return PairedRatio(percentile(ratios, 50), low, high, achieved, len(ratios),
                       tuple(ratios))


def run_one_round(bench: Bench) -> None:
    """Set up and run one round of ``bench``: fresh inputs, a full collection, then the round
    with the collector off (restored afterwards). Both sides of a pair go through here."""
    args, kwargs = bench.setup()
    with collector_off():
        bench.run(*args, **kwargs)


class PairedBench:
    """One pytest-benchmark round = one pair: the implementation's round and the reference's,
    in ``abba_first`` order.

    Only the implementation's bench advances the allocator clock (the reference's has
    ``clock = None``), so pytest-benchmark's own statistics still describe the implementation
    alone. ``run`` takes no arguments: each side sets its inputs up just before its round.
    """

    def __init__(self, impl: Bench, ref: Bench) -> None:
        self.impl = impl
        self.ref = ref
        self.pairs = 0

    def setup(self) -> SetupArgs:
        return (), {}

    def run(self) -> None:
        order = (self.impl, self.ref) if abba_first(self.pairs) == "impl" else (self.ref,
                                                                                 self.impl)
        for bench in order:
            run_one_round(bench)
        self.pairs += 1

    def measure(self, rounds: int, warmup: int) -> None:
        """``warmup + rounds`` pairs without pytest-benchmark (``long_lived_frozen``: the
        full collection before each round does not walk the benches' inputs again)."""
        with long_lived_frozen():
            for _ in range(warmup + rounds):
                self.run()

    def metrics(self, warmup: int) -> tuple[list[Metric], list[Metric]]:
        """``(implementation metrics, reference metrics)`` of the timed pairs; each of the
        implementation's metrics gets the reference's median as ``reference_value``, the
        paired ratio and the reference's samples."""
        mine = self.impl.metrics(self.impl.timed_results(warmup))
        theirs = self.ref.metrics(self.ref.timed_results(warmup))
        attach_reference(mine, theirs)
        return mine, theirs


def attach_reference(metrics: list[Metric], reference: list[Metric]) -> None:
    """Give each metric the same-named reference figure: median, samples and, when the
    sample lists pair up, the paired ratio."""
    by_name = {m.name: m for m in reference}
    for metric in metrics:
        ref = by_name.get(metric.name)
        if ref is None:
            continue
        metric.reference_value = ref.value
        metric.reference_samples = list(ref.samples)
        if len(ref.samples) == len(metric.samples):
            metric.paired = paired_ratio(metric.samples, ref.samples)
