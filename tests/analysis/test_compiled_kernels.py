"""Inductor's kernels costed and placed (issue 25): from the trace alone, from the trace's inductor cache
files, and from the TORCH_TRACE log's post-grad graph and provenance, on the real MI300X and H200 traces.
Hand counts in the comments; inductor's own estimates (the H200 trace's kernel_num_gb) as the independent
check."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from conftest import REPO, TRACES, run_cli
from opscope.analysis.compiled import graph_kernel_cost, name_ops
from opscope.analysis.trace_file import analyze_trace_file
from opscope.trace.torch_trace import CompiledGraph, CompiledKernel, GraphNode

H200 = REPO / "tests" / "fixtures" / "h200"
H200_TRACE = H200 / "h200_torch-compile_block_bf16.json.gz"
H200_LOG = H200 / "h200_torch-compile_block_bf16.torch_trace.log.gz"
MI300X = TRACES / "mi300x_torch-compile_triton.json.gz"
MiB2 = 8 * 4096 * 2048 * 2  # one [8, 4096, 2048] bfloat16 buffer: 134,217,728 bytes


def rows(run) -> dict[str, dict]:
    return {r["op"]: r for r in run.to_pandas().to_dict("records") if r["op"].startswith("triton_")}


def test_every_mi300x_triton_kernel_has_flops_bytes_and_a_bound_from_the_trace_alone(tmp_path: Path) -> None:
    run = analyze_trace_file(MI300X, out=tmp_path / "run")
    triton = rows(run)
    # hand counts of each kernel's external inputs and outputs, as its launch lists its buffers
    expected_bytes = {
        # x [8,4096,2048] read, weight [2048] read, normed [8,4096,2048] written
        "triton_red_fused_add_mean_mul_pow_rsqrt_0": 2 * MiB2 + 2048 * 2,
        # residual, o-proj output [32768,2048], weight, normed output
        "triton_red_fused__unsafe_view_add_mean_mul_pow_rsqrt_1": 3 * MiB2 + 2048 * 2,
        # gate and up projections [8,4096,8192] / [32768,8192] (the product overwrites one of them in place)
        "triton_poi_fused__unsafe_view_mul_silu_2": 2 * 8 * 4096 * 8192 * 2,
        # residual, h, down-proj output
        "triton_poi_fused__unsafe_view_add_3": 3 * MiB2,
    }
    assert set(triton) == set(expected_bytes)
    for name, nbytes in expected_bytes.items():
        r = triton[name]
        assert r["bytes_per_call"] == nbytes, name
        assert r["flops_per_call"] > 0 and r["bound"] in ("memory", "compute"), name
        assert 0 < r["pct_peak_bandwidth"] < 100
        assert "from the trace's launch arguments" in r["note"] and "overwrites in place" in r["note"]
    # add, mean, mul, pow, rsqrt over 32768 x 2048 elements (an upper bound: rsqrt runs once per row)
    assert triton["triton_red_fused_add_mean_mul_pow_rsqrt_0"]["flops_per_call"] == 5 * 32768 * 2048
    assert run.summary["ops_covered_time_share"] >= 0.99


def test_kernel_names_list_the_ops_the_cost_model_knows() -> None:
    assert name_ops("triton_red_fused_add_mean_mul_pow_rsqrt_0") == ["add", "mean", "mul", "pow", "rsqrt"]
    assert name_ops("triton_poi_fused__unsafe_view_mul_silu_2") == ["mul", "silu"]
    assert name_ops("triton_per_fused__to_copy_native_layer_norm_7") == ["native_layer_norm"]
    assert name_ops("triton_poi_fused_clone_0") == []
    assert name_ops("aten::mm") == []


# inductor's own estimates on the H200 (kernel_num_gb, recorded with benchmark_kernel), in bytes
H200_INDUCTOR_BYTES = {
    "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0": 33_566_720,
    "triton_red_fused__to_copy__unsafe_view_add_mean_mul_pow_rsqrt_1": 50_368_512,
    "triton_poi_fused__unsafe_view_mul_silu_2": 138_412_032,
    "triton_poi_fused__unsafe_view_add_3": 67_108_864,
}


@pytest.fixture(scope="module")
def h200_with_log(tmp_path_factory):
    return analyze_trace_file(H200_TRACE, out=tmp_path_factory.mktemp("h200") / "run", torch_trace=H200_LOG)


def test_h200_kernels_from_the_log_match_inductors_bytes_and_name_the_users_lines(h200_with_log) -> None:
    triton = rows(h200_with_log)
    assert set(triton) == set(H200_INDUCTOR_BYTES)
    for name, nbytes in H200_INDUCTOR_BYTES.items():
        r = triton[name]
        assert r["bytes_per_call"] == pytest.approx(nbytes, rel=0.10), name
        assert r["bound"] == "memory" and r["flops_per_call"] > 0
        assert "post-grad graph and provenance of the TORCH_TRACE log" in r["note"]
        assert r["source_location"].startswith("h200_compiled_block.py:")
    # hand counts: RMSNorm 1 reads x (16 MiB) and its weight (4 KiB), writes the normed x (16 MiB) and the
    # bf16 rsqrt saved for backward ([4,1024,1]: 8 KiB); exactly inductor's count
    assert triton["triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0"]["bytes_per_call"] == 33_566_720
    # add_3 recomputes x + o(a) (inductor rematerializes it): reads x, o(a), down(h), writes the sum
    assert triton["triton_poi_fused__unsafe_view_add_3"]["bytes_per_call"] == 4 * 16_777_216
    # SwiGLU: silu(gate) * up, 5 FLOPs per element (neg, exp, add, div, mul) over 4 x 1024 x 5632
    assert triton["triton_poi_fused__unsafe_view_mul_silu_2"]["flops_per_call"] == 5 * 4 * 1024 * 5632
    # the RMSNorm kernels sit at RMSNorm.forward's lines 35-36, in the norm modules
    for name, module in (("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "Block.n1"),
                         ("triton_red_fused__to_copy__unsafe_view_add_mean_mul_pow_rsqrt_1", "Block.n2")):
        r = triton[name]
        assert r["source_location"] == "h200_compiled_block.py:35"
        assert "h200_compiled_block.py:36" in r["note"] and r["module"] == module
    assert "h200_compiled_block.py:52" in triton["triton_poi_fused__unsafe_view_mul_silu_2"]["source_location"]


def test_h200_extern_kernels_get_the_users_lines_not_inductors_file(h200_with_log) -> None:
    ops = h200_with_log.to_pandas()
    mm = ops[ops["op"] == "aten::mm"]
    assert len(mm) == 4  # qkv (49), o (51), gate+up (52: same shape, one row), down (52)
    assert set(mm["source_location"]) == {"h200_compiled_block.py:49", "h200_compiled_block.py:51",
                                          "h200_compiled_block.py:52"}
    assert not any("torchinductor" in s for s in ops["source_location"])


def test_without_the_log_the_h200_kernels_are_costed_from_the_trace_and_say_so(tmp_path: Path) -> None:
    triton = rows(analyze_trace_file(H200_TRACE, out=tmp_path / "run"))
    for name, nbytes in H200_INDUCTOR_BYTES.items():
        r = triton[name]
        assert "from the trace's launch arguments" in r["note"] and "no TORCH_TRACE log" in r["note"]
        assert "inductor estimated" in r["note"]
        assert r["bytes_per_call"] <= nbytes  # in-place buffers once: at most inductor's count


def test_the_inductor_cache_says_which_buffers_are_overwritten_in_place(tmp_path: Path) -> None:
    # the add_3 kernel's generated file, where the trace says it was (`kernel_file`), under the cache dir
    doc = json.loads(gzip.decompress(H200_TRACE.read_bytes()))
    kfile = next(e["args"]["kernel_file"] for e in doc["traceEvents"]
                 if e.get("name") == "triton_poi_fused__unsafe_view_add_3" and e.get("cat") == "cpu_op")
    parts = kfile.split("/")
    where = tmp_path / "cache" / parts[-2]
    where.mkdir(parents=True)
    (where / parts[-1]).write_text("@triton.jit\ndef triton_poi_fused__unsafe_view_add_3(in_out_ptr0, in_ptr0, "
                                   "in_ptr1, xnumel, XBLOCK : tl.constexpr):\n    pass\n")
    triton = rows(analyze_trace_file(H200_TRACE, out=tmp_path / "run", inductor_cache=tmp_path / "cache"))
    r = triton["triton_poi_fused__unsafe_view_add_3"]
    assert r["bytes_per_call"] == 67_108_864 and "in-place one(s) twice" in r["note"]


def _node(name: str, op: str, args: tuple[str, ...], shape: tuple[int, ...]) -> GraphNode:
    return GraphNode(name, op, args, "float", shape, None)


def test_a_value_two_kernels_compute_is_not_an_output_of_either() -> None:
    # k1 computes t = a + b and u = t * t; k2 recomputes t and writes v = t + c. t lives in neither's memory.
    g = CompiledGraph(compile_id="0/0")
    for n in (_node("a", "", (), (1024,)), _node("b", "", (), (1024,)), _node("c", "", (), (1024,)),
              _node("t", "aten::add", ("a", "b"), (1024,)), _node("u", "aten::mul", ("t", "t"), (1024,)),
              _node("v", "aten::add", ("t", "c"), (1024,))):
        g.nodes[n.name] = n
    g.outputs = ("u", "v")
    k1 = g.kernels["k1:1"] = CompiledKernel("k1:1", "triton_poi_fused_add_mul_0", ("t", "u"))
    k2 = g.kernels["k2:2"] = CompiledKernel("k2:2", "triton_poi_fused_add_1", ("t", "v"))
    c1, c2 = graph_kernel_cost(g, k1), graph_kernel_cost(g, k2)
    assert c1 is not None and c2 is not None
    assert c1.nbytes == 3 * 4096 and c1.flops == 2 * 1024  # reads a, b; writes u
    assert c2.nbytes == 4 * 4096 and c2.flops == 2 * 1024  # reads a, b, c; writes v
    # a symbolic shape: no count rather than a guess
    g.nodes["a"] = GraphNode("a", "", (), "float", None, None)
    assert graph_kernel_cost(g, k1) is None


def test_a_bad_torch_trace_log_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "log.txt"
    bad.write_text("hello\n")
    out = tmp_path / "run"
    r = run_cli("analyze", str(H200_TRACE), "--torch-trace", str(bad), "--out", str(out))
    assert r.returncode == 2 and "not a TORCH_TRACE log" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not out.exists()
    r = run_cli("analyze", str(H200_TRACE), "--inductor-cache", str(bad), "--out", str(out))
    assert r.returncode == 2 and "not a directory" in r.stderr and not out.exists()
