"""The statistics of the gate, for few noisy samples and without scipy: the one-sided Mann-Whitney U test
(exact null distribution for small samples without ties, the normal approximation with tie and continuity
corrections otherwise) and a percentile bootstrap interval of the ratio of medians."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

# The exact null distribution is counted for samples up to this size (n * m cells of the DP table); larger
# ones use the normal approximation, which is within 0.001 of it there.
EXACT_MAX_CELLS = 2_500
BOOTSTRAP_ROUNDS = 1_000
BOOTSTRAP_SEED = 20_261_205  # fixed: the same samples give the same interval on every machine


def median(values: Sequence[float]) -> float:
    """The median of a non-empty sequence (the mean of the middle two for an even count)."""
    s = sorted(values)
    n = len(s)
    if n == 0:
        raise ValueError("median of no values")
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def u_statistic(after: Sequence[float], before: Sequence[float]) -> float:
    """Mann-Whitney U of `after` against `before`: the pairs (a, b) with a > b, ties counting one half."""
    u = 0.0
    for a in after:
        for b in before:
            u += 1.0 if a > b else 0.5 if a == b else 0.0
    return u


@lru_cache(maxsize=256)
def _u_counts(m: int, n: int) -> tuple[int, ...]:
    """How many of the C(m+n, m) orderings of m `after` and n `before` values (no ties) give each U = 0..m*n."""
    # counts[j][u] for m' = i `after` values and j `before` values, built up i by i: f(i, j, u) =
    # f(i-1, j, u-j) (the largest value is an `after`: it beats all j) + f(i, j-1, u) (it is a `before`).
    prev = [[1] for _ in range(n + 1)]  # i = 0: U = 0 only
    for i in range(1, m + 1):
        cur: list[list[int]] = [[1]]  # j = 0: U = 0 only
        for j in range(1, n + 1):
            size = i * j + 1
            row = [0] * size
            for u, c in enumerate(prev[j]):  # an `after` on top: U + j
                row[u + j] += c
            for u, c in enumerate(cur[j - 1]):
                row[u] += c
            cur.append(row)
        prev = cur
    return tuple(prev[n])


@dataclass(frozen=True)
class UTest:
    """A one-sided Mann-Whitney U test that `after` is stochastically larger than `before`."""

    u: float
    p: float  # P(U >= u) under "same distribution"
    exact: bool
    min_p: float  # the smallest p these sample sizes can give: above the level, the test cannot reject


def mann_whitney_greater(after: Sequence[float], before: Sequence[float]) -> UTest:
    """H1: `after` tends to be larger than `before`. Exact p-value when both samples are small and have no
    ties, else the normal approximation (tie-corrected variance, continuity correction)."""
    m, n = len(after), len(before)
    if m == 0 or n == 0:
        raise ValueError("a Mann-Whitney test needs samples on both sides")
    u = u_statistic(after, before)
    min_p = 1.0 / math.comb(m + n, m)
    values = list(after) + list(before)
    tied = len(set(values)) < len(values)
    if not tied and m * n <= EXACT_MAX_CELLS:
        counts = _u_counts(m, n)
        k = int(round(u))
        return UTest(u=u, p=sum(counts[k:]) / math.comb(m + n, m), exact=True, min_p=min_p)
    mean = m * n / 2
    total = m + n
    ties: dict[float, int] = {}
    for v in values:
        ties[v] = ties.get(v, 0) + 1
    tie_term = sum(t ** 3 - t for t in ties.values()) / (total * (total - 1))
    var = m * n / 12 * ((total + 1) - tie_term)
    if var <= 0:  # every value the same: no evidence either way
        return UTest(u=u, p=1.0, exact=False, min_p=min_p)
    z = (u - mean - 0.5) / math.sqrt(var)
    return UTest(u=u, p=0.5 * math.erfc(z / math.sqrt(2)), exact=False, min_p=min_p)


def ratio_interval(after: Sequence[float], before: Sequence[float], confidence: float,
                   rounds: int = BOOTSTRAP_ROUNDS, seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """A two-sided percentile bootstrap interval, at `confidence`, of median(after) / median(before): both
    samples resampled with replacement `rounds` times. (inf where a resampled baseline median is 0.)"""
    rng = random.Random(seed)
    ratios = []
    for _ in range(rounds):
        a = median(rng.choices(after, k=len(after)))
        b = median(rng.choices(before, k=len(before)))
        ratios.append(a / b if b > 0 else math.inf)
    ratios.sort()
    tail = (1 - confidence) / 2
    lo = ratios[min(rounds - 1, max(0, math.floor(tail * rounds)))]
    hi = ratios[min(rounds - 1, max(0, math.ceil((1 - tail) * rounds) - 1))]
    return lo, hi
