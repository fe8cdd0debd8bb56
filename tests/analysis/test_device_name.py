"""A trace whose deviceProperties has no GPU name (vLLM writes an empty one): the name comes from the rest
of deviceProperties, then from the kernel-name vocabulary, and the run says which; never empty."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from conftest import TRACES, run_cli
from opscope.analysis.trace_file import UNKNOWN_GPU, analyze_trace_file
from opscope.machine.peaks import gpu_from_properties

SGLANG = TRACES / "sglang_qwen3-8b_decode_cudagraph.json.gz"
BERT_H100 = TRACES / "h100_bert-small_bf16.json.gz"


def variant(src: Path, dst: Path, edit) -> Path:  # noqa: ANN001
    doc = json.loads(gzip.decompress(src.read_bytes()))
    edit(doc)
    dst.write_text(json.dumps(doc))
    return dst


def blank_name(doc: dict) -> None:
    for p in doc["deviceProperties"]:
        p["name"] = ""


def no_properties(doc: dict) -> None:
    doc.pop("deviceProperties")


def test_empty_name_falls_back_to_device_properties(tmp_path):
    trace = variant(SGLANG, tmp_path / "t.json", blank_name)
    run = analyze_trace_file(trace, out=tmp_path / "run")
    device = run.meta["device"]
    assert device["name"] == "AMD Instinct MI300X"
    assert device["name_source"] == "deviceProperties without a name: compute capability 9.4, 304 CUs, 192 GiB"
    assert run.meta["peaks"]["origin"]["flops"] == "spec-table"  # recognised: the datasheet peaks apply


def test_no_device_properties_falls_back_to_kernel_names(tmp_path):
    run = analyze_trace_file(variant(SGLANG, tmp_path / "a.json", no_properties), out=tmp_path / "a")
    assert run.meta["device"]["name"] == "AMD Instinct (gfx942: MI300 series)"
    assert run.meta["device"]["name_source"].startswith("kernel names (e.g. Cijk_Alik_Bljk_BBS")
    run = analyze_trace_file(variant(BERT_H100, tmp_path / "b.json", no_properties), out=tmp_path / "b")
    assert run.meta["device"] == {"type": "cuda", "name": "NVIDIA Hopper (sm90)",
                                  "name_source": "kernel names (e.g. sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64"
                                                 "_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas)"}


def test_nothing_to_go_by_is_said_not_left_empty(tmp_path):
    def strip(doc: dict) -> None:
        no_properties(doc)
        for e in doc["traceEvents"]:
            if e.get("cat") == "kernel":
                e["name"] = "my_kernel"

    run = analyze_trace_file(variant(BERT_H100, tmp_path / "t.json", strip), out=tmp_path / "run")
    assert run.meta["device"]["name"] == UNKNOWN_GPU and run.meta["device"]["name_source"] == "none"


def test_the_name_given_is_used_as_it_is(tmp_path):
    run = analyze_trace_file(BERT_H100, out=tmp_path / "run")
    assert run.meta["device"] == {"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "name_source": "deviceProperties"}


@pytest.mark.parametrize("props,runtime,name", [
    ({"computeMajor": 9, "computeMinor": 0, "numSms": 132, "totalGlobalMem": 85_017_362_432}, "cuda",
     "NVIDIA H100 80GB HBM3"),
    ({"computeMajor": 9, "computeMinor": 0, "numSms": 132, "totalGlobalMem": 150_110_011_392}, "cuda", "NVIDIA H200"),
    ({"computeMajor": 9, "computeMinor": 4, "numSms": 304, "totalGlobalMem": 274_877_906_944}, "rocm",
     "AMD Instinct MI325X"),
    ({"computeMajor": 9, "computeMinor": 4, "numSms": 304, "totalGlobalMem": 274_877_906_944}, "cuda", None),
    ({"computeMajor": 9, "computeMinor": 0, "numSms": 132}, "cuda", None),  # no memory size: not enough
])
def test_properties_table(props, runtime, name):
    found = gpu_from_properties(props, runtime)
    assert (found[0] if found else None) == name


def test_console_says_where_the_name_came_from(tmp_path):
    trace = variant(SGLANG, tmp_path / "t.json", blank_name)
    proc = run_cli("analyze", str(trace), "--out", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr
    out = " ".join(" ".join(line.strip(" │╭╮╰╯─") for line in proc.stdout.splitlines()).split())
    assert "rocm: AMD Instinct MI300X (from deviceProperties without a name: compute capability 9.4" in out
