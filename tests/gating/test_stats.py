"""The gate's statistics against textbook values, brute force and synthetic samples of known distributions
(seeded; no timing)."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from opscope.gating.stats import _u_counts, mann_whitney_greater, median, ratio_interval, u_statistic


def test_the_textbook_example():
    # SciPy's documented mannwhitneyu example (males vs females, after Conover): U1 = 17 and the exact
    # two-sided p is 0.1111, so the one-sided one is 0.0556 = 7/126 (7 of the C(9, 4) = 126 orderings).
    result = mann_whitney_greater([19, 22, 16, 29, 24], [20, 11, 17, 12])
    assert result.u == 17 and result.exact
    assert result.p == pytest.approx(7 / 126)
    assert result.min_p == pytest.approx(1 / 126)


def test_all_larger_is_the_smallest_p():
    result = mann_whitney_greater([3, 4, 5], [0, 1, 2])
    assert result.u == 9 and result.p == pytest.approx(1 / 20) == result.min_p


@pytest.mark.parametrize("m,n", [(1, 3), (3, 4), (5, 5), (2, 7), (4, 6)])
def test_the_exact_p_is_the_share_of_orderings_brute_force(m, n):
    rng = random.Random(m * 100 + n)
    after, before = [rng.random() for _ in range(m)], [rng.random() for _ in range(n)]
    values = after + before
    u = u_statistic(after, before)
    hits = total = 0
    for chosen in itertools.combinations(range(m + n), m):
        rest = [values[i] for i in range(m + n) if i not in chosen]
        total += 1
        hits += u_statistic([values[i] for i in chosen], rest) >= u
    assert mann_whitney_greater(after, before).p == pytest.approx(hits / total)


def test_the_null_distribution_counts_every_ordering_and_is_symmetric():
    for m, n in [(1, 1), (3, 5), (6, 4), (10, 10)]:
        counts = _u_counts(m, n)
        assert sum(counts) == math.comb(m + n, m) and len(counts) == m * n + 1
        assert list(counts) == list(reversed(counts))


def test_the_normal_approximation_is_close_to_the_exact_p():
    rng = random.Random(7)
    after = [rng.gauss(0.4, 1) for _ in range(60)]
    before = [rng.gauss(0, 1) for _ in range(60)]  # 3600 cells: over the exact limit
    approx = mann_whitney_greater(after, before)
    assert not approx.exact
    counts = _u_counts(60, 60)
    exact = sum(counts[int(approx.u):]) / math.comb(120, 60)
    assert approx.p == pytest.approx(exact, abs=0.002)


def test_ties_use_the_tie_corrected_approximation():
    # By hand: after [2, 2, 3], before [1, 2, 2]. Pairs won: 2 > 1 twice, 3 over all three, and 2 = 2 four
    # times at one half: U = 2 + 3 + 2 = 7; mean 4.5. Ties {1: 1, 2: 4, 3: 1}: sum(t^3 - t) = 60, so
    # var = 9/12 * (7 - 60/30) = 3.75; z = (7 - 4.5 - 0.5) / sqrt(3.75) = 1.0328; p = 0.1508.
    result = mann_whitney_greater([2, 2, 3], [1, 2, 2])
    assert result.u == 7 and not result.exact
    assert result.p == pytest.approx(0.5 * math.erfc(2 / math.sqrt(3.75) / math.sqrt(2)))
    assert result.p == pytest.approx(0.1508, abs=1e-4)


def test_identical_values_give_no_evidence():
    assert mann_whitney_greater([5.0, 5.0], [5.0, 5.0, 5.0]).p == 1.0


def test_false_positives_stay_near_the_level_on_samples_of_one_distribution():
    rng = random.Random(11)
    trials, rejected = 400, 0
    for _ in range(trials):
        before = [rng.lognormvariate(0, 0.2) for _ in range(15)]
        after = [rng.lognormvariate(0, 0.2) for _ in range(5)]
        rejected += mann_whitney_greater(after, before).p <= 0.01
    assert rejected <= 0.025 * trials  # the level is 1%: 4 expected, allow for chance


def test_a_shift_past_the_threshold_is_detected():
    rng = random.Random(12)
    detected = 0
    for _ in range(100):
        before = [rng.lognormvariate(0, 0.05) for _ in range(15)]
        after = [1.3 * rng.lognormvariate(0, 0.05) for _ in range(5)]
        detected += mann_whitney_greater(after, [b * 1.10 for b in before]).p <= 0.01
    assert detected >= 95


def test_the_bootstrap_interval_holds_the_true_ratio_and_is_deterministic():
    rng = random.Random(3)
    before = [rng.lognormvariate(0, 0.1) for _ in range(15)]
    after = [1.2 * rng.lognormvariate(0, 0.1) for _ in range(15)]
    lo, hi = ratio_interval(after, before, 0.99)
    assert lo < 1.2 < hi and lo > 1.0
    assert ratio_interval(after, before, 0.99) == (lo, hi)
    assert ratio_interval(after, before, 0.5)[1] - ratio_interval(after, before, 0.5)[0] < hi - lo


def test_median():
    assert median([3, 1, 2]) == 2 and median([4, 1, 2, 3]) == 2.5
    with pytest.raises(ValueError):
        median([])
