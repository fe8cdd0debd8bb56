"""Per-stream busy time, communication/compute overlap and idle gaps, on a hand-built trace whose
numbers are easy to check by hand."""

from __future__ import annotations

import json

import pytest

from opscope.analysis.gpu_timeline import _overlap_with, merge
from opscope.analysis.trace_file import analyze_trace_file

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul> >()"


def _trace(path) -> None:
    # op: (name, start, end), kernel: (name, stream, start, end) or None
    plan = [
        (("aten::mm", 2, 100), (GEMM, 7, 10, 50)),
        (("c10d::allreduce_", 100, 128), (NCCL, 9, 40, 80)),
        (("aten::add", 130, 134), (ADD, 7, 200, 210)),
        (("aten::_local_scalar_dense", 135, 195), None),  # the CPU waits here while the GPU idles
    ]
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0,
               "dur": 250, "args": {}}]
    for i, ((op, a, b), kernel) in enumerate(plan):
        events.append({"ph": "X", "cat": "cpu_op", "name": op, "pid": 1, "tid": 1, "ts": a, "dur": b - a,
                       "args": {"External id": i + 1, "Input Dims": [[64, 64], [64, 64]],
                                "Input type": ["c10::BFloat16", "c10::BFloat16"]}})
        if kernel:
            name, stream, ks, ke = kernel
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                           "ts": a + 1, "dur": 0.5, "args": {"correlation": 50 + i}})
            events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ks,
                           "dur": ke - ks, "args": {"correlation": 50 + i, "stream": stream, "device": 0}})
    path.write_text(json.dumps({"deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
                                "traceEvents": events}))


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
    folder = tmp_path_factory.mktemp("timeline")
    _trace(folder / "t.json")
    return analyze_trace_file(folder / "t.json", out=folder / "run").summary


def test_streams_by_hand(summary):
    streams = {r["stream"]: r for r in summary["streams"]}
    assert streams[7]["busy_us"] == pytest.approx(40 + 10) and streams[7]["kernels"] == 2
    assert streams[9]["busy_us"] == pytest.approx(40) and streams[9]["kernels"] == 1
    assert streams[7]["busy_share"] == pytest.approx(50 / 250)
    assert summary["device_busy_share"] == pytest.approx((80 - 10 + 10) / 250)


def test_comm_compute_overlap_by_hand(summary):
    # the all-reduce runs 40..80 µs; compute kernels run 10..50 and 200..210: 10 of its 40 µs overlap
    assert summary["comm_compute_overlap_share"] == pytest.approx(10 / 40)
    assert summary["kernel_family_time_share"]["communication"] == pytest.approx(40 / 90)


def test_idle_gaps_by_hand(summary):
    gaps = summary["idle_gaps"]
    assert [round(g["duration_us"], 6) for g in gaps] == [120, 40, 10]  # 80..200, 210..250 (step end), 0..10
    first = gaps[0]
    assert first["start_us"] == pytest.approx(80)
    assert first["kernel_before"] == NCCL and first["kernel_after"] == ADD
    assert first["cpu_op"] == "aten::_local_scalar_dense"  # what the CPU ran at the gap's middle (140 µs)
    assert gaps[1]["kernel_before"] == ADD and gaps[1]["kernel_after"] == ""


def test_merge_intervals():
    s, e = merge([5.0, 0.0, 2.0, 10.0, 10.0], [6.0, 3.0, 4.0, 12.0, 11.0])
    assert s == [0.0, 5.0, 10.0] and e == [4.0, 6.0, 12.0]
    # touching intervals merge; an interval inside an earlier, longer one leaves its end alone
    assert merge([0.0, 2.0, 1.0], [2.0, 3.0, 1.5]) == ([0.0], [3.0])
    assert merge([], []) == ([], [])


def test_overlap_with_union():
    # union [0, 4] and [6, 10]: [3, 7] shares 1 + 1, [4, 6] nothing, [-5, 20] all 8, [8, 9] 1
    assert _overlap_with([3.0, 4.0, -5.0, 8.0], [7.0, 6.0, 20.0, 9.0], [0.0, 6.0], [4.0, 10.0]) == [2.0, 0.0, 8.0, 1.0]
    assert _overlap_with([1.0], [2.0], [], []) == [0.0]


def _backlog_trace(path) -> None:
    """One step [100, 200] µs. The GPU runs behind: kernels 3 and 4 were launched before the trace (no
    launch event, correlation ids below every recorded launch) and run 50..120 and 120..135; add's kernel
    ends at 230, after the step; correlation 20 has no launch event but is not older than the trace."""
    def x(cat, name, ts, dur, tid=1, **args):
        return {"ph": "X", "cat": cat, "name": name, "pid": 1 if cat != "kernel" else 0, "tid": tid, "ts": ts,
                "dur": dur, "args": args}

    def kernel(name, corr, stream, ts, dur):
        return x("kernel", name, ts, dur, tid=stream, correlation=corr, stream=stream, device=0)

    dims = {"Input Dims": [[64, 64], [64, 64]], "Input type": ["c10::BFloat16", "c10::BFloat16"]}
    events = [x("user_annotation", "ProfilerStep#1", 100, 100),
              x("cpu_op", "aten::mm", 110, 20, **dims), x("cuda_runtime", "cudaLaunchKernel", 115, 1, correlation=10),
              x("cpu_op", "aten::add", 180, 10, **dims), x("cuda_runtime", "cudaLaunchKernel", 185, 1, correlation=11),
              kernel(GEMM, 10, 7, 140, 20), kernel(ADD, 11, 7, 190, 40),
              kernel(GEMM, 3, 7, 50, 70), kernel(ADD, 4, 7, 120, 15), kernel(ADD, 20, 8, 160, 10)]
    path.write_text(json.dumps({"deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
                                "traceEvents": events}))


def test_kernels_launched_before_the_trace_are_clipped_to_the_steps(tmp_path):
    """Issue 23, item 23: a row of their own with a note, their time and every busy number inside the step."""
    from opscope.run.read import read_run
    from opscope.run.schema import BACKLOG, BACKLOG_NOTE, UNATTRIBUTED

    _backlog_trace(tmp_path / "t.json")
    run = analyze_trace_file(tmp_path / "t.json", out=tmp_path / "run")
    rows = {op: i for i, op in enumerate(run.ops["op"])}
    late = rows[BACKLOG]
    assert run.ops["calls"][late] == 2 and run.ops["note"][late] == BACKLOG_NOTE
    assert run.ops["time_us_total"][late] == pytest.approx(20 + 15)  # 120 of 50..120 before the step
    assert run.ops["time_us_total"][rows[UNATTRIBUTED]] == pytest.approx(10)
    assert run.ops["time_us_total"][rows["aten::add"]] == pytest.approx(40)  # an op's own kernel counts whole
    s = run.summary
    assert s["total_time_us"] == pytest.approx(20 + 40 + 35 + 10)
    # inside [100, 200]: 100..135, 140..170, 190..200 (unclipped: 155 µs of kernels, "100%")
    assert s["device_busy_share"] == pytest.approx(75 / 100)
    streams = {r["stream"]: r for r in s["streams"]}
    assert streams[7]["busy_us"] == pytest.approx(35 + 20 + 10) and streams[7]["busy_share"] == pytest.approx(0.65)
    assert streams[7]["kernel_time_us"] == pytest.approx(70 + 15 + 20 + 40)
    assert s["backlog_kernels"] == {"kernels": 2, "kernel_time_us": pytest.approx(85), "in_steps_us": pytest.approx(35),
                                    "kernel_time_share": pytest.approx(85 / 155)}
    assert s["unattributed_time_share"] == pytest.approx(10 / 155)
    assert read_run(tmp_path / "run").summary["backlog_kernels"]["kernels"] == 2


def test_clip_to_step_windows():
    from opscope.analysis.gpu_timeline import clip, time_inside

    windows = ([10.0, 30.0], [20.0, 40.0])
    # inside (kept as is), across both edges of the first window, between windows, across the second's start
    assert clip([12.0, 5.0, 21.0, 25.0], [13.5, 25.0, 29.0, 35.0], windows) == ([12.0, 10.0, 30.0], [13.5, 20.0, 35.0])
    assert clip([1.0], [2.0], None) == ([1.0], [2.0])
    assert time_inside([1e12 + 0.1], [0.3], ([1e12], [1e12 + 1])) == [0.3]  # the duration, not end - start
    assert time_inside([5.0, 21.0], [20.0, 8.0], windows) == [10.0, 0.0]


def test_a_gap_while_python_runs_between_ops_names_the_op_started_next(tmp_path):
    """The GPU idles 20..100 µs; no op holds the CPU at 60 µs (Python runs between ops): the gap names
    aten::add, the op the CPU started next (at 80 µs, before its child aten::add_ at 81), not the op
    before it."""
    def op(name, a, b, i):
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": a, "dur": b - a,
                "args": {"External id": i, "Input Dims": [[64], [64]], "Input type": ["float", "float"]}}

    def launch(a, corr, ks, ke):
        return [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": a,
                 "dur": 0.5, "args": {"correlation": corr}},
                {"ph": "X", "cat": "kernel", "name": ADD, "pid": 0, "tid": 7, "ts": ks, "dur": ke - ks,
                 "args": {"correlation": corr, "stream": 7, "device": 0}}]

    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0,
               "dur": 120, "args": {}},
              op("aten::mul", 2, 12, 1), *launch(5, 1, 10, 20),
              op("aten::add", 80, 95, 2), op("aten::add_", 81, 94, 3), *launch(85, 2, 100, 110)]
    (tmp_path / "t.json").write_text(json.dumps({"deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
                                                 "traceEvents": events}))
    gaps = analyze_trace_file(tmp_path / "t.json", out=tmp_path / "run").summary["idle_gaps"]
    first = gaps[0]
    assert (first["start_us"], first["duration_us"]) == (pytest.approx(20), pytest.approx(80))
    assert first["cpu_op"] == "" and first["cpu_next_op"] == "aten::add"
    held = next(g for g in gaps if g["cpu_op"])  # 0..10: aten::mul holds 5 µs; no next op then
    assert held["cpu_op"] == "aten::mul" and held["cpu_next_op"] == ""
