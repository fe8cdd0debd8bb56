"""`opscope analyze` on real GPU traces (H100, MI300X) and on CPU traces recorded here."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import pytest

from conftest import TRACES, assert_clean_error, run_cli
from opscope.analysis.trace_file import analyze_trace_file
from opscope.machine.peaks import match_gpu

BERT_H100 = TRACES / "h100_bert-small_bf16.json.gz"
BERT_MI300X = TRACES / "mi300x_bert-small_bf16.json.gz"
VIT_H100 = TRACES / "h100_vit-image-classifier_bf16.json.gz"


def load_events(path: Path) -> list[dict]:
    return json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return analyze_trace_file(BERT_H100, out=tmp_path_factory.mktemp("bert") / "run")


def test_rows_carry_kernel_time_not_cpu_time(bert):
    ops = bert.to_pandas()
    assert {"cpu_time_us_total", "kernels"} <= set(ops.columns)
    addmm = ops[ops["op"] == "aten::addmm"]
    assert (addmm["time_us_total"] < addmm["cpu_time_us_total"]).any()  # GPU time, not CPU time
    views = ops[ops["op"] == "aten::view"]
    assert (views["time_us_total"] == 0).all() and (views["cpu_time_us_total"] > 0).all()


def test_each_op_time_is_the_sum_of_its_kernels(bert):
    # Independent link: kernels share the launching op's "External id".
    events = load_events(BERT_H100)
    by_ext = {e["args"]["External id"]: e for e in events if e.get("cat") == "cpu_op"}
    expected: dict[tuple, float] = defaultdict(float)
    for k in events:
        if k.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            op = by_ext[k["args"]["External id"]]
            expected[(op["name"], json.dumps(op["args"]["Input Dims"]))] += k["dur"]
    got = bert.to_pandas().groupby(["op", "input_dims"])["time_us_total"].sum()
    for key, us in expected.items():
        assert got[key] == pytest.approx(us, abs=1e-6), key
    total_kernels = sum(k["dur"] for k in events if k.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    assert bert.to_pandas()["time_us_total"].sum() == pytest.approx(total_kernels)
    assert "(unattributed kernels)" not in set(bert.to_pandas()["op"])


def test_gemm_flops_and_bf16_tensor_core_ceiling(bert):
    spec = match_gpu("NVIDIA H100 80GB HBM3")
    addmm = bert.to_pandas()[bert.to_pandas()["op"] == "aten::addmm"]
    assert not addmm.empty
    for row in addmm.to_dict("records"):
        bias, a, b = json.loads(row["input_dims"])[:3]
        m, k = a
        n = b[1]
        assert row["flops_per_call"] == 2 * m * n * k
        achieved = row["flops_per_call"] / (row["time_us_total"] / row["calls"] * 1e-6) / 1e9
        assert row["achieved_gflops"] == pytest.approx(achieved)
        assert row["pct_peak_flops"] == pytest.approx(100 * achieved / spec.flops_gflops["bfloat16"])
        assert row["ceiling"] == "bfloat16"


def test_elementwise_ops_use_the_vector_ceiling(bert):
    spec = match_gpu("NVIDIA H100 80GB HBM3")
    for op in ("aten::add", "aten::gelu", "aten::native_layer_norm"):
        rows = bert.to_pandas()[(bert.to_pandas()["op"] == op) & (bert.to_pandas()["time_us_total"] > 0)]
        assert not rows.empty, op
        for row in rows.to_dict("records"):
            assert row["ceiling"] == "float32"
            assert row["pct_peak_flops"] == pytest.approx(100 * row["achieved_gflops"] / spec.flops_gflops["float32"])
            assert row["pct_peak_bandwidth"] == pytest.approx(100 * row["achieved_gbps"] / spec.memory_bandwidth_gbps)


def test_device_busy_share_and_step(bert):
    s = bert.summary
    events = load_events(BERT_H100)
    step = next(e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep"))
    assert s["steps"] == 1
    assert s["step_time_us"] == pytest.approx(step["dur"])
    kernels = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    busy, end = 0.0, -1.0
    for a, b in kernels:  # union of intervals, independently
        if a > end:
            busy += b - a
            end = b
        elif b > end:
            busy += b - end
            end = b
    assert s["device_busy_share"] == pytest.approx(busy / step["dur"])
    assert s["device_busy_share"] < 0.2  # the GPU idles most of this step


def test_meta_for_traces(bert):
    m = bert.meta
    assert m["source"] == "trace" and m["target"].endswith("h100_bert-small_bf16.json.gz")
    assert m["device"] == {"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "name_source": "deviceProperties"}
    assert m["dtype"] == "bfloat16" and m["mode"] == "inference" and m["steps"] == 1
    assert m["torch_version"] is None  # not recorded in these traces
    assert m["peaks"]["origin"] == {"memory_bandwidth": "spec-table", "flops": "spec-table"}


def test_source_locations_are_function_level_library_frames(bert):
    locs = set(bert.to_pandas().loc[bert.to_pandas()["op"] == "aten::addmm", "source_location"])
    assert all(loc.startswith("transformers/models/bert/modeling_bert.py:") for loc in locs)


def test_mi300x_is_an_amd_gpu_with_its_own_ceilings(tmp_path):
    run = analyze_trace_file(BERT_MI300X, out=tmp_path / "run")
    assert run.meta["device"]["type"] == "rocm"
    assert "MI300X" in run.meta["device"]["name"]
    spec = match_gpu(run.meta["device"]["name"])
    assert spec is not None and spec.vendor == "amd"
    assert run.meta["peaks"]["memory_bandwidth_gbps"] == spec.memory_bandwidth_gbps
    assert run.meta["peaks"]["flops_gflops"]["bfloat16"] == spec.flops_gflops["bfloat16"]
    assert run.to_pandas()["time_us_total"].sum() > 0 and "(unattributed kernels)" not in set(run.to_pandas()["op"])


def test_vit_trace_and_cli(tmp_path):
    proc = run_cli("analyze", str(VIT_H100), "--out", str(tmp_path / "vit"), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["device_busy_share"] > 0
    assert sorted(p.name for p in (tmp_path / "vit").iterdir()) == sorted(
        ["meta.json", "ops.csv", "findings.json", "summary.json", "trace.json.gz", "modules.csv", "timeline.json", "whatif.json"])
    assert (tmp_path / "vit" / "trace.json.gz").read_bytes() == VIT_H100.read_bytes()


def test_unknown_gpu_warns_and_overrides_apply(tmp_path):
    doc = json.loads(gzip.decompress(BERT_H100.read_bytes()))
    doc["deviceProperties"][0]["name"] = "Acme Tensor Thing 9000"
    path = tmp_path / "acme.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    proc = run_cli("analyze", str(path), "--out", str(tmp_path / "a"), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Acme Tensor Thing 9000" in proc.stderr and "--peak-bw" in proc.stderr
    proc = run_cli("analyze", str(path), "--out", str(tmp_path / "b"), "--peak-bw", "1000", "--peak-flops",
                   "bfloat16=500000", "--peak-flops", "float32=50000", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((tmp_path / "b" / "meta.json").read_text())
    assert meta["peaks"]["memory_bandwidth_gbps"] == 1000
    assert meta["peaks"]["flops_gflops"]["bfloat16"] == 500000
    assert meta["peaks"]["origin"] == {"memory_bandwidth": "user", "flops": "user"}


def test_unattributed_kernels_get_their_own_row(tmp_path):
    doc = json.loads(gzip.decompress(BERT_H100.read_bytes()))
    # drop the launches and External ids of the GELU kernels: nothing links them to an op any more
    gelu = {e["args"]["correlation"] for e in doc["traceEvents"] if e.get("cat") == "kernel" and "Gelu" in e["name"]}
    events = []
    for e in doc["traceEvents"]:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("args", {}).get("correlation") in gelu:
            continue
        if e.get("cat") == "kernel" and e["args"]["correlation"] in gelu:
            e["args"].pop("External id", None)
        events.append(e)
    doc["traceEvents"] = events
    path = tmp_path / "lost.json"
    path.write_text(json.dumps(doc))
    run = analyze_trace_file(path, out=tmp_path / "run")
    lost = run.to_pandas()[run.to_pandas()["op"] == "(unattributed kernels)"]
    assert len(lost) == 1 and int(lost["calls"].iloc[0]) == len(gelu)
    assert abs(run.to_pandas()["time_share"].sum() - 1) < 1e-9
    assert (tmp_path / "run" / "trace.json.gz").stat().st_size > 0


def test_cpu_trace_recorded_here(tmp_path):
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU())
    x = torch.randn(32, 64)
    with torch.profiler.profile(record_shapes=True, with_stack=True) as prof:
        for i in range(2):
            with torch.profiler.record_function(f"ProfilerStep#{i}"):
                model(x)
    path = tmp_path / "cpu_trace.json"
    prof.export_chrome_trace(str(path))
    run = analyze_trace_file(path, out=tmp_path / "run", peak_bw=20, peak_flops=["100"])
    assert run.meta["device"]["type"] == "cpu" and run.summary["steps"] == 2
    assert "kernels" not in run.to_pandas().columns
    addmm = run.to_pandas()[run.to_pandas()["op"] == "aten::addmm"]
    assert addmm["flops_per_call"].iloc[0] == 2 * 32 * 64 * 64
    # function-level: the trace names this test function's frame (by the line it was at when the
    # profiler started, for frames already running then)
    loc = addmm["source_location"].iloc[0]
    first = test_cpu_trace_recorded_here.__code__.co_firstlineno
    assert loc.startswith("tests/analysis/test_analyze.py:") or "test_analyze.py:" in loc
    assert first <= int(loc.rsplit(":", 1)[1]) <= first + 10


def test_trace_without_python_events(tmp_path):
    doc = json.loads(gzip.decompress(BERT_H100.read_bytes()))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "python_function"]
    doc["distributedInfo"] = {"backend": "nccl", "rank": 0, "world_size": 1}
    path = tmp_path / "nopy.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    run = analyze_trace_file(path, out=tmp_path / "run")
    assert (run.to_pandas()["source_location"] == "").all()
    assert run.to_pandas()["time_us_total"].sum() > 0


def test_call_stack_args_give_locations(tmp_path):
    import torch

    model = torch.nn.Linear(16, 16)
    x = torch.randn(4, 16)
    cfg = torch._C._profiler._ExperimentalConfig(verbose=True)
    with torch.profiler.profile(record_shapes=True, with_stack=True, experimental_config=cfg) as prof:
        model(x)
    path = tmp_path / "stacks.json"
    prof.export_chrome_trace(str(path))
    doc = json.loads(path.read_text())
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "python_function"]
    assert any("Call stack" in e.get("args", {}) for e in doc["traceEvents"])
    path.write_text(json.dumps(doc))
    run = analyze_trace_file(path, out=tmp_path / "run", peak_bw=20, peak_flops=["100"])
    loc = run.to_pandas().loc[run.to_pandas()["op"] == "aten::addmm", "source_location"].iloc[0]
    assert "test_analyze.py:" in loc


def test_trace_without_op_rows_is_refused_in_one_line(tmp_path):
    """CPU events that are all labels (no `ns::op`) and no kernels: nothing for ops.csv, so no run."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "my_label", "pid": 1, "tid": 1, "ts": 10.0 * i, "dur": 5.0,
               "args": {}} for i in range(5)]
    path = tmp_path / "labels.json"
    path.write_text(json.dumps({"traceEvents": events}))
    out = tmp_path / "run"
    proc = run_cli("analyze", str(path), "--out", str(out), "--peak-bw", "20", "--peak-flops", "100")
    assert_clean_error(proc, "has no operator rows", "'my_label'", "registered op")
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["labels.json"]


def test_kernels_launched_before_the_trace_get_their_own_row(tmp_path):
    """The shared H100 trace as if its first 10 kernels had been launched before the profiler started (the
    runtime calls up to their launches and their External ids gone, the first one run before the step): a
    row of their own with a note, counting only their time inside the step."""
    from opscope.run.schema import BACKLOG, BACKLOG_NOTE, UNATTRIBUTED

    doc = json.loads(gzip.decompress(BERT_H100.read_bytes()))
    device = ("kernel", "gpu_memcpy", "gpu_memset")
    kernels = sorted((e for e in doc["traceEvents"] if e.get("cat") in device), key=lambda e: e["args"]["correlation"])
    early = {e["args"]["correlation"] for e in kernels[:10]}
    step = next(e for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep#") and e.get("cat") == "user_annotation")
    events = []
    for e in doc["traceEvents"]:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("args", {}).get("correlation", 1e18) <= max(early):
            continue  # every runtime call up to the last early launch happened before the trace
        if e.get("cat") in device and e["args"]["correlation"] in early:
            e["args"].pop("External id", None)
            if e is kernels[0]:
                e["ts"] = step["ts"] - e["dur"] - 100.0  # ran before the step began
        events.append(e)
    doc["traceEvents"] = events
    path = tmp_path / "behind.json"
    path.write_text(json.dumps(doc))
    run = analyze_trace_file(path, out=tmp_path / "run")
    ops = run.ops
    rows = [i for i, op in enumerate(ops["op"]) if op == BACKLOG]
    assert len(rows) == 1 and UNATTRIBUTED not in ops["op"]
    row = rows[0]
    assert ops["calls"][row] == 10 and ops["note"][row] == BACKLOG_NOTE
    assert ops["time_us_total"][row] == pytest.approx(sum(e["dur"] for e in kernels[1:10]))
    s = run.summary
    assert s["backlog_kernels"]["kernels"] == 10 and s["unattributed_time_share"] == 0.0
    assert s["backlog_kernels"]["kernel_time_us"] == pytest.approx(sum(e["dur"] for e in kernels[:10]))
    assert all(r["busy_us"] <= step["dur"] for r in s["streams"]) and 0 < s["device_busy_share"] <= 1
    assert sum(ops["time_share"]) == pytest.approx(1.0)


def gelu_then_softmax(x, w, mask):  # noqa: ANN001, ANN201
    """A hand-written tanh GELU (the cube as h * h * h, no pow) and a scaled masked softmax in one function:
    a plain torch.profiler trace gives all their ops this function's one line."""
    import torch

    h = x @ w
    g = 0.5 * h * (1.0 + torch.tanh(0.7978845608 * (h + 0.044715 * h * h * h)))
    p = torch.softmax((g @ g.transpose(-1, -2)) * 0.125 + mask, dim=-1)
    return p @ g


@pytest.fixture(scope="module")
def one_line_run(tmp_path_factory):
    import torch

    torch.manual_seed(0)
    x, w, mask = torch.randn(4, 64, 128), torch.randn(128, 128) / 12, torch.zeros(64, 64)  # GELU [4, 64, 128]
    with torch.profiler.profile(record_shapes=True, with_stack=True) as prof:
        for i in range(2):
            with torch.profiler.record_function(f"ProfilerStep#{i}"):
                gelu_then_softmax(x, w, mask)
    folder = tmp_path_factory.mktemp("one-line")
    prof.export_chrome_trace(str(folder / "trace.json"))
    return analyze_trace_file(folder / "trace.json", out=folder / "run", peak_bw=20, peak_flops=["100"])


def test_swap_candidates_match_by_op_and_shape_not_by_line_alone(one_line_run):
    ops = one_line_run.to_pandas()
    assert ops.loc[ops["op"] == "aten::tanh", "source_location"].nunique() == 1  # function-level: one line
    line = ops.loc[ops["op"] == "aten::tanh", "source_location"].iloc[0]
    assert set(ops.loc[ops["op"].isin(["aten::mul", "aten::add", "aten::_softmax"]), "source_location"]) == {line}
    found = {c["kernel"]: c["rows"] for c in one_line_run.summary["swap_candidates"]}
    softmax_rows = ops.iloc[found["softmax"]]
    # the softmax's own ops, over its [4, 64, 64] scores: never the GELU's mul and add over [4, 64, 128]
    assert set(softmax_rows["op"]) == {"aten::mul", "aten::add", "aten::softmax", "aten::_softmax"}
    assert all(dims.startswith("[[4, 64, 64]") for dims in softmax_rows["input_dims"])
    gelu_adds = [i for i in found["broadcast_add"] if ops["input_dims"].iloc[i].startswith("[[4, 64, 128]")]
    assert gelu_adds and not set(gelu_adds) & set(found["softmax"])  # add -> broadcast_add only


def test_hand_written_tanh_gelu_with_a_cube_of_products_is_named(one_line_run):
    fusion = [f for f in one_line_run.findings if f["rule"] == "fusion" and "tanh" in f["message"]]
    assert len(fusion) == 1, one_line_run.findings
    assert fusion[0]["message"].startswith("hand-written GELU (tanh): ")
    assert "torch.nn.functional.gelu(x, approximate='tanh')" in fusion[0]["suggestion"]
