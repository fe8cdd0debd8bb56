"""opscope.table helpers that stand in for pandas/numpy: pairwise_sum (the float sum numpy's and pandas'
.sum() give, to the last bit: summary values computed without numpy must keep the bytes they had) and
filled (fillna); Coded columns (a column of few distinct values, read back exactly)."""

from __future__ import annotations

import math
import pickle
import random
from array import array

import numpy as np
import pandas as pd
import pytest

from opscope.table import (
    CODED_MAX_VALUES,
    CODED_SAMPLE,
    Coded,
    ColumnBuilder,
    Packed,
    Zeros,
    coded,
    compact,
    filled,
    packed,
    pairwise_sum,
    take,
    take_compact,
)


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


def test_coded_reads_back_every_value_with_its_type_and_sign():
    nan = float("nan")
    values = [0, 0.0, False, -0.0, "a", nan, None, 1, True, 1.0, "a", 0.0] * 50
    column = coded(values)
    assert isinstance(column, Coded) and len(column) == len(values)
    # 0, 0.0, False and -0.0 are equal as dict keys; each row still reads back its own type and sign
    assert [(type(v), repr(v)) for v in column] == [(type(v), repr(v)) for v in values]
    assert [(type(column[i]), repr(column[i])) for i in range(len(values))] == [(type(v), repr(v)) for v in values]
    assert column[0] is values[0] and column[5] is nan
    assert len(column.values) == 10 and column.codes.typecode == "B"


def test_a_coded_columns_numbers_are_new_objects_equal_to_the_rows():
    """A column of floats (or of ints) keeps its distinct values as objects of its own, made after the rows':
    the rows' objects, a few in each small-object arena of their list, held all of those arenas."""
    nan = float("nan")
    floats = [i * 0.5 for i in range(300)] * 3 + [-0.0, float("inf"), nan]
    column = coded(floats)
    assert isinstance(column, Coded)
    assert [repr(v) for v in column] == [repr(v) for v in floats]  # -0.0 keeps its sign
    assert all(type(v) is float for v in column.values)
    assert not any(v is row for v in column.values for row in floats[:300])
    assert column[-1] is nan and column == floats  # a NaN is its own object: equal only as itself
    ints = [10**6 + i for i in range(300)] * 3
    column = coded(ints)
    assert isinstance(column, Coded) and list(column) == ints and all(type(v) is int for v in column.values)
    assert not any(v is row for v in column.values for row in ints[:300])
    huge = [2**70 + i % 3 for i in range(100)]  # past 8 bytes: kept as they are
    column = coded(huge)
    assert isinstance(column, Coded) and list(column) == huge
    flags = [True, False] * 50  # bools are not ints here
    column = coded(flags)
    assert isinstance(column, Coded) and list(column) == flags and column.values[0] is True


def test_a_coded_column_of_one_value_holds_no_code_a_row_and_reads_as_its_list():
    values = ["x"] * 1000
    for column in (coded(values), Coded(array("B", bytes(1000)), ["x"])):
        assert isinstance(column, Coded) and isinstance(column.codes, Zeros)
        assert column == values and values == column and list(column) == values and len(column) == 1000
        assert column[0] == column[-1000] == column[999] == "x" and column[3:7] == ["x"] * 4 and column[::-300] == ["x"] * 4
        with pytest.raises(IndexError):
            column[1000]
        with pytest.raises(IndexError):
            column[-1001]
        assert list(reversed(column)) == values and "x" in column and "y" not in column and column.count("x") == 1000
        assert pickle.loads(pickle.dumps(column)) == values and isinstance(pickle.loads(pickle.dumps(column)).codes, Zeros)
        assert list(column.codes) == [0] * 1000 and column.codes[5:8] == Zeros(3) and column.codes == array("B", bytes(1000))
    builder = ColumnBuilder()
    builder.extend([7] * 10)
    builder.extend([7] * 5)
    built = builder.column()
    assert isinstance(built, Coded) and isinstance(built.codes, Zeros) and list(built) == [7] * 15
    taken = take_compact({"c": built}, [0, 3, -1])["c"]
    assert isinstance(taken, Coded) and isinstance(taken.codes, Zeros) and list(taken) == [7, 7, 7]
    with pytest.raises(IndexError):
        take_compact({"c": built}, [15])


def test_coded_reads_as_a_list():
    values = ["x", "y", "z"] * 1000
    column = coded(values)
    assert isinstance(column, Coded)
    assert column == values and values == column and column != values[:-1]
    assert column[1:4] == ["y", "z", "x"] and column[-1] == "z"
    assert list(reversed(column))[:2] == ["z", "y"]
    assert "y" in column and "w" not in column and column.count("x") == 1000 and column.index("z") == 2
    assert column + ["w"] == values + ["w"] and ["w"] + column == ["w"] + values
    assert list(zip(column, values, strict=True)) == list(zip(values, values, strict=True))
    assert pickle.loads(pickle.dumps(column)) == values
    with pytest.raises(TypeError):
        column[0] = "w"  # type: ignore[index]
    with pytest.raises(AttributeError):
        column.append("w")  # type: ignore[attr-defined]


def test_columns_not_worth_coding_stay_lists():
    assert coded([]) is None
    assert coded([float(i) for i in range(10_000)]) is None  # a time column: distinct from its first rows
    assert coded([[1], [1]] * 10) is None  # unhashable
    # few distinct values at first, more than 2**16 in all: given up at the chunk that passes the limit
    many = [i % 3 for i in range(CODED_SAMPLE)] + list(range(CODED_MAX_VALUES + 10))
    assert coded(many) is None
    two_bytes = coded([i % 1000 for i in range(CODED_SAMPLE * 4)])
    assert two_bytes is not None and two_bytes.codes.typecode == "H" and list(two_bytes) == [i % 1000 for i in range(CODED_SAMPLE * 4)]


def test_packed_reads_back_every_number_exactly():
    floats = [float(i) / 3 for i in range(5000)] + [-0.0, float("nan"), float("inf"), 1e308, 5e-324]
    column = packed(floats)
    assert isinstance(column, Packed) and column.numbers.typecode == "d"
    assert [repr(v) for v in column] == [repr(v) for v in floats] and column[-4] != column[-4]
    assert column[:3] == floats[:3] and type(column[:3]) is list and list(reversed(column))[0] == 5e-324
    ints = [i * 7919 for i in range(-2500, 2500)] + [2**63 - 1, -(2**63)]
    packed_ints = packed(ints)
    assert isinstance(packed_ints, Packed) and packed_ints.numbers.typecode == "q" and packed_ints == ints
    assert packed_ints + [1] == ints + [1] and [1] + packed_ints == [1] + ints
    with pytest.raises(TypeError):
        packed_ints[0] = 1  # type: ignore[index]
    assert packed([2**63]) is None  # beyond 8 bytes
    small = packed(list(range(-5, 5000)))
    assert isinstance(small, Packed) and small.numbers.typecode == "i" and small == list(range(-5, 5000))
    assert packed([1, 2.0]) is None and packed([True, 1]) is None and packed([]) is None


def test_compact_replaces_only_the_columns_it_codes():
    table = {"ts": [float(i) for i in range(5000)], "name": ["aten::mm", "aten::add"] * 2500,
             "mixed": [i if i % 2 else str(i) for i in range(5000)]}
    mixed = table["mixed"]
    compact(table)
    assert isinstance(table["ts"], Packed) and isinstance(table["name"], Coded) and table["mixed"] is mixed
    assert table["name"] == ["aten::mm", "aten::add"] * 2500 and table["ts"] == [float(i) for i in range(5000)]


def _built(values: list, sizes: list[int]) -> list:
    builder = ColumnBuilder()
    at = 0
    for size in sizes:
        batch = list(values[at:at + size])
        builder.extend(batch)
        at += size
    builder.extend(list(values[at:]))
    return builder.column()


def _same(column: list, values: list) -> bool:
    return len(column) == len(values) and all(
        type(a) is type(b) and (a == b or (a != a and b != b))
        and (type(a) is not float or math.copysign(1.0, a) == math.copysign(1.0, b))
        for a, b in zip(column, values, strict=True))


def test_column_builder_gives_compacts_forms_batch_by_batch():
    names = ["aten::mm", "aten::add", "aten::relu"] * 3000
    column = _built(names, [100, 5000])
    assert isinstance(column, Coded) and column.codes.typecode == "B" and column == names
    # past 256 distinct values the codes widen to 2 bytes, the earlier rows kept
    widening = [f"op{i % 1000}" for i in range(CODED_SAMPLE * 4)]
    column = _built(widening, [200, 300, 10_000])
    assert isinstance(column, Coded) and column.codes.typecode == "H" and column == widening
    # distinct numbers (times, ids) become Packed once the sample shows it, the coded rows carried over
    times = [float(i) * 0.5 for i in range(CODED_SAMPLE * 3)]
    column = _built(times, [10, 4000, 100])
    assert isinstance(column, Packed) and column.numbers.typecode == "d" and _same(column, times)
    ids = list(range(CODED_SAMPLE * 3))
    column = _built(ids, [CODED_SAMPLE])
    assert isinstance(column, Packed) and column.numbers.typecode == "i" and _same(column, ids)
    # ints in 4 bytes while they fit, widened to 8 by the batch that does not
    wide = ids + [2**40 + i for i in range(100)]
    column = _built(wide, [CODED_SAMPLE, CODED_SAMPLE * 2, 50])
    assert isinstance(column, Packed) and column.numbers.typecode == "q" and _same(column, wide)
    assert _built([], []) == [] and ColumnBuilder().column() == []


def test_column_builder_keeps_types_and_signs_or_gives_a_list():
    # 0.0 and -0.0: a Packed column keeps each sign (a Coded one would read -0.0 back as 0.0)
    durations = [2.5, 0.0, 1.0] * 100 + [-0.0] + [2.5] * 10
    column = _built(durations, [300])
    assert isinstance(column, Packed) and _same(column, durations)
    # types that compare equal (0, 0.0, False), mixed types, unhashable values, ints past 8 bytes: a list
    for values in ([0, 1] * 50 + [0.0, False], [1, "a"] * 10, [[1], [2]] * 10, list(range(10_000)) + [2**64]):
        column = _built(values, [len(values) // 2])
        assert type(column) is list and _same(column, values)
    # NaN: each object its own value, as coded() keys it
    nan = float("nan")
    column = _built([nan, 1.0] * 100, [7])
    assert isinstance(column, Coded) and column[0] is nan and _same(column, [nan, 1.0] * 100)


def test_column_builder_reads_back_random_columns_exactly():
    rng = random.Random(11)
    pools = [["a", "b", "c"], [0.0, 1.5, -0.0, float("inf")], [0, 1, -1, 2**62], [0, 0.0, False, "x"],
             [str(i) for i in range(400)]]
    for trial in range(60):
        pool = pools[trial % len(pools)]
        n = rng.choice([0, 1, 50, 3000, 9000])
        distinct = trial % 3 == 0 and all(type(v) is float for v in pool)
        values = [rng.random() for _ in range(n)] if distinct else [rng.choice(pool) for _ in range(n)]
        sizes = [rng.randint(1, 3000) for _ in range(5)]
        column = _built(values, sizes)
        assert _same(column, values), (trial, pool)
        compacted = {"c": list(values)}
        compact(compacted)
        assert _same(compacted["c"], values)


def test_take_compact_takes_the_rows_as_take_does_keeping_each_columns_form():
    table = {"name": coded(["a", "b", "a", "c"] * 10), "ts": packed([float(i) for i in range(40)]),
             "id": packed(list(range(100, 140))), "note": ["x", "y", "z", "w"] * 10}
    index = [39, 0, 7, 7, 12]
    got = take_compact(table, index)
    assert {c: list(v) for c, v in got.items()} == take(table, index)
    assert isinstance(got["name"], Coded) and got["name"].values is table["name"].values
    assert isinstance(got["ts"], Packed) and got["ts"].numbers.typecode == "d"
    assert isinstance(got["id"], Packed) and got["id"].numbers.typecode == table["id"].numbers.typecode
    assert isinstance(got["note"], list)
