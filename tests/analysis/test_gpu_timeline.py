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
