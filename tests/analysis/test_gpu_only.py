"""GPU-only traces (no cpu_op events: a trace exported from the GPU timeline alone): a kernel-level report
with rows by kernel name and family, busy share and gaps. Made here by removing every CPU event from the
shared traces."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import pytest

from conftest import TRACES, run_cli, union_us
from opscope.analysis.trace_file import analyze_trace_file
from opscope.run.schema import GPU_ONLY_NOTE
from opscope.trace.kernel_names import kernel_family

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def gpu_only_copy(src: Path, dst: Path) -> list[dict]:
    """`src` without its CPU side (ops, runtime calls, Python frames, annotations); returns its kernels."""
    doc = json.loads(gzip.decompress(src.read_bytes()))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") in DEVICE_CATS or e.get("ph") == "M"]
    dst.write_text(json.dumps(doc))
    return [e for e in doc["traceEvents"] if e.get("cat") in DEVICE_CATS]


@pytest.mark.parametrize("name", ["h100_bert-small_bf16", "sglang_qwen3-8b_decode_cudagraph"])
def test_gpu_only_trace_gives_a_kernel_report_with_the_same_kernel_times(tmp_path, name):
    src = TRACES / f"{name}.json.gz"
    kernels = gpu_only_copy(src, tmp_path / "gpu_only.json")
    run = analyze_trace_file(tmp_path / "gpu_only.json", out=tmp_path / "run")
    full = analyze_trace_file(src, out=tmp_path / "full")
    expected: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for e in kernels:
        expected[e["name"]] += e["dur"]
        calls[e["name"]] += 1
    ops = run.to_pandas()
    assert len(ops) == len(expected) and set(ops["op"]) == set(expected)  # one row per kernel name
    for row in ops.to_dict("records"):
        assert row["time_us_total"] == pytest.approx(expected[row["op"]])
        assert row["calls"] == calls[row["op"]]
        assert row["note"] == GPU_ONLY_NOTE and row["bound"] == "unknown" and row["launcher"] == ""
        assert row["kernel_family"] == kernel_family(row["op"], "gpu_memcpy" if row["op"].startswith("Memcpy") else "kernel")
    # the same kernel time as the full trace's report, and the same family split
    assert run.summary["total_time_us"] == pytest.approx(full.summary["total_time_us"])
    for family, share in full.summary["kernel_family_time_share"].items():
        assert run.summary["kernel_family_time_share"][family] == pytest.approx(share)
    assert run.summary["gpu_only"] is True and "gpu_only" not in full.summary
    assert run.summary["unattributed_time_share"] == 0.0
    assert 0 < run.summary["device_busy_share"] <= 1
    assert run.summary["idle_gaps"] and all(g["cpu_op"] == "" for g in run.summary["idle_gaps"])
    assert not any(f["rule"] == "launch-bound" for f in run.findings)  # no CPU data to blame
    assert run.meta["device"]["name"] == full.meta["device"]["name"]


def test_gpu_only_busy_share_is_over_the_kernel_span(tmp_path):
    kernels = gpu_only_copy(TRACES / "h100_bert-small_bf16.json.gz", tmp_path / "gpu_only.json")
    run = analyze_trace_file(tmp_path / "gpu_only.json", out=tmp_path / "run")
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in kernels]
    window = max(e for _, e in spans) - min(s for s, _ in spans)
    assert run.summary["step_time_us"] == pytest.approx(window)
    assert run.summary["device_busy_share"] == pytest.approx(union_us(spans) / window)


def test_console_says_gpu_only(tmp_path):
    gpu_only_copy(TRACES / "mi300x_bert-small_bf16.json.gz", tmp_path / "gpu_only.json")
    proc = run_cli("analyze", str(tmp_path / "gpu_only.json"), "--out", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr
    out = " ".join(" ".join(line.strip(" │╭╮╰╯─") for line in proc.stdout.splitlines()).split())
    assert "GPU-only trace: no CPU ops recorded" in out
    assert "attention: attn_fwd" in out


def test_a_trace_with_neither_ops_nor_kernels_is_refused(tmp_path):
    doc = json.loads(gzip.decompress((TRACES / "h100_bert-small_bf16.json.gz").read_bytes()))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") not in ("cpu_op", *DEVICE_CATS)]
    (tmp_path / "empty.json").write_text(json.dumps(doc))
    proc = run_cli("analyze", str(tmp_path / "empty.json"), "--out", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert "no operator (cpu_op) events and no GPU kernels" in proc.stderr
    assert not (tmp_path / "run").exists()
