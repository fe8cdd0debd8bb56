"""torch.compile: inductor's kernels and the compiled regions are rows of their own, with honest coverage.

Checked against the raw trace events (an independent reading): on the real MI300X compile trace, on CPU
traces recorded here (tests/fixtures/compile/record.py) and through `opscope profile` of a compiled model.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from conftest import PEAKS, REPO, TRACES, run_cli, write_model
from opscope.analysis.trace_file import analyze_trace_file

COMPILE_MI300X = TRACES / "mi300x_torch-compile_triton.json.gz"
CPU_INFERENCE = REPO / "tests" / "fixtures" / "compile" / "cpu_compiled_inference.json.gz"
CPU_TRAIN_KERNELS = REPO / "tests" / "fixtures" / "compile" / "cpu_compiled_train_kernel_events.json.gz"
GRAPH_PREFIX = "## Call CompiledFxGraph "
REGION = "Torch-Compiled Region: 0/0"


def load_doc(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def spans(events: list[dict], pred) -> list[dict]:
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation") and pred(e)]


def inside(outer: dict, e: dict) -> bool:
    return (e is not outer and e["tid"] == outer["tid"] and outer["ts"] <= e["ts"]
            and e["ts"] + e["dur"] <= outer["ts"] + outer["dur"])


def exclusive_time(outer: dict, children: list[dict]) -> float:
    """outer's time minus the time of the given events that are directly inside it (not nested in one
    another)."""
    mine = [c for c in children if inside(outer, c)]
    top = [c for c in mine if not any(inside(o, c) for o in mine)]
    return outer["dur"] - sum(c["dur"] for c in top)


def row(ops, op: str):
    rows = ops[ops["op"] == op]
    assert len(rows) == 1, (op, len(rows))
    return rows.iloc[0]


@pytest.fixture(scope="module")
def mi300x(tmp_path_factory):
    return analyze_trace_file(COMPILE_MI300X, out=tmp_path_factory.mktemp("compile") / "run")


def test_triton_kernels_are_rows_named_after_the_kernel(mi300x):
    events = load_doc(COMPILE_MI300X)["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    graph = next(e["name"] for e in events if e.get("cat") == "user_annotation")
    assert graph.startswith(GRAPH_PREFIX)
    triton = [k for k in kernels if k["name"].startswith("triton_")]
    assert len(triton) == 4
    ops = mi300x.to_pandas()
    for k in triton:
        r = row(ops, k["name"])
        assert r["calls"] == 1 and r["time_us_total"] == pytest.approx(k["dur"])
        assert r["kernels"] == k["name"] and r["compiled_graph"] == graph
        assert r["bound"] == "unknown" and math.isnan(r["flops_per_call"]) and math.isnan(r["bytes_per_call"])
        assert "::" not in r["op"]
    # extern kernels inductor calls (aten::mm) are attributed to the same graph
    assert set(ops.loc[ops["op"] == "aten::mm", "compiled_graph"]) == {graph}


def test_compile_trace_attributes_all_kernel_time_and_coverage_is_honest(mi300x):
    events = load_doc(COMPILE_MI300X)["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    total = sum(k["dur"] for k in kernels)
    triton = sum(k["dur"] for k in kernels if k["name"].startswith("triton_"))
    ops, summary = mi300x.to_pandas(), mi300x.summary
    lost = ops.loc[ops["op"] == "(unattributed kernels)", "time_us_total"].sum()
    assert lost / total < 0.01
    assert lost == 0
    assert ops["time_us_total"].sum() == pytest.approx(total)
    # 6.7% of kernel time is in Triton kernels whose cost the trace does not record
    assert triton / total == pytest.approx(0.0666, abs=1e-3)
    assert summary["ops_covered_time_share"] == pytest.approx(1 - triton / total)
    assert summary["bound_time_share"]["unknown"] == pytest.approx(triton / total)
    for name in (REGION, next(e["name"] for e in events if e.get("cat") == "user_annotation")):
        r = row(ops, name)  # launched no kernel itself: a row with 0 GPU time
        assert r["time_us_total"] == 0 and r["bound"] == "unknown"


def test_inductor_cost_estimates_in_the_trace_are_used(tmp_path):
    # Inductor records its own estimates (kernel_num_gb, kernel_flop) with config.benchmark_kernel;
    # these are the real trace's kernels with such args added.
    doc = load_doc(COMPILE_MI300X)
    estimates = {"triton_poi_fused__unsafe_view_add_3": {"kernel_num_gb": 0.201326592},
                 "triton_poi_fused__unsafe_view_mul_silu_2": {"kernel_num_gb": 1.610612736, "kernel_flop": 0},
                 "triton_red_fused_add_mean_mul_pow_rsqrt_0": {"kernel_num_gb": 0.134221824,
                                                                "kernel_flop": 201326592}}
    for e in doc["traceEvents"]:
        if e.get("cat") == "cpu_op" and e["name"] in estimates:
            e["args"].update(estimates[e["name"]])
    path = tmp_path / "estimated.json"
    path.write_text(json.dumps(doc))
    ops = analyze_trace_file(path, out=tmp_path / "run").to_pandas()
    both = row(ops, "triton_red_fused_add_mean_mul_pow_rsqrt_0")
    assert both["flops_per_call"] == 201326592 and both["bytes_per_call"] == pytest.approx(134221824)
    assert both["family"] == "compiled" and both["ceiling"] == "float32" and both["bound"] != "unknown"
    assert both["achieved_gbps"] == pytest.approx(134221824 / (both["time_us_total"] * 1e-6) / 1e9)
    for name in ("triton_poi_fused__unsafe_view_add_3", "triton_poi_fused__unsafe_view_mul_silu_2"):
        r = row(ops, name)  # bytes only (inductor writes kernel_flop 0 when it has no count): not covered
        assert r["bytes_per_call"] == pytest.approx(estimates[name]["kernel_num_gb"] * 1e9)
        assert math.isnan(r["flops_per_call"]) and r["bound"] == "unknown"
    assert math.isnan(row(ops, "triton_red_fused__unsafe_view_add_mean_mul_pow_rsqrt_1")["bytes_per_call"])


def test_cpu_compiled_graph_time_is_a_row(tmp_path):
    # Default inductor on CPU: the C++ kernels have no events; their time is in the graph's range.
    events = load_doc(CPU_INFERENCE)["traceEvents"]
    graphs = spans(events, lambda e: e["name"].startswith(GRAPH_PREFIX))
    regions = spans(events, lambda e: e["name"] == REGION)
    aten = spans(events, lambda e: e["name"].startswith("aten::"))
    assert len(graphs) == len(regions) == 2
    run = analyze_trace_file(CPU_INFERENCE, out=tmp_path / "run", peak_bw=20, peak_flops=["100"])
    ops = run.to_pandas()
    g = row(ops, graphs[0]["name"])
    assert g["calls"] == 2 and g["compiled_graph"] == graphs[0]["name"]
    assert g["time_us_total"] == pytest.approx(sum(exclusive_time(x, aten) for x in graphs))
    r = row(ops, REGION)  # dynamo's frame around the graph: guards' bytecode, AOT wrappers
    assert r["time_us_total"] == pytest.approx(sum(exclusive_time(x, graphs) for x in regions))
    for x in (g, r):
        assert x["bound"] == "unknown" and math.isnan(x["flops_per_call"]) and x["note"]
    # every µs inside the compiled regions is in exactly one row, and only costed rows count as covered
    assert ops["time_us_total"].sum() == pytest.approx(sum(x["dur"] for x in regions))
    unknown = g["time_us_total"] + r["time_us_total"]
    assert run.summary["ops_covered_time_share"] == pytest.approx(1 - unknown / ops["time_us_total"].sum())
    assert run.summary["ops_covered_time_share"] < 1


def test_cpu_kernel_events_and_training_wrappers(tmp_path):
    # TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE=1: one event per C++ kernel; a training step adds
    # AOTAutograd's CompiledFunction / CompiledFunctionBackward around the forward and backward graphs.
    events = load_doc(CPU_TRAIN_KERNELS)["traceEvents"]
    graphs = spans(events, lambda e: e["name"].startswith(GRAPH_PREFIX))
    cpp = spans(events, lambda e: e["name"].startswith("graph_0_cpp_"))
    assert len(graphs) == 2 and len(cpp) == 5
    ops = analyze_trace_file(CPU_TRAIN_KERNELS, out=tmp_path / "run", peak_bw=20, peak_flops=["100"]).to_pandas()
    for k in cpp:
        r = row(ops, k["name"])
        graph = next(x["name"] for x in graphs if inside(x, k))
        assert r["time_us_total"] == pytest.approx(k["dur"]) and r["compiled_graph"] == graph
        assert r["bound"] == "unknown"
    fwd, bwd = sorted(graphs, key=lambda e: e["ts"])
    aten = spans(events, lambda e: e["name"].startswith("aten::"))
    for x in (fwd, bwd):  # the graph's own time excludes its kernels' events and its aten ops
        assert row(ops, x["name"])["time_us_total"] == pytest.approx(exclusive_time(x, aten + cpp))
    assert set(ops.loc[ops["op"] == "aten::mm", "compiled_graph"]) == {bwd["name"]}
    for name in ("CompiledFunction", "CompiledFunctionBackward", REGION):
        assert row(ops, name)["bound"] == "unknown"
    # AccumulateGrad runs outside the compiled graphs
    assert set(ops.loc[ops["op"] == "aten::add_", "compiled_graph"]) == {""}


@pytest.mark.slow
def test_profile_of_a_compiled_cpu_model_shows_its_compiled_region(tmp_path):
    model = write_model(tmp_path, """
        import torch
        import torch.nn.functional as F


        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = torch.nn.Linear(64, 64)

            def forward(self, x):
                return F.gelu(self.proj(x)) * x


        def get_model():
            return torch.compile(Model())


        def get_inputs():
            return [torch.randn(32, 64)]
    """)
    out = tmp_path / "run"
    proc = run_cli("profile", str(model), "--steps", "3", "--warmup", "1", "--out", str(out), *PEAKS, cwd=tmp_path,
                   timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "CompiledFxGraph" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    import pandas as pd

    ops = pd.read_csv(out / "ops.csv", keep_default_na=False, na_values=[""])
    graph = ops[ops["op"].str.startswith(GRAPH_PREFIX)]
    assert len(graph) == 1 and graph["calls"].iloc[0] == 3 and graph["bound"].iloc[0] == "unknown"
    assert graph["time_us_total"].iloc[0] > 0
    events = load_doc(out / "trace.json.gz")["traceEvents"]
    graphs = spans(events, lambda e: e["name"].startswith(GRAPH_PREFIX))
    # inside the graph: aten ops (extern kernels) and, with opscope's inductor settings, each C++ kernel
    # (graph_0_cpp_fused_...): rows of their own, so not the graph's time
    inner = spans(events, lambda e: e["name"].startswith("aten::") or "_cpp_fused_" in e["name"])
    assert any("_cpp_fused_" in e["name"] for e in inner)
    assert graph["time_us_total"].iloc[0] == pytest.approx(sum(exclusive_time(x, inner) for x in graphs), rel=1e-6)
    covered = ops["flops_per_call"].notna() & ops["bytes_per_call"].notna()
    assert not covered[graph.index[0]] and not covered[ops["op"] == REGION].any()
    total = ops["time_us_total"].sum()
    assert summary["ops_covered_time_share"] == pytest.approx(ops.loc[covered, "time_us_total"].sum() / total)
    assert summary["ops_covered_time_share"] < 1


def test_kernels_launched_by_the_graph_itself_are_the_graph_rows(tmp_path):
    # Traces without inductor's per-kernel launch events (older torch): the launches sit directly in
    # the `## Call CompiledFxGraph ##` range, whose row then carries those kernels.
    doc = load_doc(COMPILE_MI300X)
    doc["traceEvents"] = [e for e in doc["traceEvents"]
                          if not (e.get("cat") == "cpu_op" and e["name"].startswith("triton_"))]
    path = tmp_path / "no_kernel_events.json"
    path.write_text(json.dumps(doc))
    ops = analyze_trace_file(path, out=tmp_path / "run").to_pandas()
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e["name"].startswith("triton_")]
    graph = row(ops, next(e["name"] for e in doc["traceEvents"] if e.get("cat") == "user_annotation"))
    assert graph["time_us_total"] == pytest.approx(sum(k["dur"] for k in kernels))
    assert set(graph["kernels"].split(";")) == {k["name"] for k in kernels}
    assert graph["bound"] == "unknown" and "(unattributed kernels)" not in set(ops["op"])
