"""opscope.table helpers that stand in for pandas/numpy: pairwise_sum (the float sum numpy's and pandas'
.sum() give, to the last bit: summary values computed without numpy must keep the bytes they had) and
filled (fillna)."""

from __future__ import annotations

import math
import random

import numpy as np
import pandas as pd

from opscope.table import filled, pairwise_sum


def test_pairwise_sum_equals_numpy_and_pandas_bit_for_bit():
    rng = random.Random(7)
    plain_differs = 0
    for n in [0, 1, 7, 8, 9, 15, 16, 127, 128, 129, 255, 256, 1000, 4099]:
        values = [rng.expovariate(1.0) * 10 ** rng.randint(-3, 6) for _ in range(n)]
        assert pairwise_sum(values) == float(np.sum(values)) == float(pd.Series(values, dtype=float).sum())
        plain = 0.0
        for x in values:
            plain += x
        plain_differs += plain != float(np.sum(values))
    assert plain_differs  # the order matters on these values: a left-to-right sum would not do


def test_pairwise_sum_by_hand():
    assert pairwise_sum([]) == 0.0
    assert pairwise_sum([1, 2, 3]) == 6.0
    # 9 values: 8 lanes hold 1e16, 1, ..., 1 and combine as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7));
    # the 9th is added last. Left to right, each 1.0 would vanish into 1e16 (its float spacing is 2).
    assert pairwise_sum([1e16] + [1.0] * 8) == (((1e16 + 1.0) + 2.0) + 4.0) + 1.0 == 1e16 + 8


def test_filled_replaces_what_pandas_fillna_replaces():
    values = ["a", math.nan, None, "", 0, 0.0, False]
    assert filled(values) == pd.Series(values, dtype=object).fillna("").tolist() == ["a", "", "", "", 0, 0.0, False]
    assert filled([math.nan, "memory"], "unknown") == ["unknown", "memory"]


def test_sort_order_is_the_tuple_sort_with_ties_in_index_order():
    import random

    from opscope.table import sort_order

    rng = random.Random(7)
    n = 400
    a = [rng.randrange(4) for _ in range(n)]  # many ties on every key
    b = [rng.choice([0.0, 0.5, 1.0, 2.5]) for _ in range(n)]
    c = [rng.choice([True, False]) for _ in range(n)]
    expected = sorted(range(n), key=lambda i: (a[i], -b[i], c[i]))
    assert list(sort_order(n, ((a, False), (b, True), (c, False)))) == expected
    assert list(sort_order(n, ((b, True),))) == sorted(range(n), key=lambda i: -b[i])
    assert list(sort_order(3, ())) == [0, 1, 2] and list(sort_order(0, ((a, False),))) == []
    # rows already in order (ties included) come back as range(n), nothing sorted
    a2, b2 = [a[i] for i in expected], [b[i] for i in expected]
    assert sort_order(n, ((a2, False), (b2, True))) == range(n)
    assert list(sort_order(3, (([1, 1, 0], False),))) == [2, 0, 1]  # one pair out of order: sorted
