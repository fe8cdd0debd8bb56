"""Runs built for the HTML report tests (tests/render): hostile text in every field, a big run, and the rows
the roofline plots."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pandas as pd

from conftest import REPO, TRACES
from opscope.analysis.modules import module_table
from opscope.analysis.trace_file import analyze_trace_file
from opscope.run.read import read_run
from opscope.run.write import write_run
from opscope.table import from_frame, to_frame

BERT = TRACES / "h100_bert-small_bf16.json.gz"


HOSTILE_PATH = "models/<img src=x onerror=alert(1)>/m.py"


HOSTILE_KERNEL = "</script><script>window.__pwned=2</script><!--"


HOSTILE_DEVICE = "NVIDIA H100 <svg onload=window.__pwned=3>"


HOSTILE_MODULE = "encoder.</script><b onmouseover=window.__pwned=4>x</b>\u2028.attn"


def hostile_run(folder: Path) -> Path:
    """The BERT trace with a user frame's path, a kernel name and the device name made hostile, analyzed;
    then a module column, modules.csv, swap.json, summary keys and timeline names with hostile text added
    to its run directory (the files later issues write)."""
    doc = json.loads(gzip.decompress(BERT.read_bytes()))
    for e in doc["traceEvents"]:
        if e.get("cat") == "python_function" and "modeling_bert.py(364)" in e["name"]:
            e["name"] = e["name"].replace("transformers/models/bert/modeling_bert.py", HOSTILE_PATH)
        if e.get("cat") == "kernel" and "gemm" in e["name"]:
            e["name"] = e["name"] + HOSTILE_KERNEL
    doc["deviceProperties"][0]["name"] = HOSTILE_DEVICE
    trace = folder / "hostile.json"
    trace.write_text(json.dumps(doc))
    out = folder / "hostile"
    analyze_trace_file(trace, out=out, peak_bw=3350.0, peak_flops=["989000"])
    ops = pd.read_csv(out / "ops.csv", dtype=str, keep_default_na=False)
    ops["module"] = [HOSTILE_MODULE if i == 0 else f"encoder.layer.{i % 3}.attn" for i in range(len(ops))]
    ops["module_class"] = "Attention"
    ops.to_csv(out / "ops.csv", index=False)
    run = read_run(out)
    to_frame(module_table(run.ops, run.findings)).to_csv(out / "modules.csv", index=False)
    summary = json.loads((out / "summary.json").read_text())
    summary.update(step_time_us_p50=4400.0, step_time_us_max=4700.0, step_time_cv=0.04,
                   noise={"other_cpu_share": 0.02, "verdict": "quiet"},
                   memory={"peak_allocated_bytes": 3 << 20, "peak_op": "aten::addmm",
                           "peak_source_location": f"{HOSTILE_PATH}:364", "peak_module": HOSTILE_MODULE})
    (out / "summary.json").write_text(json.dumps(summary))
    # the timeline cuts names to 120 characters (the hostile kernel's tail with them): hostile ones in full
    timeline = json.loads((out / "timeline.json").read_text())
    timeline["names"][:2] = [HOSTILE_KERNEL, HOSTILE_MODULE]
    (out / "timeline.json").write_text(json.dumps(timeline))
    timing = {"median_ms": 1.0, "p20_ms": 0.9, "p80_ms": 1.2}
    (out / "swap.json").write_text(json.dumps({"format_version": 1, "results": [
        {"label": HOSTILE_KERNEL, "source": "user", "kernels": [], "status": "passed", "message": "",
         "mechanisms": [{"kind": "aten", "description": "aten aten::addmm", "sites": ["aten::addmm"]}],
         "notes": [f"a note about {HOSTILE_PATH}"], "calls": {"swapped": 3, "fallback": 1}, "sites": [],
         "verification": {"passed": True, "tolerance": {}, "checks": []}, "max_abs_err": 1e-6, "max_rel_err": 1e-7,
         "out_of_tolerance": 0.0, "end_to_end": {"original": timing, "swapped": timing, "speedup": 1.0},
         "op_level": [{"site": HOSTILE_MODULE, "kernel": HOSTILE_KERNEL, "call": "[4, 8] float32", "calls_per_step": 3,
                       "original": timing, "swapped": timing, "speedup": 1.7, "suspicious": False,
                       "pct_peak_before": 10.0, "pct_peak_after": 17.0, "bound": "memory"}]},
        {"label": "failing", "source": "user", "kernels": [], "status": "failed", "message": "outputs (seed 0): bad",
         "verification": {"passed": False, "checks": [
             {"check": "outputs", "passed": False, "seed": 0, "max_abs_err": 0.5, "max_rel_err": 0.1,
              "out_of_tolerance": 0.25, "worst": "output", "detail": HOSTILE_KERNEL}]}}]}))
    return out


def plotted_rows(run_dir: Path) -> set[int]:
    """Op rows with a place on a log-log roofline, computed from ops.csv itself."""
    ops = pd.read_csv(run_dir / "ops.csv")
    ok = (ops["flops_per_call"] > 0) & (ops["bytes_per_call"] > 0) & (ops["time_us_total"] > 0)
    return set(ops.index[ok])


def big_run(source: Path, out: Path, rows: int = 2000) -> Path:
    """A run of ~2,000 op rows (the size of a 132k-event trace's table): `source`'s rows repeated at
    other source lines, with other times."""
    run = read_run(source)
    copies = -(-rows // len(run.to_pandas()))
    parts = []
    for k in range(copies):
        ops = run.to_pandas().copy()
        ops["source_location"] = [f"pkg/layer_{k}/block.py:{n}" for n in range(len(ops))]
        ops["time_us_total"] = ops["time_us_total"] * (1 + k / 10)
        parts.append(ops)
    ops = pd.concat(parts, ignore_index=True).sort_values("time_us_total", ascending=False, ignore_index=True)
    ops["time_share"] = ops["time_us_total"] / ops["time_us_total"].sum()
    run.ops = from_frame(ops)
    write_run(run, out, "big", None)
    return out


def synthetic_trace(path: Path, cpu_ops: int = 32_000) -> Path:
    """The ~132k-event trace of benchmarks/analyze_scaling.py (the shared H100 ViT trace replicated, with
    shifted times and fresh ids): 32,000 cpu_ops make 127,010 events."""
    spec = importlib.util.spec_from_file_location("analyze_scaling_bench", REPO / "benchmarks" / "analyze_scaling.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.replicate(cpu_ops, path)
    return path
