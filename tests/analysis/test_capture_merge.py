"""`opscope analyze REPLAY --capture CAPTURE` on replay/capture pairs built from the real eager traces.

The capture trace is the eager trace as a graph capture records it: the same ops, shapes, Python frames
and launch calls, between cudaStreamBeginCapture and cudaStreamEndCapture, and no kernel (nothing runs
during capture). The replay trace is what a graph replay records: the same kernels, all correlated with
one cudaGraphLaunch inside a `step[DECODE bs=1]` range, and no op. Merged, every replayed kernel must get
back its op and shapes, and the per-op totals must be the eager trace's."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from conftest import TRACES, run_cli
from opscope.analysis.ops_table import KEY
from opscope.analysis.trace_file import analyze_trace_file
from opscope.run.schema import GRAPH_KERNEL_NOTE, UNATTRIBUTED

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
GRAPH_CORR = 9_999_999


def _doc(name: str) -> dict:
    return json.loads(gzip.decompress((TRACES / f"{name}.json.gz").read_bytes()))


def _step(events: list[dict]) -> dict:
    return next(e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))


def build_pair(name: str, folder: Path, runtime: str = "cuda", name_launches: bool = False,
               drop_kernel_names: bool = False) -> tuple[Path, Path, list[dict]]:
    """(replay, capture, kernels) from the shared eager trace `name`."""
    doc = _doc(name)
    events = doc["traceEvents"]
    step = _step(events)
    kernels = [e for e in events if e.get("cat") in DEVICE_CATS]
    names_by_corr = {k["args"]["correlation"]: k["name"] for k in kernels}

    capture_events = []
    for e in events:
        if e.get("cat") in DEVICE_CATS or e.get("cat") in ("ac2g", "gpu_user_annotation"):
            continue
        e = json.loads(json.dumps(e))
        args = e.get("args", {})
        if name_launches and e.get("cat") in ("cuda_runtime", "cuda_driver") and args.get("correlation") in names_by_corr:
            args["kernel"] = names_by_corr[args["correlation"]]  # as roctracer writes it
        if drop_kernel_names:
            args.pop("kernel", None)
        capture_events.append(e)
    pid, tid = step["pid"], step["tid"]
    begin, end = f"{'hip' if runtime == 'rocm' else 'cuda'}StreamBeginCapture", \
        f"{'hip' if runtime == 'rocm' else 'cuda'}StreamEndCapture"
    capture_events += [
        {"ph": "X", "cat": "cuda_runtime", "name": begin, "pid": pid, "tid": tid, "ts": step["ts"] - 1, "dur": 0.5,
         "args": {"correlation": GRAPH_CORR + 1}},
        {"ph": "X", "cat": "cuda_runtime", "name": end, "pid": pid, "tid": tid, "ts": step["ts"] + step["dur"] + 1,
         "dur": 0.5, "args": {"correlation": GRAPH_CORR + 2}},
    ]
    capture = folder / "capture.json"
    capture.write_text(json.dumps({**doc, "traceEvents": capture_events}))

    launch = f"{'hip' if runtime == 'rocm' else 'cuda'}GraphLaunch"
    replay_events = [e for e in events if e.get("ph") == "M"]
    replay_events += [
        dict(step),
        {"ph": "X", "cat": "user_annotation", "name": "step[DECODE bs=1]", "pid": pid, "tid": tid, "ts": step["ts"] + 1,
         "dur": step["dur"] - 2, "args": {}},
        {"ph": "X", "cat": "cuda_runtime", "name": launch, "pid": pid, "tid": tid, "ts": step["ts"] + 5, "dur": 20.0,
         "args": {"correlation": GRAPH_CORR}},
    ]
    for k in kernels:
        k = json.loads(json.dumps(k))
        k["args"]["correlation"] = GRAPH_CORR
        k["args"].pop("External id", None)
        replay_events.append(k)
    replay = folder / "replay.json"
    replay.write_text(json.dumps({**doc, "traceEvents": replay_events}))
    return replay, capture, kernels


def _per_op(run) -> dict[tuple, tuple[float, int]]:
    rows = run.to_pandas()[run.to_pandas()["time_us_total"] > 0]
    return {tuple(r[k] for k in KEY): (r["time_us_total"], r["calls"]) for r in rows.to_dict("records")}


@pytest.mark.parametrize("name,runtime,name_launches", [
    ("h100_bert-small_bf16", "cuda", False),  # CUDA: launch calls carry no kernel name -> order alone
    ("h100_bert-small_bf16", "cuda", True),  # kernel names on the launch calls -> name and order
    ("mi300x_bert-small_bf16", "rocm", False),  # ROCm: roctracer names each launch's kernel
])
def test_every_replayed_kernel_gets_its_op_and_the_eager_per_op_totals(tmp_path, name, runtime, name_launches):
    replay, capture, kernels = build_pair(name, tmp_path, runtime, name_launches)
    eager = analyze_trace_file(TRACES / f"{name}.json.gz", out=tmp_path / "eager")
    alone = analyze_trace_file(replay, out=tmp_path / "alone")
    merged = analyze_trace_file(replay, out=tmp_path / "merged", capture=capture)

    # without the capture: graph mode, kernel rows, no shapes
    assert (alone.to_pandas()["note"] == GRAPH_KERNEL_NOTE).sum() == len({k["name"] for k in kernels})
    assert alone.summary["graph_replay"]["kernels"] == len(kernels)
    # with it: every kernel is an op's, with the op's shapes and cost, and the totals are the eager ones
    assert not (merged.to_pandas()["note"] == GRAPH_KERNEL_NOTE).any()
    assert UNATTRIBUTED not in set(merged.to_pandas()["op"])
    assert merged.meta["capture"]["merged_launches"] == 1 and merged.meta["capture"]["kernels"] == len(kernels)
    assert merged.meta["capture"]["matched_by"] == ("kernel name and order" if runtime == "rocm" or name_launches
                                                     else "order")
    graph = merged.summary["graph_replay"]
    assert graph["kernels"] == graph["captured_kernels"] == len(kernels)
    assert graph["captured_time_share"] == pytest.approx(1.0)
    want, got = _per_op(eager), _per_op(merged)
    assert set(got) == set(want)
    for key, (us, calls) in want.items():
        assert got[key][0] == pytest.approx(us), key
        assert got[key][1] == calls, key
    cols = ["flops_per_call", "bytes_per_call", "bound", "achieved_gflops"]
    e_rows = eager.to_pandas().set_index(KEY)[cols]
    m_rows = merged.to_pandas().set_index(KEY)[cols]
    for key in want:
        for col in cols:
            a, b = e_rows.loc[key, col], m_rows.loc[key, col]
            assert a == b or (a != a and b != b) or a == pytest.approx(b), (key, col)
    # the ops ran during capture, not in the replay: no CPU time
    assert merged.to_pandas()["cpu_time_us_total"].sum() == 0
    assert merged.summary["ops_covered_time_share"] == pytest.approx(eager.summary["ops_covered_time_share"])


def test_findings_come_back_with_the_shapes(tmp_path):
    replay, capture, _ = build_pair("h100_bert-small_bf16", tmp_path)
    eager = analyze_trace_file(TRACES / "h100_bert-small_bf16.json.gz", out=tmp_path / "eager")
    merged = analyze_trace_file(replay, out=tmp_path / "merged", capture=capture)
    rules = {f["rule"] for f in merged.findings}
    assert "gemm-alignment" in rules and "gemm-alignment" in {f["rule"] for f in eager.findings}
    gemm = next(f for f in merged.findings if f["rule"] == "gemm-alignment")
    assert gemm["source_location"] in {f["source_location"] for f in eager.findings if f["rule"] == "gemm-alignment"}


def test_a_capture_that_does_not_match_leaves_the_kernel_rows_and_says_so(tmp_path):
    replay, capture, kernels = build_pair("h100_bert-small_bf16", tmp_path, name_launches=True)
    doc = json.loads(capture.read_text())
    first = next(e for e in doc["traceEvents"] if e.get("args", {}).get("kernel"))
    first["args"]["kernel"] = "some_other_kernel"
    capture.write_text(json.dumps(doc))
    warnings: list[str] = []
    run = analyze_trace_file(replay, out=tmp_path / "run", capture=capture, warn=warnings.append)
    assert any("match no captured graph" in w for w in warnings)
    assert run.meta["capture"]["merged_launches"] == 0
    assert (run.to_pandas()["note"] == GRAPH_KERNEL_NOTE).sum() == len({k["name"] for k in kernels})


def test_cli_capture_option_and_bad_capture(tmp_path):
    replay, capture, _ = build_pair("mi300x_bert-small_bf16", tmp_path, "rocm")
    proc = run_cli("analyze", str(replay), "--capture", str(capture), "--out", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr
    out = " ".join(" ".join(line.strip(" │╭╮╰╯─") for line in proc.stdout.splitlines()).split())
    assert "100.0% of GPU time is mapped back to the ops and shapes" in out
    assert "addmm" in out
    not_capture = tmp_path / "no_launches.json"
    not_capture.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 0, "dur": 1, "args": {}}]}))
    proc = run_cli("analyze", str(replay), "--capture", str(not_capture), "--out", str(tmp_path / "run2"))
    assert proc.returncode == 2 and "not a trace recorded during graph capture" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run2").exists()
