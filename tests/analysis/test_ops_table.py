"""The ops table and the run summary on plain column tables (opscope.table): the numbers against hand
computation and against pandas, which computed them before (the same values to the last bit)."""

from __future__ import annotations

import math
import random
import subprocess
import sys
import types

import pandas as pd
import pytest

from conftest import TRACES
from opscope.analysis.events import build_events
from opscope.analysis.ops_table import (
    KEY,
    add_roofline,
    build_ops_table,
    classify_bound,
    event_costs,
)
from opscope.analysis.pipeline import step_stats, summarize, top_ops, trace_mode, union_length
from opscope.analysis.trace_file import _mode
from opscope.machine.peaks import Peaks, gpu_peaks
from opscope.table import group_sums as _group_sums
from opscope.table import pairwise_sum
from opscope.trace.reader import load_trace

NAN = math.nan


def _values(rng: random.Random, n: int) -> list[float]:
    return [rng.expovariate(1.0) * 10 ** rng.randint(-3, 6) for _ in range(n)]


def test_series_sum_is_pandas_sum_to_the_last_bit():
    rng = random.Random(7)
    sizes = [*range(0, 140), 255, 256, 257, 1000, 4097, 9001]
    for n in sizes:
        values = _values(rng, n)
        if n > 3:
            values[n // 2] = NAN  # pandas skips NaN (counts it as 0)
        expected = float(pd.Series(values, dtype=float).sum())
        assert pairwise_sum(values).hex() == expected.hex(), n
    # the order matters: a plain left-to-right sum would not match for some of these
    assert any(sum(v := _values(random.Random(n), n)) != pairwise_sum(v) for n in (100, 1000, 4097))
    assert pairwise_sum([-0.0] * 9) == 0.0 and pairwise_sum([]) == 0.0


def test_group_sums_are_pandas_groupby_sums_to_the_last_bit():
    rng = random.Random(3)
    keys = [rng.choice(["memory", "compute", "overhead", "unknown"]) for _ in range(3000)]
    values = _values(rng, 3000)
    values[5] = NAN
    keys[9] = NAN  # a missing key is left out, as groupby drops it
    expected = pd.Series(values).groupby(pd.Series(keys)).sum()
    got = _group_sums(keys, values)
    assert sorted(got) == sorted(expected.index)
    assert all(got[k].hex() == float(expected[k]).hex() for k in got)


PEAKS = Peaks(memory_bandwidth_gbps=100.0, flops_gflops={"float32": 1000.0, "bfloat16": 4000.0})


def test_roofline_columns_by_hand():
    table = {"calls": [4, 0, 2], "time_us_total": [8.0, 0.0, 10.0], "flops_per_call": [2e6, NAN, 0.0],
             "bytes_per_call": [1e6, 1e3, 0.0], "family": ["matmul", "", "view"], "dtype": ["bfloat16", "", ""],
             "kernels": ["", "", ""]}
    out = add_roofline(table, PEAKS, gpu=True)
    assert out["time_us_per_call"][0] == 2.0 and math.isnan(out["time_us_per_call"][1])
    assert out["arithmetic_intensity"][0] == 2.0          # 2e6 FLOP / 1e6 B
    assert out["achieved_gflops"][0] == 1000.0             # 2e6 FLOP in 2 us
    assert out["achieved_gbps"][0] == 500.0                # 1e6 B in 2 us
    assert out["pct_peak_flops"][0] == 25.0                # of bfloat16's 4000 GFLOP/s
    assert out["pct_peak_bandwidth"][0] == 500.0
    assert out["ceiling"] == ["bfloat16", "", "float32"]
    # ideal time max(2e6/4e6, 1e6/1e5) us = 10 us; intensity 2 < ridge 40
    assert out["bound"] == ["memory", "unknown", "overhead"]
    assert math.isnan(out["achieved_gbps"][1]) and math.isnan(out["arithmetic_intensity"][2])
    assert list(out)[:7] == list(table)  # the input's columns first, in order


def test_classify_bound_edges():
    assert classify_bound(NAN, 1.0, "matmul", 1.0, 1.0) == "unknown"
    assert classify_bound(0.0, 0.0, "view", None, None) == "overhead"
    assert classify_bound(1e9, 1e3, "matmul", None, 100.0) == "unknown"
    assert classify_bound(1e9, 1e3, "matmul", 1000.0, 100.0) == "compute"


@pytest.fixture(scope="module")
def bert():
    trace = load_trace(TRACES / "h100_bert-small_bf16.json.gz")
    return build_events(trace), trace.kernels


def test_ops_table_groups_the_events_as_pandas_would(bert):
    ev, kernels = bert
    ops = build_ops_table(ev, gpu=True, peaks=gpu_peaks("NVIDIA H100 80GB HBM3"), kernels=kernels)
    # every kernel's time is in exactly one row: op rows, kernel rows, the unattributed row
    assert math.fsum(ops["time_us_total"]) == pytest.approx(math.fsum(kernels["dur"]), rel=1e-12)
    frame = pd.DataFrame({k: ev["name" if k == "op" else k] for k in KEY}).assign(
        time=ev["device_us"], is_row=ev["is_row"])
    groups = frame[frame["is_row"]].groupby(KEY, sort=False)["time"].agg(["size", "sum"])
    rows = {tuple(r[k] for k in KEY): r for r in ({c: ops[c][i] for c in ops} for i in range(len(ops["op"])))}
    for key, (size, total) in groups.iterrows():
        assert rows[key]["calls"] == size and rows[key]["time_us_total"] == pytest.approx(total, rel=1e-12)
    times = ops["time_us_total"]
    assert times == sorted(times, reverse=True)
    assert ops["time_share"] == [t / pairwise_sum(times) for t in times]
    assert list(ops)[:6] == KEY[:6] and list(ops)[-2:] == ["module", "module_class"]


def test_event_costs_make_an_ancestor_doing_the_same_work_a_composite():
    dims, types_, strides, concrete = "[[4, 4], [4, 4], []]", '["float", "float", "Scalar"]', "[[4, 1], [4, 1], []]", \
        '["", "", "1"]'
    ev = {"name": ["aten::add", "aten::add", "aten::mul", "aten::detach"], "input_dims": [dims] * 4,
          "input_dtypes": [types_] * 4, "input_strides": [strides] * 4, "concrete_inputs": [concrete] * 4,
          "is_row": [True, True, True, False], "row_parent": [-1, 0, -1, -1]}
    costs = event_costs(ev)
    # 4x4 float32: one FLOP per element, two reads and a write of 64 bytes each
    assert costs["flops"][:3] == [0.0, 16.0, 16.0] and costs["bytes"][:3] == [0.0, 192.0, 192.0]
    assert costs["family"] == ["composite", "elementwise", "elementwise", ""]
    assert costs["dtype"] == ["float32"] * 3 + [""] and math.isnan(costs["flops"][3])


def test_union_length_and_step_stats_by_hand():
    assert union_length([5.0, 0.0, 1.0], [6.0, 2.0, 3.0]) == 4.0  # [0,3) and [5,6)
    assert union_length([], []) == 0.0
    kernels = {"ts": [10.0, 40.0], "dur": [5.0, 25.0]}
    no_steps = types.SimpleNamespace(steps={"dur": []}, kernels=kernels)
    ev = {"ts": [0.0, 3.0, 90.0], "end": [50.0, 4.0, 95.0], "captured": [False, False, True]}
    assert step_stats(no_steps, ev) == (1, 65.0)  # first op at 0 to the last kernel's end (the captured op never ran)
    with_steps = types.SimpleNamespace(steps={"dur": [10.0, 20.0, 45.0]}, kernels=kernels)
    assert step_stats(with_steps, ev) == (3, 25.0)


def test_summary_shares_and_top_ops_by_hand():
    ops = {"op": ["aten::mm", "aten::add", "aten::view"], "input_dims": ["", "[[2]]", ""],
           "source_location": ["m.py:1", "", "m.py:3"], "time_us_total": [6.0, 3.0, 1.0],
           "flops_per_call": [1.0, NAN, 0.0], "bytes_per_call": [1.0, 1.0, 0.0],
           "bound": ["compute", "unknown", "overhead"], "calls": [1, 2, 3]}
    s = summarize(ops, steps=2, step_time_us=5.0, n_findings=0, busy=None)
    assert s["total_time_us"] == 10.0 and s["ops_covered_time_share"] == 0.7
    assert s["bound_time_share"] == {"memory": 0.0, "compute": 0.6, "overhead": 0.1, "unknown": 0.3}
    assert s["top_ops"][1] == {"op": "aten::add", "input_dims": "[[2]]", "source_location": "", "time_us_total": 3.0,
                               "flops_per_call": None, "bytes_per_call": 1.0, "bound": "unknown", "calls": 2}
    assert top_ops(ops, 1) == s["top_ops"][:1]


def test_trace_mode_and_busiest_device():
    assert trace_mode({"name": ["aten::mm", "MmBackward0_backward"]}) == "train"
    assert trace_mode({"name": ["aten::mm"]}) == "inference"
    assert _mode([1, 0, 1, 0, 2]) == 0  # a tie: the smallest device, as pandas' mode()


def test_the_ops_table_path_imports_neither_pandas_nor_numpy():
    code = ("import sys, opscope.analysis.ops_table, opscope.table, opscope.kernels.catalog; "
            "assert 'pandas' not in sys.modules and 'numpy' not in sys.modules, sorted(sys.modules)")
    # events.py (the cost attribution's is_row_name) is ported separately: stub it to test only this chain
    stub = ("import sys, types; m = types.ModuleType('opscope.analysis.events'); "
            "m.is_row_name = lambda n: True; sys.modules['opscope.analysis.events'] = m; ")
    subprocess.run([sys.executable, "-c", stub + code], check=True)
