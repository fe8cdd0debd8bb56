"""An op called directly inside an op with the same name and inputs is one logical call (F.interpolate's
aten::upsample_nearest1d.vec dispatching to aten::upsample_nearest1d): one row call with the pair's
time and the working call's cost, not two calls at the outer's zero cost."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest

from conftest import PEAKS, run_cli, write_model
from opscope.analysis.trace_file import analyze_trace_file

STEPS = 5
# x [4, 256, 64] float32 resized to 256: read 4*256*64*4 B, write 4*256*256*4 B
BYTES = 4 * 256 * 64 * 4 + 4 * 256 * 256 * 4
assert BYTES == 1_310_720
OUT_ELEMENTS = 4 * 256 * 256
MODEL = """
    import torch
    import torch.nn.functional as F


    class Model(torch.nn.Module):
        def forward(self, x):
            return F.interpolate(x, size=256, mode="nearest"), F.interpolate(x, size=256, mode="linear")


    def get_inputs():
        return [torch.randn(4, 256, 64)]
"""


def read_ops(run: Path) -> pd.DataFrame:
    return pd.read_csv(run / "ops.csv", keep_default_na=False, na_values=[""])


def contains(outer: dict, e: dict) -> bool:
    return (e is not outer and e["tid"] == outer["tid"] and outer["ts"] <= e["ts"]
            and e["ts"] + e["dur"] <= outer["ts"] + outer["dur"])


def pair_times(trace: Path, name: str) -> list[tuple[float, float]]:
    """Per outer call of `name` in the raw trace: (its duration, the pair's self time = its duration minus
    the other ops directly inside the pair)."""
    ops = [e for e in json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
           if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    calls = [e for e in ops if e["name"] == name]
    outers = [e for e in calls if not any(contains(o, e) for o in calls)]
    out = []
    for o in outers:
        inner = [e for e in calls if contains(o, e)]
        assert len(inner) == 1 and inner[0]["args"]["Input Dims"] == o["args"]["Input Dims"]
        others = [e for e in ops if contains(o, e) and e["name"] != name]
        top = [e for e in others if not any(contains(x, e) for x in others)]
        out.append((o["dur"], o["dur"] - sum(e["dur"] for e in top)))
    return out


def check_upsample_rows(ops: pd.DataFrame, trace: Path) -> None:
    for name, flops in (("aten::upsample_nearest1d", 0), ("aten::upsample_linear1d", 4 * OUT_ELEMENTS)):
        rows = ops[ops["op"] == name]
        assert len(rows) == 1, name
        r = rows.iloc[0]
        assert r["calls"] == STEPS
        assert r["bytes_per_call"] == BYTES and r["flops_per_call"] == flops
        assert r["bound"] != "overhead"  # not a zero-cost composite
        pairs = pair_times(trace, name)
        assert len(pairs) == STEPS
        assert r["time_us_total"] == pytest.approx(sum(p for _, p in pairs), rel=1e-9, abs=1e-6)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("nested")
    model = write_model(tmp, MODEL)
    out = tmp / "run"
    proc = run_cli("profile", str(model), "--steps", str(STEPS), "--out", str(out), *PEAKS, cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    return out


def test_profile_counts_each_interpolate_once_with_its_cost(profiled):
    ops = read_ops(profiled)
    check_upsample_rows(ops, profiled / "trace.json.gz")
    # the pair and the ops inside it add up to the outer calls' time
    summary = json.loads((profiled / "summary.json").read_text())
    assert summary["total_time_us"] == pytest.approx(ops["time_us_total"].sum())


def test_analyze_of_the_same_trace_agrees(profiled, tmp_path):
    out = tmp_path / "run"
    proc = run_cli("analyze", str(profiled / "trace.json.gz"), "--out", str(out), *PEAKS)
    assert proc.returncode == 0, proc.stderr
    check_upsample_rows(read_ops(out), profiled / "trace.json.gz")


def test_the_whole_pair_time_is_in_the_rows(profiled):
    """Every µs of the outer calls is in exactly one row: the folded pair's or an op's inside it."""
    run = analyze_trace_file(profiled / "trace.json.gz", out=profiled.parent / "again", peak_bw=20,
                             peak_flops=["100"])
    ev = run.to_pandas("events")
    for name in ("aten::upsample_nearest1d", "aten::upsample_linear1d"):
        outer = ev[(ev["name"] == name) & ev["is_row"]]
        assert len(outer) == STEPS and int(ev.loc[ev["name"] == name, "folded"].sum()) == STEPS
        for _, o in outer.iterrows():
            inside = ev[(ev["thread"] == o["thread"]) & (ev["ts"] >= o["ts"]) & (ev["end"] <= o["end"])]
            assert inside["self_us"].sum() == pytest.approx(o["dur"])


def _gpu_trace(tmp_path: Path) -> Path:
    """A minimal CUDA trace: a nested upsample whose inner call launches the kernel, and a nested sum
    whose inputs differ (a real composite: the outer stays a 0-cost row)."""
    def op(name, ts, dur, dims, ext, concrete=None):
        n = len(dims)
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
                "args": {"External id": ext, "Input Dims": dims, "Input type": ["float"] + [""] * (n - 1),
                         "Input Strides": [[16384, 64, 1]] + [[]] * (n - 1),
                         "Concrete Inputs": concrete or [""] * n}}

    up = [[4, 256, 64], [], []]
    events = [
        op("aten::upsample_nearest1d", 100, 50, up, 1, ["", "[256]", ""]),
        op("aten::upsample_nearest1d", 110, 30, up, 2, ["", "[256]", ""]),
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 120, "dur": 5,
         "args": {"correlation": 7, "External id": 2}},
        {"ph": "X", "cat": "kernel", "name": "upsample_nearest1d_out_frame", "pid": 0, "tid": 7, "ts": 130,
         "dur": 40, "args": {"correlation": 7, "External id": 2, "stream": 7, "device": 0}},
        op("aten::sum", 200, 40, [[4, 256, 64], []], 3),
        op("aten::sum", 205, 30, [[4, 256, 64], [], [], []], 4),
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 210, "dur": 5,
         "args": {"correlation": 8, "External id": 4}},
        {"ph": "X", "cat": "kernel", "name": "reduce_kernel", "pid": 0, "tid": 7, "ts": 220, "dur": 20,
         "args": {"correlation": 8, "External id": 4, "stream": 7, "device": 0}},
    ]
    doc = {"traceEvents": events, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}]}
    path = tmp_path / "nested.json"
    path.write_text(json.dumps(doc))
    return path


def test_gpu_kernels_of_the_inner_call_belong_to_the_one_row(tmp_path):
    ops = analyze_trace_file(_gpu_trace(tmp_path), out=tmp_path / "run").to_pandas()
    up = ops[ops["op"] == "aten::upsample_nearest1d"]
    assert len(up) == 1
    r = up.iloc[0]
    assert r["calls"] == 1 and r["time_us_total"] == 40 and r["kernels"] == "upsample_nearest1d_out_frame"
    assert r["bytes_per_call"] == BYTES and r["cpu_time_us_total"] == 50
    sums = ops[ops["op"] == "aten::sum"].set_index("input_dims")
    outer, inner = sums.loc["[[4, 256, 64], []]"], sums.loc["[[4, 256, 64], [], [], []]"]
    assert outer["calls"] == inner["calls"] == 1
    assert outer["flops_per_call"] == 0 and outer["time_us_total"] == 0 and outer["cpu_time_us_total"] == 10
    assert inner["flops_per_call"] > 0 and inner["time_us_total"] == 20
