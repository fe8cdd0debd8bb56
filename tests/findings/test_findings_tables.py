"""The findings pass on plain tables (opscope.table): the helpers that replaced pandas/numpy give the
floats those gave, the event-tree sums match hand-computed values, and importing the rules loads neither
pandas nor numpy."""

from __future__ import annotations

import math
import random
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from opscope.findings import Context
from opscope.findings.overhead import _argmax
from opscope.findings.tree import ops_rows_for_events, subtree_sum, user_mask
from opscope.machine.peaks import Peaks
from opscope.sources import HARNESS
from opscope.table import group_sums as _group_sums
from opscope.table import largest_first as _largest_first
from opscope.table import pairwise_sum


def _floats(rng: random.Random, n: int) -> list[float]:
    return [rng.random() * 10 ** rng.randint(-3, 6) for _ in range(n)]


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 17, 127, 128, 129, 136, 300, 1000, 5000])
def test_pairwise_sum_is_numpys_float_sum(n):
    rng = random.Random(n)
    values = _floats(rng, n)
    if n > 3:
        values[n // 2] = math.nan  # pandas' sum skips it: counts as 0
    assert pairwise_sum(values) == pd.Series(values, dtype=float).sum()
    assert pairwise_sum([0.0 if v != v else v for v in values]) == np.sum(np.nan_to_num(values))


def test_pairwise_sum_differs_from_a_sequential_sum():
    # Why it exists: numpy adds 8+ values as a tree, so the last bits differ from adding left to right.
    # 1 and seven e = 2^-53: sequentially each e rounds away (1 + e is a tie, rounds to 1); numpy does
    # ((1 + e) + (e + e)) + ((e + e) + (e + e)): only the first e is lost, 1 + 6e = 1 + 3 * 2^-52.
    e = 2.0 ** -53
    values = [1.0] + [e] * 7
    assert sum(values) == 1.0
    assert pairwise_sum(values) == 1.0 + 3 * 2.0 ** -52 == float(np.sum(values))


@pytest.mark.parametrize("grouped", [True, False])
def test_group_sums_are_pandas_groupby_sums(grouped):
    rng = random.Random(7)
    for n in (1, 3, 9, 50, 400):
        keys = [f"aten::op{rng.randrange(6)}" for _ in range(n)]
        if grouped:
            keys.sort()  # rows grouped in key order: pandas takes np.add.reduceat's path
        values = _floats(rng, n)
        expected = pd.DataFrame({"k": keys, "v": values}).groupby("k")["v"].sum()
        assert list(_group_sums(keys, values).items()) == list(expected.items())


def test_group_sums_drop_missing_keys_and_rank_largest_first_ties_in_key_order():
    sums = _group_sums(["b", math.nan, "a", "c", "b"], [1.0, 100.0, 2.0, 3.0, 1.0])
    assert sums == {"a": 2.0, "b": 2.0, "c": 3.0}
    assert _largest_first(sums) == [("c", 3.0), ("a", 2.0), ("b", 2.0)]


def test_argmax_is_the_first_largest():
    assert _argmax([1.0, 3.0, 2.0, 3.0]) == 1
    assert _argmax([1.0, math.nan, 5.0]) == 1  # as np.argmax
    assert _argmax([4.0]) == 0


def _events() -> dict[str, list]:
    # 0 step-root (depth 0) > 1 (depth 1) > 2, 3 (depth 2); 4 a second root; 5 outside the steps.
    return {"name": ["a", "b", "c", "d", "e", "f"],
            "parent": [-1, 0, 1, 1, -1, -1], "depth": [0, 1, 2, 2, 0, 0],
            "time_us": [1.0, 2.0, 4.0, math.nan, 16.0, 32.0],
            "step": [0, 0, 0, 0, 1, -1],
            "source_location": ["m.py:1", "m.py:2", "", HARNESS, "m.py:5", "m.py:6"]}


def _context(events: dict[str, list], ops: dict[str, list] | None = None) -> Context:
    return Context(ops=ops or {"time_us_total": [1.0]}, events=events, peaks=Peaks(None), gpu=False,
                   source="trace", steps=1, step_time_us=1.0)


def test_subtree_sum_adds_each_event_and_everything_beneath_it_nan_as_zero():
    ctx = _context(_events())
    assert list(subtree_sum(ctx, "time_us")) == [1.0 + 2.0 + 4.0, 2.0 + 4.0, 4.0, 0.0, 16.0, 32.0]
    assert list(user_mask(ctx)) == [True, True, True, False, True, False]


def test_ops_rows_for_events_reads_tables_and_dataframes_alike():
    key = ("op", "input_dims", "input_dtypes", "input_strides", "concrete_inputs", "source_location", "module")
    ops = {c: ["x", "y"] if c == "op" else ["", ""] for c in key}
    ev = {"name": ["y", "x", "x", "z"], "is_row": [True, True, False, True],
          **{c: [""] * 4 for c in key[1:]}}
    assert list(ops_rows_for_events(ops, ev)) == [1, 0, -1, -1]


def test_importing_the_rules_loads_neither_pandas_nor_numpy():
    code = ("import sys, opscope.findings; "
            "print(sorted(m for m in ('pandas', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
