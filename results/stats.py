"""Small statistics for regression gates: the Mann-Whitney U test, numpy only.

``mann_whitney_u(x, y, alternative)`` tests whether ``x`` is stochastically greater (or
less) than ``y`` from raw samples, without assuming a distribution (timings are skewed and
heavy-tailed, so a t-test is the wrong tool). Small samples (``len(x) + len(y) <=
EXACT_MAX_N``) get the exact permutation distribution of the rank sum, conditional on ties;
larger ones the normal approximation with tie and continuity corrections.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, NamedTuple

import numpy as np

from kvcheck.errors import KVCheckInputError

__all__ = ["EXACT_MAX_N", "MannWhitneyResult", "mann_whitney_u", "min_p_value"]

EXACT_MAX_N = 50
Alternative = Literal["greater", "less", "two-sided"]


class MannWhitneyResult(NamedTuple):
    """``u``: U statistic of ``x`` (pairs with x > y, ties count one half); ``p``: p-value of
    the requested alternative; ``method``: ``"exact"`` or ``"normal"``."""

    u: float
    p: float
    method: str


def _midranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks of ``values``, tied values sharing the mean of their ranks."""
    order = np.argsort(values, kind="mergesort")
    sorted_values = values[order]
    ranks = np.empty(len(values), dtype=float)
    start = 0
    n = len(values)
    while start < n:
        end = start
        while end + 1 < n and sorted_values[end + 1] == sorted_values[start]:
            end += 1
        ranks[order[start:end + 1]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def _exact_rank_sum_distribution(doubled_ranks: np.ndarray, n1: int) -> np.ndarray:
    """P(sum of doubled ranks of a random n1-subset == s) for every s (index = s).

    Counting subsets by dynamic programming over the items; doubling makes midranks
    integers, so ties are handled exactly.
    """
    total = int(doubled_ranks.sum())
    counts = np.zeros((n1 + 1, total + 1))
    counts[0, 0] = 1.0
    for a in doubled_ranks.astype(int):
        # Right side is evaluated first, so row k is built from the old row k - 1.
        counts[1:, a:] = counts[1:, a:] + counts[:-1, :total + 1 - a]
    dist: np.ndarray = counts[n1] / math.comb(len(doubled_ranks), n1)
    return dist


def mann_whitney_u(x: Sequence[float], y: Sequence[float],
                   alternative: Alternative = "two-sided") -> MannWhitneyResult:
    """Mann-Whitney U test of ``x`` against ``y``.

    ``alternative="greater"``: H1 is "x tends to be larger than y" (a lower-is-better timing
    that regressed, with x the current samples); ``"less"`` the opposite; ``"two-sided"``
    either.

    Raises:
        KVCheckInputError: an empty sample or an unknown alternative (a ``ValueError``).
    """
    if alternative not in ("greater", "less", "two-sided"):
        raise KVCheckInputError(f"alternative must be 'greater', 'less' or 'two-sided', "
                                f"got {alternative!r}")
    xa = np.asarray(x, dtype=float)
    ya = np.asarray(y, dtype=float)
    n1, n2 = len(xa), len(ya)
    if n1 == 0 or n2 == 0:
        raise KVCheckInputError("mann_whitney_u needs at least one sample on each side")
    ranks = _midranks(np.concatenate([xa, ya]))
    rank_sum = float(ranks[:n1].sum())
    u = rank_sum - n1 * (n1 + 1) / 2
    n = n1 + n2
    if n <= EXACT_MAX_N:
        dist = _exact_rank_sum_distribution(2 * ranks, n1)
        s_obs = round(2 * rank_sum)
        p_greater = float(dist[s_obs:].sum())
        p_less = float(dist[:s_obs + 1].sum())
        method = "exact"
    else:
        _, tie_counts = np.unique(np.concatenate([xa, ya]), return_counts=True)
        tie_term = float((tie_counts ** 3 - tie_counts).sum()) / (n * (n - 1))
        var = n1 * n2 / 12 * ((n + 1) - tie_term)
        mean = n1 * n2 / 2
        if var <= 0:  # every value equal: no evidence either way
            return MannWhitneyResult(u, 1.0, "normal")
        sd = math.sqrt(var)
        p_greater = 0.5 * math.erfc((u - mean - 0.5) / sd / math.sqrt(2))
        p_less = 0.5 * math.erfc((mean - u - 0.5) / sd / math.sqrt(2))
        method = "normal"
    p = {"greater": p_greater, "less": p_less,
         "two-sided": 2 * min(p_greater, p_less)}[alternative]
    return MannWhitneyResult(u, min(1.0, max(0.0, p)), method)


def min_p_value(n1: int, n2: int) -> float:
    """The smallest one-sided p-value any data with these sample sizes can reach
    (``1 / C(n1 + n2, n1)``): if it is not below alpha, the test cannot detect anything."""
    if n1 == 0 or n2 == 0:
        return 1.0
    return 1.0 / math.comb(n1 + n2, n1)
