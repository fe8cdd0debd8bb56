"""Custom ops of inference engines (`_C::paged_attention_v1`, `vllm::unified_attention_with_output`,
`vllm::moe_forward`): rows like aten ops; the kernels under them give the family; paged-attention decode
gets a cost from its recorded shapes and max_seq_len; the rest is unknown and not counted as covered."""

from __future__ import annotations

import json

import pytest

from opscope.analysis.ops_table import CUSTOM_OP_NOTE
from opscope.analysis.trace_file import analyze_trace_file
from opscope.costmodel import OpCall, estimate
from opscope.costmodel.custom import KV_LEN_NOTE
from opscope.machine.peaks import match_gpu

BF16 = "c10::BFloat16"
# _C::paged_attention_v1(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens,
# block_size, max_seq_len, alibi_slopes, kv_cache_dtype, k_scale, v_scale, tp_rank, ...): 32 sequences of
# one query token, 32 query heads and 8 KV heads of size 128, KV blocks of 16 tokens, max_seq_len 1024
PAGED_V1 = {
    "Input Dims": [[32, 32, 128], [32, 32, 128], [1000, 8, 16, 16, 8], [1000, 8, 128, 16], [], [], [32, 64], [32],
                   [], [], [], [], [], [], [], [], [], [], []],
    "Input type": [BF16, BF16, BF16, BF16, "Scalar", "Scalar", "int", "int", "Scalar", "Scalar", "", "", "float",
                   "float", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar"],
    "Input Strides": [[4096, 128, 1], [4096, 128, 1], [16384, 2048, 128, 8, 1], [16384, 2048, 16, 1], [], [],
                      [64, 1], [1], [], [], [], [], [], [], [], [], [], [], []],
    "Concrete Inputs": ["", "", "", "", "8", "0.088388", "", "", "16", "1024", "", "auto", "", "", "0", "0", "0",
                        "64", "0"],
}
PAGED_FLOPS = 4 * 32 * 32 * 1024 * 128
PAGED_BYTES = (2 * 32 * 32 * 128 * 2  # query read, output written (bf16)
               + 2 * 32 * 1024 * 8 * 128 * 2  # keys and values of 1024 tokens per sequence (bf16 cache)
               + 32 * 64 * 4 + 32 * 4)  # block tables, sequence lengths (int32)


def test_paged_attention_cost_by_hand():
    cost = estimate(OpCall("_C::paged_attention_v1", *(tuple(PAGED_V1[k]) for k in (
        "Input Dims", "Input type", "Input Strides", "Concrete Inputs"))))
    assert cost.flops == PAGED_FLOPS and cost.bytes == PAGED_BYTES
    assert cost.family == "attention" and cost.note == KV_LEN_NOTE
    # v2 has exp_sums, max_logits, tmp_out before the query: the same work
    v2 = {k: v[:1] + [[32, 32, 4], [32, 32, 4], [32, 32, 4, 128]] + v[1:] for k, v in PAGED_V1.items()}
    v2["Input type"][1:4] = ["float", "float", BF16]
    v2["Concrete Inputs"][1:4] = ["", "", ""]
    cost2 = estimate(OpCall("_C::paged_attention_v2", *(tuple(v2[k]) for k in (
        "Input Dims", "Input type", "Input Strides", "Concrete Inputs"))))
    assert (cost2.flops, cost2.bytes) == (PAGED_FLOPS, PAGED_BYTES)
    # without a recorded max_seq_len there is no honest count
    blank = dict(PAGED_V1, **{"Concrete Inputs": [""] * 19})
    assert estimate(OpCall("_C::paged_attention_v1", *(tuple(blank[k]) for k in (
        "Input Dims", "Input type", "Input Strides", "Concrete Inputs")))) is None


def _trace(path, ops: list[tuple[str, dict, str, float]]) -> None:
    """A CUDA trace: per (op name, args, kernel name, kernel µs) one cpu_op, its cudaLaunchKernel and the
    kernel."""
    events, t = [], 1000.0
    for i, (name, args, kernel, dur) in enumerate(ops):
        ext, corr = 100 + i, 500 + i
        events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": t, "dur": 20.0,
                       "args": {"External id": ext, **args}})
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": t + 5, "dur": 5.0, "args": {"External id": ext, "correlation": corr}})
        events.append({"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 7, "ts": t + 15, "dur": dur,
                       "args": {"External id": ext, "correlation": corr, "stream": 7, "device": 0}})
        t += 30.0 + dur
    doc = {"deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}], "traceEvents": events}
    path.write_text(json.dumps(doc))


def test_custom_ops_are_rows_with_their_kernel_family(tmp_path):
    _trace(tmp_path / "t.json", [
        ("_C::paged_attention_v1", PAGED_V1,
         "void vllm::paged_attention_v1_kernel<__nv_bfloat16, __nv_bfloat16, 128, 16, 128, "
         "(vllm::Fp8KVCacheDataType)0, false>(__nv_bfloat16*)", 400.0),
        ("vllm::unified_attention_with_output", {"Input Dims": [[32, 4096], [32, 1024], [32, 1024], [32, 4096], []],
                                                 "Input type": [BF16, BF16, BF16, BF16, ""]},
         "kernel_unified_attention_2d", 300.0),
        ("vllm::moe_forward", {"Input Dims": [[32, 4096], [32, 64]], "Input type": [BF16, BF16]},
         "fused_moe_kernel", 200.0),
        ("_C_cache_ops::reshape_and_cache_flash", {"Input Dims": [[32, 8, 128], [32, 8, 128]]},
         "void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, __nv_bfloat16, (vllm::Fp8KVCacheDataType)0>()",
         100.0),
    ])
    run = analyze_trace_file(tmp_path / "t.json", out=tmp_path / "run")
    rows = {r["op"]: r for r in run.to_pandas().to_dict("records")}
    paged = rows["_C::paged_attention_v1"]
    assert paged["flops_per_call"] == PAGED_FLOPS and paged["bytes_per_call"] == PAGED_BYTES
    assert paged["family"] == "attention" and paged["kernel_family"] == "attention"
    spec = match_gpu("NVIDIA H100 80GB HBM3")
    assert paged["ceiling"] == "bfloat16"
    assert paged["achieved_gbps"] == pytest.approx(PAGED_BYTES / 400e-6 / 1e9)
    assert paged["pct_peak_bandwidth"] == pytest.approx(100 * PAGED_BYTES / 400e-6 / 1e9 / spec.memory_bandwidth_gbps)
    assert paged["bound"] == "memory"  # 4 FLOP/B, far under the H100's bf16 ridge (295 FLOP/B)

    unified = rows["vllm::unified_attention_with_output"]
    assert unified["kernel_family"] == "attention" and unified["family"] == "attention"
    assert unified["bound"] == "unknown" and unified["note"] == CUSTOM_OP_NOTE
    assert unified["flops_per_call"] != unified["flops_per_call"]  # NaN: no cost
    moe = rows["vllm::moe_forward"]
    assert moe["kernel_family"] == "moe" and moe["family"] == "" and moe["bound"] == "unknown"
    assert rows["_C_cache_ops::reshape_and_cache_flash"]["kernel_family"] == "copy"
    # coverage counts only the paged attention's time as modelled
    assert run.summary["ops_covered_time_share"] == pytest.approx(400.0 / 1000.0)
    assert run.summary["bound_time_share"]["unknown"] == pytest.approx(600.0 / 1000.0)
