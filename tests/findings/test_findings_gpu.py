"""GPU-only findings on real torch.profiler traces (H100 / MI300X BERT-small and H100 ViT, bf16 inference,
torch 2.6) and on variants derived from them: an fp32 copy (dtypes rewritten, kernels unchanged: no TF32
kernels) and a copy whose kernels run 40x longer (a GPU that is not waiting on the CPU)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest

from conftest import TRACES
from opscope.analysis.trace_file import analyze_trace_file

BERT = TRACES / "h100_bert-small_bf16.json.gz"
VIT = TRACES / "h100_vit-image-classifier_bf16.json.gz"
MI300X = TRACES / "mi300x_bert-small_bf16.json.gz"
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def derive(src: Path, dst: Path, *, fp32: bool = False, kernel_scale: float = 1.0) -> Path:
    doc = json.loads(gzip.decompress(src.read_bytes()))
    for e in doc["traceEvents"]:
        if fp32 and e.get("cat") == "cpu_op" and "Input type" in e.get("args", {}):
            e["args"]["Input type"] = [("float" if t == "c10::BFloat16" else t) for t in e["args"]["Input type"]]
        if kernel_scale != 1.0 and e.get("cat") in DEVICE_CATS:
            e["dur"] = e["dur"] * kernel_scale
    dst.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return dst


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpu")
    traces = {
        "bert": BERT,
        "vit": VIT,
        "mi300x": MI300X,
        "bert_fp32": derive(BERT, folder / "bert_fp32.json.gz", fp32=True),
        "vit_fp32": derive(VIT, folder / "vit_fp32.json.gz", fp32=True),
        "bert_busy": derive(BERT, folder / "bert_busy.json.gz", kernel_scale=40.0),
    }
    return {name: analyze_trace_file(path, out=folder / f"run-{name}") for name, path in traces.items()}


def of(run, rule: str) -> list[dict]:
    return [f for f in run.findings if f["rule"] == rule]


def row_location(run, op: str, dims_prefix: str) -> str:
    rows = run.to_pandas()[(run.to_pandas()["op"] == op) & run.to_pandas()["input_dims"].str.startswith(dims_prefix)]
    assert len(rows) == 1
    return rows["source_location"].iloc[0]


def test_launch_bound_on_bert(runs):
    run = runs["bert"]
    assert run.summary["device_busy_share"] < 0.5
    (f,) = of(run, "launch-bound")
    assert f["severity"] == "high" and "CUDA graph" in f["suggestion"]
    assert f"busy only {run.summary['device_busy_share']:.0%}" in f["message"]
    heaviest = run.to_pandas().groupby("op")["cpu_time_us_total"].sum().idxmax()
    assert f["op"] == heaviest == "aten::addmm"
    idle = run.summary["steps"] * run.summary["step_time_us"] * (1 - run.summary["device_busy_share"])
    assert f["est_savings_us"] == pytest.approx(idle, rel=1e-3)
    assert of(runs["mi300x"], "launch-bound")


def test_no_launch_bound_when_the_gpu_is_busy(runs):
    run = runs["bert_busy"]
    assert run.summary["device_busy_share"] >= 0.5
    assert not of(run, "launch-bound")


def test_gemm_alignment_on_the_vocabulary_projection(runs):
    for name in ("bert", "mi300x"):
        run = runs[name]
        (f,) = of(run, "gemm-alignment")  # only the 30522-wide GEMM; the 512/2048 ones are aligned
        assert "30522" in f["message"] and "N (output features)" in f["message"]
        assert f["source_location"] == row_location(run, "aten::addmm", "[[30522]")
        assert "pad_to_multiple_of" in f["suggestion"]
    assert "align2" in of(runs["bert"], "gemm-alignment")[0]["message"]  # the kernel CUTLASS fell back to
    assert not of(runs["bert_fp32"], "gemm-alignment")  # an fp32 GEMM does not need the alignment
    assert not of(runs["vit"], "gemm-alignment")  # ViT's GEMMs are 768 and 3072 wide: aligned


def test_host_sync_on_the_attention_mask_check(runs):
    for name in ("bert", "mi300x"):
        (f,) = of(runs[name], "host-sync")
        assert f["op"] == "aten::is_nonzero"
        assert f["source_location"] == "transformers/modeling_attn_mask_utils.py:429"
        assert "_local_scalar_dense" in f["message"] and f["est_savings_us"] > 0
    assert "Memcpy DtoH" in of(runs["bert"], "host-sync")[0]["message"]
    assert not of(runs["vit"], "host-sync")


def test_fp32_gemm_fires_on_fp32_not_on_bf16(runs):
    assert not of(runs["bert"], "fp32-gemm")
    hits = of(runs["bert_fp32"], "fp32-gemm")
    addmm_rows = runs["bert_fp32"].to_pandas()[runs["bert_fp32"].to_pandas()["op"] == "aten::addmm"]
    assert len(hits) >= len(addmm_rows) >= 4
    vocab = [f for f in hits if "[[30522]" in f["message"]]
    assert len(vocab) == 1
    row = addmm_rows[addmm_rows["input_dims"].str.startswith("[[30522]")].iloc[0]
    # H100 SXM: fp32 66.9 vs TF32 494.7 TFLOP/s: the time would scale by 66.9/494.7, but not below the
    # time to move its bytes at 3350 GB/s (this skinny GEMM hits that floor)
    floor = row["bytes_per_call"] / 3350e3
    expected = row["time_us_total"] - max(row["time_us_total"] * 66.9 / 494.7, floor)
    assert floor > row["time_us_total"] * 66.9 / 494.7
    assert vocab[0]["est_savings_us"] == pytest.approx(expected, rel=1e-3)
    assert "set_float32_matmul_precision" in vocab[0]["suggestion"]


def test_channels_last_rule_of_thumb_in_analyze(runs):
    (f,) = of(runs["vit"], "channels-last")
    assert f["op"] == "aten::convolution" and "not measured" in f["message"]
    assert "nchwToNhwc" in f["message"]
    conv = runs["vit"].to_pandas()[runs["vit"].to_pandas()["op"] == "aten::cudnn_convolution"]
    assert f["source_location"] == conv["source_location"].iloc[0]
    assert f["est_savings_us"] == pytest.approx(0.2 * conv["time_us_total"].sum(), rel=0.05)
    assert not of(runs["vit_fp32"], "channels-last")  # fp32 on a GPU: no rule of thumb
    assert of(runs["vit_fp32"], "fp32-gemm")


def test_analyze_findings_point_at_function_level_lines(runs):
    for run in runs.values():
        locations = set(run.to_pandas()["source_location"])
        for f in run.findings:
            if f["rule"] not in ("overhead", "launch-bound"):
                assert f["source_location"] in locations, f


# H100 SXM datasheet (dense): GFLOP/s per ceiling, and GB/s
H100_PEAKS = {"bfloat16": 989.4e3, "float16": 989.4e3, "tfloat32": 494.7e3, "float32": 66.9e3}
H100_BW = 3350.0


def test_gpu_overhead_is_kernel_latency_and_fusions_saving(runs):
    run = runs["bert"]
    (f,) = of(run, "overhead")
    assert "latency-bound kernels" in f["message"] and "not their FLOPs or bytes" in f["message"]
    # the example, the [141, 512] x [512, 512] bf16 addmm: 12 kernels in 69.502 µs (5.79 µs each); its
    # ideal is its bytes, (141*512 + 512*512 + 512 + 141*512) * 2 = 814080, at 3350 GB/s: 0.243 µs, above its
    # 2*141*512*512 FLOPs at 989.4 TFLOP/s (0.0747 µs)
    # (the q, k and v projections of 4 layers: 12 rows of one call each, one per module)
    addmm = run.to_pandas()[(run.to_pandas()["op"] == "aten::addmm") & run.to_pandas()["input_dims"].str.startswith("[[512], [141, 512]")
                    & run.to_pandas()["source_location"].str.endswith("modeling_bert.py:364")]
    assert (addmm["calls"].sum(), addmm["time_us_total"].sum()) == (12, pytest.approx(69.502))
    assert addmm["module"].nunique() == 12
    assert set(addmm["bytes_per_call"]) == {(141 * 512 + 512 * 512 + 512 + 141 * 512) * 2} == {814080}
    assert set(addmm["flops_per_call"]) == {2 * 141 * 512 * 512}
    ideal = max(814080 / (H100_BW * 1e3), 2 * 141 * 512 * 512 / (989.4e3 * 1e3))
    assert f"{ideal:.3g}" == "0.243"
    # the example is the overhead-bound row of the most time: layer 0's flash attention, 10.08 µs for 568 KiB
    # (q, k, v and the output, [1, 141, 8, 64] bf16 each, and the [1, 8, 141] fp32 logsumexp) and
    # 4*8*141*141*64 FLOPs: its bytes at 3350 GB/s take 0.174 µs
    big = run.to_pandas()[run.to_pandas()["bound"] == "overhead"].sort_values("time_us_total").iloc[-1]
    assert big["op"] == "aten::_flash_attention_forward" and big["time_us_total"] == pytest.approx(10.08)
    assert big["bytes_per_call"] == 4 * 141 * 8 * 64 * 2 + 8 * 141 * 4
    assert f"{big['bytes_per_call'] / (H100_BW * 1e3):.3g}" == "0.174"
    assert ("_flash_attention_forward at transformers/models/bert/modeling_bert.py:364 takes 10.1 µs per call "
            "against 0.174 µs") in f["message"]
    # the saving by hand: each overhead-bound row's kernel time above calls x its roofline time
    ops = run.to_pandas()[run.to_pandas()["bound"] == "overhead"]
    expected = 0.0
    for _, row in ops.iterrows():
        flops = 0.0 if pd.isna(row["flops_per_call"]) else row["flops_per_call"]
        ideal = max(row["bytes_per_call"] / (H100_BW * 1e3), flops / (H100_PEAKS[row["ceiling"]] * 1e3) if flops else 0.0)
        expected += max(row["time_us_total"] - row["calls"] * ideal, 0.0)
    assert f["est_savings_us"] == pytest.approx(expected, rel=1e-4)
    assert "60 such kernels per step" in f["message"]  # 61 kernels, one of them (the vocabulary GEMM) memory-bound


def test_gpu_overhead_and_launch_bound_never_count_the_same_time(runs):
    for name in ("bert", "mi300x"):
        run = runs[name]
        (over,) = of(run, "overhead")
        (launch,) = of(run, "launch-bound")
        steps, step = run.summary["steps"], run.summary["step_time_us"]
        busy = steps * step * run.summary["device_busy_share"]
        # fusion's saving is kernel time, CUDA graphs' is idle time: disjoint parts of the step
        assert over["est_savings_us"] <= run.to_pandas()["time_us_total"].sum() == pytest.approx(busy, rel=1e-3)
        assert launch["est_savings_us"] == pytest.approx(steps * step - busy, rel=1e-6)
        assert over["est_savings_us"] + launch["est_savings_us"] <= steps * step
        # neither promises that CUDA graphs remove kernel time
        assert "CUDA graphs do not shorten kernels" in over["message"]
        assert "not the kernels' own latency" in over["suggestion"]
        assert "does not shorten the kernels" in launch["message"]
        assert "fusion" not in over["suggestion"].split("CUDA graphs")[1]


def test_counts_per_step_take_their_noun_in_the_singular(runs):
    """"1 call per step", never "1 calls": the BERT step runs its LM head's addmm once."""
    from opscope.findings.base import Context
    from opscope.findings.common import count_per_step
    from opscope.machine.peaks import Peaks

    (lm_head,) = [f for f in of(runs["bert"], "low-bandwidth") if "[30522]" in f["message"]]
    assert "(1 call per step, " in lm_head["message"]
    ctx = Context(ops={}, events={}, peaks=Peaks(1.0, {}), gpu=True, source="trace", steps=2, step_time_us=1.0)
    assert [count_per_step(n, ctx, "call") for n in (2, 3, 4)] == ["1 call", "1.5 calls", "2 calls"]
    assert [count_per_step(n, ctx, "copy", "copies") for n in (2, 6)] == ["1 copy", "3 copies"]
    from opscope import units  # the same helper words the calibration's thread counts

    assert [units.count(n, "thread") for n in (1, 2, 0, "?")] == ["1 thread", "2 threads", "0 threads", "? threads"]
