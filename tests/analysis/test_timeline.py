"""The step timeline (opscope.analysis.timeline, timeline.json): lanes and segments of a hand-built trace
checked by hand, findings' ops marked on a real trace, and the bounds on a synthetic trace far bigger than
any step: lanes, segments, names and the file's size, with each lane's busy time kept."""

from __future__ import annotations

import json
from typing import Any

import pytest

from conftest import TRACES
from opscope.analysis.timeline import (
    LANE_SEGMENTS,
    MAX_LANES,
    NAME_CHARS,
    TOTAL_SEGMENTS,
    bins,
    build_timeline,
)
from opscope.analysis.trace_file import analyze_trace_file
from opscope.run import schema
from opscope.run.read import read_run
from opscope.trace.reader import TraceData

KERNEL = "void gemm_kernel<</script><img src=x onerror=alert(1)>>()"  # a hostile kernel name


def _trace(path) -> None:
    """One step (10..210 µs) on thread 1: aten::linear (20..60) around aten::addmm (22..58, its kernel on
    stream 7 at 30..50), aten::add (70..74, its kernel at 80..84); thread 2 runs aten::mul (100..110)."""
    events: list[dict[str, Any]] = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 10, "dur": 200},
    ]
    ops = [("aten::linear", 1, 20, 60, None), ("aten::addmm", 1, 22, 58, (30, 50, KERNEL)),
           ("aten::add", 1, 70, 74, (80, 84, "elementwise_add")), ("aten::mul", 2, 100, 110, None)]
    for i, (name, tid, a, b, kernel) in enumerate(ops):
        events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": a, "dur": b - a,
                       "args": {"External id": i + 1, "Input Dims": [[8, 8], [8, 8]],
                                "Input type": ["float", "float"]}})
        if kernel:
            ks, ke, kname = kernel
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": tid,
                           "ts": a + 1, "dur": 0.5, "args": {"correlation": 50 + i}})
            events.append({"ph": "X", "cat": "kernel", "name": kname, "pid": 0, "tid": 7, "ts": ks, "dur": ke - ks,
                           "args": {"correlation": 50 + i, "stream": 7, "device": 0}})
    path.write_text(json.dumps({"deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
                                "traceEvents": events}))


def test_hand_checked(tmp_path):
    _trace(tmp_path / "t.json")
    analyze_trace_file(tmp_path / "t.json", out=tmp_path / "run")
    run = read_run(tmp_path / "run")
    tl = run.timeline
    assert tl is not None and tl["origin"] == "first step" and tl["steps"] == [[0.0, 200.0]]
    lanes = {lane["id"]: lane for lane in tl["lanes"]}
    assert list(lanes) == ["cpu:1", "cpu:2", "gpu:0:7"]
    ops = run.ops["op"]

    def segments(lane_id: str) -> list[tuple[str, float, float, str]]:
        lane = lanes[lane_id]
        return [(tl["names"][n], t, d, ops[r] if r >= 0 else "") for n, t, d, r in
                zip(lane["name"], lane["ts"], lane["dur"], lane["row"], strict=True)]

    # outermost ops only (aten::addmm is inside aten::linear), µs from the step's start, linked to their rows
    assert segments("cpu:1") == [("aten::linear", 10.0, 40.0, "aten::linear"), ("aten::add", 60.0, 4.0, "aten::add")]
    assert segments("cpu:2") == [("aten::mul", 90.0, 10.0, "aten::mul")]
    # kernels, linked to the op that launched them
    assert segments("gpu:0:7") == [(KERNEL, 20.0, 20.0, "aten::addmm"), ("elementwise_add", 70.0, 4.0, "aten::add")]
    assert lanes["cpu:1"]["busy_us"] == 44.0 and lanes["gpu:0:7"]["events"] == 2
    assert all(n == 1 for lane in lanes.values() for n in lane["n"])  # nothing below the bins here
    schema.check("timeline.json", tl)


def test_findings_ops_are_marked():
    run = analyze_trace_file(TRACES / "h100_bert-small_bf16.json.gz")
    tl = run.timeline
    assert tl is not None and len(tl["findings"]) == len(run.findings)
    marked = 0
    for lane in tl["lanes"]:
        for f, row, n in zip(lane["finding"], lane["row"], lane["n"], strict=True):
            if f < 0 or n > 1:
                continue
            marked += 1
            finding = run.findings[f]
            if lane["kind"] == "gpu":  # a kernel of the finding's op
                assert run.ops["op"][row] == finding["op"]
    assert marked > 0


def _huge(threads: int, ops: int, streams: int, kernels: int) -> tuple[TraceData, dict[str, list[Any]]]:
    """A trace table of `threads` × `ops` ops of 0.5 µs every 1 µs and `streams` × `kernels` kernels, every
    name different and 300 characters long."""
    ev: dict[str, list[Any]] = {c: [] for c in ("name", "pid", "tid", "ts", "dur", "end", "is_row", "row_parent",
                                                 "row_anc", "input_dims", "input_dtypes", "input_strides",
                                                 "concrete_inputs", "source_location", "module")}
    for t in range(threads):
        for i in range(ops):
            ts = 100.0 + i * 1.0 + (t % 7) * 5000.0  # some threads start later: lanes of other spans
            for c, v in (("name", f"aten::op_{t}_{i}_" + "x" * 280), ("pid", 1), ("tid", 1000 + t), ("ts", ts),
                         ("dur", 0.5), ("end", ts + 0.5), ("is_row", True), ("row_parent", -1)):
                ev[c].append(v)
    n = len(ev["name"])
    ev["row_anc"] = list(range(n))
    for c in ("input_dims", "input_dtypes", "input_strides", "concrete_inputs", "source_location", "module"):
        ev[c] = [""] * n
    k: dict[str, list[Any]] = {c: [] for c in ("name", "ts", "dur", "stream", "device", "op")}
    for s in range(streams):
        for i in range(kernels):
            for c, v in (("name", f"kernel_{s}_{i}_" + "y" * 280), ("ts", 100.0 + i * 0.8), ("dur", 0.3),
                         ("stream", s), ("device", 0), ("op", i % n)):
                k[c].append(v)
    trace = TraceData(path="huge", ops={}, kernels=k, launches={}, python={},
                      steps={"name": ["ProfilerStep#1"], "ts": [100.0], "dur": [60_000.0], "pid": [1], "tid": [1]})
    return trace, ev


def test_bounded_on_a_huge_trace():
    threads, ops, streams, kernels = 40, 5_000, 8, 40_000  # 520,000 segments
    trace, ev = _huge(threads, ops, streams, kernels)
    table_ops = {"op": ["aten::op_0_0_" + "x" * 280], "input_dims": [""], "input_dtypes": [""], "input_strides": [""],
                 "concrete_inputs": [""], "source_location": [""], "module": [""]}
    findings = [{"rule": "r", "severity": "low", "message": "", "suggestion": "", "op": table_ops["op"][0]}]
    tl = build_timeline(trace, ev, table_ops, findings)
    assert tl is not None
    doc = json.dumps(tl, separators=(",", ":"))  # as opscope.run.write writes it
    assert len(doc) < 2_000_000, len(doc)
    schema.check("timeline.json", json.loads(doc))
    lanes = tl["lanes"]
    assert len(lanes) == MAX_LANES and tl["lanes_dropped"] == threads + streams - MAX_LANES
    assert sum(len(lane["ts"]) for lane in lanes) <= TOTAL_SEGMENTS
    assert all(len(lane["ts"]) <= LANE_SEGMENTS for lane in lanes)
    assert all(len(name) <= NAME_CHARS for name in tl["names"])
    for lane in lanes:
        # Busy time kept: the merged segments' busy times add up to the lane's, to the rounding of each to a
        # ns (0.0005 µs at most per segment); they are drawn spanning their members, never shorter.
        assert sum(lane["busy"]) == pytest.approx(lane["busy_us"], abs=0.0005 * len(lane["busy"]))
        assert lane["busy_us"] == pytest.approx(lane["events"] * (0.5 if lane["kind"] == "cpu" else 0.3))
        assert sum(lane["dur"]) >= sum(lane["busy"]) - 0.0005 * len(lane["busy"])
        assert sum(lane["n"]) == lane["events"]
        assert all(b > a for a, b in zip(lane["ts"], lane["ts"][1:], strict=False))  # in time order
    gpu = [lane for lane in lanes if lane["kind"] == "gpu"]
    assert len(gpu) == streams  # the busiest lanes are kept: the streams' 12,000 µs beat 2,500 µs of ops


def test_bins():
    # long segments alone; short ones grouped while they start within one bin of the group's first
    start = [0.0, 0.2, 0.5, 1.1, 3.0, 6.0, 6.1]
    end = [0.1, 0.3, 0.6, 1.2, 5.0, 6.05, 6.15]
    assert bins(start, end, 1.0) == [(0, 3), (3, 4), (4, 5), (5, 7)]
    assert bins(start, end, 0.01) == [(i, i + 1) for i in range(7)]


def test_cuda_graph_kernels_link_to_their_kernel_rows():
    """The SGLang CUDA-graph decode trace: a graph replay's kernels have no op row of their own; each links
    to its kernel row (named by the kernel), so every GPU segment names an ops.csv row."""
    run = analyze_trace_file(TRACES / "sglang_qwen3-8b_decode_cudagraph.json.gz")
    tl = run.timeline
    assert tl is not None
    gpu = [lane for lane in tl["lanes"] if lane["kind"] == "gpu"]
    assert gpu and all(r >= 0 for lane in gpu for r in lane["row"])
    graph = [(tl["names"][n], r) for lane in gpu for n, r, c in zip(lane["name"], lane["row"], lane["n"], strict=True)
             if c == 1 and run.ops["note"][r]]  # kernel rows carry a note
    assert len(graph) > 100
    assert all(run.ops["op"][r] == name or name.endswith("…") and run.ops["op"][r].startswith(name[:-1])
               for name, r in graph)  # names over NAME_CHARS are cut
