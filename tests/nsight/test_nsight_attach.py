"""Measured next to modeled (opscope.nsight.measured) on the shared H100 BERT-small trace: the kernel plan,
the alignment of measured kernels to op rows, the measured_* columns from an ncu CSV fixture, the
excess-traffic rule on it, and nsys kernel time per op row from an nsys export built from the trace."""

from __future__ import annotations

import copy
import difflib
import json
import math
from collections import Counter

import pandas as pd
import pytest

from conftest import run_cli
from nsight_fixtures import BERT, FIXTURES, RAW, VOCAB, build_nsys_sqlite, gtid
from opscope.analysis.pipeline import analyze
from opscope.analysis.trace_file import trace_device, trace_meta, trace_peaks
from opscope.findings import Context, run_rules
from opscope.findings.excess_traffic import EXCESS_RATIO, MIN_EXCESS_BYTES
from opscope.machine.peaks import Peaks
from opscope.nsight.commands import kernel_key
from opscope.nsight.measured import (
    MEASURED_COLUMNS,
    add_measured_findings,
    align,
    attach_ncu,
    attach_nsys,
    kernel_plan,
    matched_pairs,
    ncu_selection,
)
from opscope.nsight.ncu_csv import read_ncu_csv
from opscope.nsight.nsys_sqlite import read_nsys_sqlite
from opscope.run.model import Run
from opscope.table import Table, from_records, nrows
from opscope.trace.reader import load_trace

DETAILS = FIXTURES / "h100_bert-small_ncu_details.csv"
VOCAB_KERNEL = "cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_bf16_256x128_64x3_tn_align2>"


@pytest.fixture(scope="module")
def analyzed() -> Run:
    trace = load_trace(BERT)
    device = trace_device(trace)
    peaks = trace_peaks(trace, device, None, None, lambda m: None)
    return analyze(trace, peaks=peaks, meta=trace_meta(BERT, trace, device, peaks), source="trace")


@pytest.fixture
def run(analyzed) -> Run:
    fresh = copy.copy(analyzed)
    fresh.ops = {k: list(v) for k, v in analyzed.ops.items()}
    fresh.summary = copy.deepcopy(analyzed.summary)
    fresh.findings = list(analyzed.findings)
    return fresh


def row_at(run: Run, line: str, op: str = "aten::addmm", module: str | None = None) -> int:
    """The one row of `op` at `line` (in the module whose path ends with `module`, where a line runs in many)."""
    hits = run.to_pandas().index[(run.to_pandas()["source_location"] == line) & (run.to_pandas()["op"] == op)
                         & (run.to_pandas()["module"].str.endswith(module) if module else True)]
    assert len(hits) == 1
    return int(hits[0])


def test_kernel_plan(run):
    plan = kernel_plan(run)  # a Table, in launch order
    assert list(plan) == ["step", "kind", "name", "base", "row", "main_thread"]
    assert nrows(plan) == 61 and set(plan["step"]) == {0} and all(plan["main_thread"])
    assert Counter(plan["kind"]) == {"kernel": 60, "memcpy": 1}
    vocab = [name for name, r in zip(plan["name"], plan["row"], strict=True) if r == row_at(run, VOCAB)]
    assert len(vocab) == 1 and vocab[0].startswith("void " + VOCAB_KERNEL)
    # every kernel lands on a row whose kernels column names it
    for name, r in zip(plan["name"], plan["row"], strict=True):
        assert name in run.ops["kernels"][r].split(";")
    # launch order: by the launching op's start, then the kernel's own
    launch = [(run.events["ts"][e], ts) for e, ts in zip(run.kernels["op"], run.kernels["ts"], strict=True)]
    assert plan["name"] == [run.kernels["name"][k] for k in sorted(range(len(launch)), key=launch.__getitem__)]


def test_align():
    assert align(["a", "b<1>", "c", "b<2>", "d"], ["b<2>", "d"]) == [3, 4]
    assert align(["a", "b", "c"], ["a", "x", "c", "y"]) == [0, -1, 2, -1]
    # the same function spelled differently is paired when the gap is equally long on both sides...
    assert align(["a<1>", "f<int,1>(x)", "c<1>"], ["a<1>", "f<(long)1>(y)", "c<1>"]) == [0, 1, 2]
    # ... and left alone (never guessed) when it is not
    assert align(["f<1>", "f<2>", "f<3>", "z"], ["f<(short)9>", "z"]) == [-1, 3]


def test_ncu_selection_takes_the_kernels_of_the_heaviest_rows(run):
    bases, count, rows = ncu_selection(run, kernel_plan(run), 3)
    assert rows == [0, 1, 2] and bases == {"Kernel2", "flash_fwd_kernel"} and count == 26


def test_attach_ncu_raw_fixture(run):
    table = read_ncu_csv(RAW)
    info = attach_ncu(run, kernel_plan(run), table)
    assert info == {"kernels_profiled": 26, "kernels_matched": 26, "rows_measured": 26}
    ops = run.to_pandas()
    assert list(ops.columns[-len(MEASURED_COLUMNS):]) == MEASURED_COLUMNS
    vocab = ops.loc[row_at(run, VOCAB)]
    # the fixture: 0.9 and 0.1 of 3.09 x the modeled bytes, printed in Mbyte (3 decimals) and Kbyte
    assert vocab["measured_dram_bytes_per_call"] == pytest.approx(3.09 * vocab["bytes_per_call"], rel=1e-5)
    assert vocab["measured_bytes_ratio"] == pytest.approx(3.09, rel=1e-5)
    assert vocab["measured_dram_pct_peak"] == 85.2 and vocab["measured_sm_pct_peak"] == 63.5
    assert vocab["measured_kernels"].startswith("void " + VOCAB_KERNEL)
    assert vocab["measured_tensor_inst_per_call"] > 0 and math.isnan(vocab["measured_flops_ratio"])
    assert vocab["measured_flops_per_call"] == 2 * 12_288 + 1_536 + 3_072  # 2 x FMA + add + mul; n/a fp64 = none
    # rows are per module: layer 0's query projection is one call in the step
    qkv = ops.loc[row_at(run, "transformers/models/bert/modeling_bert.py:364",
                         module="BertLayer_0.BertAttention.BertSdpaSelfAttention.Linear_0")]
    assert qkv["calls"] == 1
    # the fixture gave each of the 12 q/k/v kernels 1.05 x their mean time (make_bert_ncu.py ran before rows were
    # split by module, when the 12 were one row)
    qkv_rows = ops[(ops["source_location"] == qkv["source_location"]) & (ops["op"] == "aten::addmm")]
    assert len(qkv_rows) == 12 and (qkv_rows["calls"] == 1).all()
    expected = round(qkv_rows["time_us_per_call"].mean() * 1.05, 2)
    assert qkv_rows["measured_time_us_per_call"].to_numpy() == pytest.approx(expected, abs=0.006)
    flash = ops.loc[row_at(run, "transformers/models/bert/modeling_bert.py:364", "aten::_flash_attention_forward",
                           module="BertLayer_0.BertAttention.BertSdpaSelfAttention")]
    assert flash["measured_flops_ratio"] == pytest.approx(flash["measured_flops_per_call"] / flash["flops_per_call"])
    # a row whose kernels were not measured has no measured numbers
    assert math.isnan(ops.loc[row_at(run, "transformers/models/bert/modeling_bert.py:551",
                                     module="BertLayer_0.BertOutput.Linear"),
                              "measured_dram_bytes_per_call"])
    assert all(r >= 0 for r in table.kernels["row"])


def test_excess_traffic_fires_on_the_fixture_and_names_op_line_and_kernel(run):
    attach_ncu(run, kernel_plan(run), read_ncu_csv(RAW))
    before = len(run.findings)
    add_measured_findings(run)
    found = [f for f in run.findings if f["rule"] == "excess-traffic"]
    assert len(found) == 1 and len(run.findings) == before + 1 == run.summary["findings"]
    f = found[0]
    assert f["op"] == "aten::addmm" and f["source_location"] == VOCAB
    assert VOCAB_KERNEL in f["message"] and "3.1x the modeled minimum" in f["message"]
    vocab = run.to_pandas().loc[row_at(run, VOCAB)]
    expected = vocab["time_us_total"] * (1 - 1 / 3.09)  # DRAM-bound (85% of peak): the extra bytes' time
    assert f["est_savings_us"] == pytest.approx(expected, rel=1e-3)
    savings = [x["est_savings_us"] for x in run.findings if x["est_savings_us"] is not None]
    assert savings == sorted(savings, reverse=True)
    assert "measured_bytes_ratio" in run.summary["top_ops"][1]


def test_excess_traffic_does_not_fire_at_1_1x(run):
    info = attach_ncu(run, kernel_plan(run), read_ncu_csv(DETAILS))  # the first 8 kernels: 1.1x each
    assert info["kernels_matched"] == 8
    add_measured_findings(run)
    assert not [f for f in run.findings if f["rule"] == "excess-traffic"]


def _ctx(rows: list[dict]) -> Context:
    base = {"op": "aten::copy_", "input_dims": "[[1024, 1024]]", "source_location": "m.py:3", "calls": 10,
            "time_us_total": 1000.0, "bytes_per_call": 8 << 20, "measured_kernels": "k1;k2"}
    records = [{**base, **r} for r in rows]
    ops = from_records(records, list(dict.fromkeys(c for r in records for c in r)), fill=math.nan)
    return Context(ops=ops, events={}, peaks=Peaks(3350.0, {"float32": 66900.0}), gpu=True,
                   source="trace", steps=10, step_time_us=100.0)


def test_excess_traffic_thresholds():
    big = 8 << 20
    found = run_rules(_ctx([
        {"measured_dram_bytes_per_call": EXCESS_RATIO * big + 1, "measured_dram_pct_peak": 30.0},  # not DRAM-bound
        {"measured_dram_bytes_per_call": EXCESS_RATIO * big, "measured_dram_pct_peak": 90.0},  # exactly 2x: no
        {"bytes_per_call": 1000, "measured_dram_bytes_per_call": 1000 + MIN_EXCESS_BYTES - 1},  # too few bytes
        {"source_location": "opscope:harness", "measured_dram_bytes_per_call": 5 * big},  # harness: never
        {"measured_dram_bytes_per_call": float("nan")},
    ]), only=["excess-traffic"])
    assert len(found) == 1
    f = found[0]
    assert f["est_savings_us"] is None and f["severity"] == "low" and "not DRAM-bound" in f["message"]
    assert "kernel k1 moved 16 MiB" in f["message"]


def _nsys_from_plan(plan: Table, steps: int) -> dict[str, list[dict]]:
    """An nsys export of `steps` steps replaying the plan: launch j at 1 µs steps, kernel j lasting
    (row + 1) µs; nsys' spelling of template literals ('(int)4')."""
    strings: dict[str, int] = {}

    def sid(text: str) -> int:
        return strings.setdefault(text, len(strings) + 1)

    kernels, runtime, memcpy, nvtx = [], [], [], []
    for s in range(steps):
        t = 10_000_000 * (s + 1)
        nvtx.append({"start": t, "end": t + 5_000_000, "eventType": 59, "textId": sid("opscope_step"),
                     "globalTid": gtid(1), "eventId": len(nvtx) + 1})
        for j, (kind, name, row) in enumerate(zip(plan["kind"], plan["name"], plan["row"], strict=True)):
            corr = 1000 * (s + 1) + j
            start = t + 20_000 + 30_000 * j
            runtime.append({"start": start, "end": start + 2_000, "eventClass": 0, "globalTid": gtid(1),
                            "correlationId": corr, "nameId": sid("cudaLaunchKernel_v7000"), "returnValue": 0})
            act = {"start": start + 5_000, "end": start + 5_000 + 1_000 * (row + 1), "correlationId": corr,
                   "deviceId": 0, "contextId": 1, "streamId": 7, "globalPid": 77 << 24}
            if kind == "memcpy":
                memcpy.append({**act, "bytes": 8, "copyKind": 2, "srcKind": 3, "dstKind": 2})
            else:
                kernels.append({**act, "demangledName": sid(name.replace("<4, ", "<(int)4, ")),
                                "shortName": sid("k")})
    return {"StringIds": [{"id": i, "value": v} for v, i in strings.items()], "CUPTI_ACTIVITY_KIND_KERNEL": kernels,
            "CUPTI_ACTIVITY_KIND_RUNTIME": runtime, "CUPTI_ACTIVITY_KIND_MEMCPY": memcpy, "NVTX_EVENTS": nvtx}


def test_attach_nsys_per_row_kernel_time(run, tmp_path):
    plan = kernel_plan(run)
    data = read_nsys_sqlite(build_nsys_sqlite(tmp_path / "n.sqlite", _nsys_from_plan(plan, 3)))
    summary, kernels = attach_nsys(run, plan, data)
    assert summary["steps"] == 3 and summary["step_time_us"] == 5000.0 and summary["matched_time_share"] == 1.0
    assert summary["kernels"] == 180 and summary["memcpys"] == 3 and summary["memcpy_bytes"] == 24.0
    per_row = Counter(plan["row"])
    for r, n in per_row.items():  # 3 steps of n activities of (row + 1) µs
        assert run.ops["nsys_time_us_total"][r] == pytest.approx(3 * n * (r + 1)), r
    assert all(math.isnan(t) for r, t in enumerate(run.ops["nsys_time_us_total"]) if r not in per_row)
    assert sum(kernels["calls"]) == 183 and all(r >= 0 for r in kernels["ops_row"])
    assert kernels["time_us_total"] == sorted(kernels["time_us_total"], reverse=True)


def test_analyze_trace_with_ncu_cli(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("analyze", str(BERT), "--ncu", str(RAW), "--out", str(out), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["ncu"] == {"csv": RAW.name, "kernels_profiled": 26, "kernels_matched": 26, "rows_measured": 26}
    findings = json.loads((out / "findings.json").read_text())
    excess = [f for f in findings if f["rule"] == "excess-traffic"]
    assert len(excess) == 1 and excess[0]["source_location"] == VOCAB and summary["findings"] == len(findings)
    header = (out / "ops.csv").read_text().splitlines()[0].split(",")
    assert header[-len(MEASURED_COLUMNS):] == MEASURED_COLUMNS
    assert header[:17] == ["op", "input_dims", "input_dtypes", "input_strides", "concrete_inputs", "source_location",
                           "calls", "time_us_total", "time_share", "flops_per_call", "bytes_per_call",
                           "arithmetic_intensity", "achieved_gflops", "achieved_gbps", "pct_peak_flops",
                           "pct_peak_bandwidth", "bound"]
    kernels = pd.read_csv(out / "ncu_kernels.csv", keep_default_na=False)
    assert len(kernels) == 26 and (kernels["ops_row"] >= 0).all()
    assert (out / "trace.json.gz").is_file()
    report = run_cli("report", str(out), "--html", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert "measured (Nsight Compute)" in (out / "report.html").read_text()


def _step_variants(step: list[str], repeats: int) -> dict[str, tuple[list[str], list[str]]]:
    """(expected, measured) keys: the step repeated, measured as recorded, with every 50th kernel dropped,
    with one added every 50, and both (the cases of benchmarks/kernel_align.py)."""
    expected = [kernel_key(n) for n in step * repeats]
    extra = "at::native::unrolled_elementwise_kernel<at::native::FillFunctor<float>>"
    dropped = [n for i, n in enumerate(expected) if i % 50 != 7]
    added = [x for i, n in enumerate(expected) for x in ([n, extra] if i % 50 == 23 else [n])]
    both = [x for i, n in enumerate(expected) if i % 50 != 7 for x in ([n, extra] if i % 50 == 23 else [n])]
    return {"as recorded": (expected, list(expected)), "dropped": (expected, dropped), "added": (expected, added),
            "both": (expected, both)}


def difflib_pairs(a: list[str], b: list[str]) -> list[tuple[int, int]]:
    """What align lined up before: difflib's longest matching blocks."""
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    return [(block.a + k, block.b + k) for block in matcher.get_matching_blocks() for k in range(block.size)]


def test_the_linear_matcher_agrees_with_difflib_on_a_repeated_real_step(run):
    """The real BERT step's kernels repeated 10 times: as recorded and with kernels dropped, the linear
    walk pairs exactly what difflib paired. With kernels added, it matches every planned kernel, where
    difflib's longest-block-first lined whole stretches up one repeat off."""
    step = [n for n, k in zip(kernel_plan(run)["name"], kernel_plan(run)["kind"], strict=True) if k == "kernel"]
    for case, (a, b) in _step_variants(step, 10).items():
        walked, reference = matched_pairs(a, b), difflib_pairs(a, b)
        kept = len(a) - (len(a) // 50 if case in ("dropped", "both") else 0)  # the planned kernels measured
        assert len(walked) == kept and all(a[i] == b[j] for i, j in walked), case
        if case in ("as recorded", "dropped"):
            assert walked == reference, case
        else:
            assert len(reference) < kept, case


def test_a_long_step_is_matched_without_difflib(run, monkeypatch):
    """34,500 kernels (the step 575 times) took 83 s with difflib (quadratic, and worse on repeated names);
    align now walks them in O(n log n). Without timing: difflib is not used, and every planned kernel
    that was measured is matched."""
    monkeypatch.setattr(difflib, "SequenceMatcher", lambda *a, **k: pytest.fail("difflib on a long step"))
    step = [n for n, k in zip(kernel_plan(run)["name"], kernel_plan(run)["kind"], strict=True) if k == "kernel"]
    expected = step * 575
    for case, (a, b) in _step_variants(step, 575).items():
        kept = len(a) - (len(a) // 50 if case in ("dropped", "both") else 0)
        pairs = matched_pairs(a, b)
        assert len(pairs) == kept and all(a[i] == b[j] for i, j in pairs), case
    assert align(expected, list(expected)) == list(range(len(expected)))
