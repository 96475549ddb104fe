"""Mann-Whitney U: exact p-values against hand counts and brute-force enumeration, the
normal approximation against a hand-derived z."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from kvcheck.results.stats import mann_whitney_u, min_p_value


def _brute_force_p_greater(x: list[float], y: list[float]) -> float:
    """P(U >= U_obs) over every way of choosing which pooled values form x (independent of
    the ranks-and-DP code: U is counted pair by pair)."""

    def u_of(xs: list[float], ys: list[float]) -> float:
        return sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in xs for b in ys)

    pooled = x + y
    observed = u_of(x, y)
    hits = total = 0
    for chosen in itertools.combinations(range(len(pooled)), len(x)):
        rest = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        total += 1
        hits += u_of([pooled[i] for i in chosen], rest) >= observed - 1e-9
    return hits / total


def test_complete_separation_of_three_and_three() -> None:
    """x above every y: only 1 of C(6,3) = 20 splits is as extreme, p = 0.05."""
    result = mann_whitney_u([4, 5, 6], [1, 2, 3], "greater")
    assert result.u == 9 and result.p == pytest.approx(0.05) and result.method == "exact"


def test_alternatives_of_the_reverse_case() -> None:
    """x below every y: 'greater' is certain (p = 1), 'less' 1/20, two-sided 2/20."""
    assert mann_whitney_u([1, 2, 3], [4, 5, 6], "greater").p == pytest.approx(1.0)
    assert mann_whitney_u([1, 2, 3], [4, 5, 6], "less").p == pytest.approx(0.05)
    assert mann_whitney_u([1, 2, 3], [4, 5, 6], "two-sided").p == pytest.approx(0.1)


def test_two_against_three_by_hand() -> None:
    """x = {3, 5}, y = {1, 2, 4}: rank sum of x is 3 + 5 = 8, U = 5; of the 10 rank pairs only
    {3,5} and {4,5} sum to >= 8, so p = 2/10."""
    result = mann_whitney_u([3, 5], [1, 2, 4], "greater")
    assert result.u == 5 and result.p == pytest.approx(0.2)


def test_ties_use_midranks_exactly() -> None:
    """x = {2, 3}, y = {1, 2}: midranks 1, 2.5, 2.5, 4; x sums to 6.5 (U = 3.5); 2 of the 6
    rank pairs reach 6.5, so p = 1/3."""
    result = mann_whitney_u([2, 3], [1, 2], "greater")
    assert result.u == 3.5 and result.p == pytest.approx(1 / 3)


@pytest.mark.parametrize("seed", range(6))
def test_exact_matches_brute_force_with_ties(seed: int) -> None:
    """Small samples drawn from few values (many ties) against full enumeration."""
    rnd = random.Random(seed)
    x = [float(rnd.randint(0, 4)) for _ in range(rnd.randint(1, 6))]
    y = [float(rnd.randint(0, 4)) for _ in range(rnd.randint(1, 6))]
    assert mann_whitney_u(x, y, "greater").p == pytest.approx(_brute_force_p_greater(x, y),
                                                              abs=1e-12)
    assert mann_whitney_u(x, y, "less").p == pytest.approx(_brute_force_p_greater(y, x),
                                                           abs=1e-12)


def test_normal_approximation_by_hand() -> None:
    """26 + 26 samples (beyond the exact limit), no ties, x = y + 10.5: x_i beats
    min(26, i + 11) of the y's, so U = (11 + ... + 25) + 11 * 26 = 270 + 286 = 556; mean
    26 * 26 / 2 = 338, variance 26 * 26 * 53 / 12, continuity correction 0.5."""
    y = [float(i) for i in range(26)]
    x = [i + 10.5 for i in range(26)]
    result = mann_whitney_u(x, y, "greater")
    z = (556 - 338 - 0.5) / math.sqrt(26 * 26 * 53 / 12)
    assert result.method == "normal" and result.u == 556
    assert result.p == pytest.approx(0.5 * math.erfc(z / math.sqrt(2)), rel=1e-9)
    assert 3e-5 < result.p < 4e-5  # z = 3.98


def test_identical_large_samples_give_no_evidence() -> None:
    assert mann_whitney_u([1.0] * 40, [1.0] * 40, "greater").p == 1.0


def test_min_p_value() -> None:
    """1 / C(n1 + n2, n1): three against three can never beat 0.05."""
    assert min_p_value(3, 3) == pytest.approx(1 / 20)
    assert min_p_value(5, 5) == pytest.approx(1 / 252)
    assert min_p_value(0, 5) == 1.0


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="at least one sample"):
        mann_whitney_u([], [1.0])
    with pytest.raises(ValueError, match="alternative"):
        mann_whitney_u([1.0], [2.0], "bigger")  # type: ignore[arg-type]
