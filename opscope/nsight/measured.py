"""Measured numbers next to the modeled ones.

A profiled run knows, for each kernel it recorded, the op row that launched it. The tools see kernels
only. The link is the kernel plan: the device work of the run's first profiled step in launch order,
each with its op row. The kernels a tool measured in one step are aligned to the plan by their function
names, in order (difflib's longest matching blocks: a kernel missing on either side shifts nothing
else), so each measured kernel gets the op row of the planned kernel it lines up with.

Columns this adds to ops.csv:
- Nsight Compute (per call, over the row's kernels in one step, so a row gets them only when every
  kernel of its calls was measured): measured_time_us_per_call, measured_dram_bytes_per_call,
  measured_flops_per_call (CUDA-core FLOPs from the SASS counts: 2 per FMA, 1 per add or multiply, in
  fp16/fp32/fp64; tensor-core work is not in it), measured_tensor_inst_per_call, measured_dram_pct_peak,
  measured_sm_pct_peak (speed of light, time-weighted over the kernels), measured_bytes_ratio (measured
  DRAM bytes / modeled minimum bytes), measured_flops_ratio (measured / modeled FLOPs; empty when the
  kernels used tensor cores), measured_kernels (names, most DRAM traffic first);
- Nsight Systems: nsys_time_us_total (the row's kernel time under nsys, over its steps).
"""

from __future__ import annotations

import difflib
import math
from typing import Any

import numpy as np
import pandas as pd

from opscope.analysis.pipeline import top_ops, union_length
from opscope.capture.options import STEP_RANGE
from opscope.findings.common import ops_rows_for_events
from opscope.nsight.commands import kernel_base_name, kernel_key
from opscope.nsight.ncu_csv import NcuTable
from opscope.nsight.nsys_sqlite import NsysData, attribute, parse_op_range
from opscope.run.model import Run
from opscope.run.schema import UNATTRIBUTED
from opscope.table import from_frame, nrows, to_frame

MEASURED_COLUMNS = ["measured_time_us_per_call", "measured_dram_bytes_per_call", "measured_flops_per_call",
                    "measured_tensor_inst_per_call", "measured_dram_pct_peak", "measured_sm_pct_peak",
                    "measured_bytes_ratio", "measured_flops_ratio", "measured_kernels"]
PLAN_COLUMNS = ["step", "kind", "name", "base", "row", "main_thread"]
# Per precision: (FMA, add, multiply) SASS thread-instruction counts. FLOPs = 2 x FMA + add + multiply.
FLOP_METRICS = [(f"sm__sass_thread_inst_executed_op_{p}fma_pred_on.sum",
                 f"sm__sass_thread_inst_executed_op_{p}add_pred_on.sum",
                 f"sm__sass_thread_inst_executed_op_{p}mul_pred_on.sum") for p in ("h", "f", "d")]
TIME = "gpu__time_duration.sum"  # ns
DRAM_READ, DRAM_WRITE = "dram__bytes_read.sum", "dram__bytes_write.sum"
TENSOR = "sm__inst_executed_pipe_tensor.sum"
DRAM_SOL = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
SM_SOL = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
_KIND = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}


# --- the plan -----------------------------------------------------------------------------------


def kernel_plan(run: Run) -> pd.DataFrame:
    """The run's device activities in launch order (launching op's start, then the activity's own), with
    their step, kind (kernel/memcpy/memset), name, function name, op row (-1: none) and whether the
    launching thread is the one that ran the steps (the first op's thread; backward runs elsewhere)."""
    if run.events is None or run.kernels is None or not nrows(run.kernels):
        return pd.DataFrame(columns=PLAN_COLUMNS)
    ev, kern = to_frame(run.events), to_frame(run.kernels)
    rows_of = np.asarray(ops_rows_for_events(run.ops, run.events), dtype=np.int64)
    lost = [i for i, op in enumerate(run.ops["op"]) if op == UNATTRIBUTED]
    lost_row = lost[0] if lost else -1
    op = kern["op"].to_numpy()
    launched = op >= 0
    safe = np.where(launched, op, 0)
    ev_ts = ev["ts"].to_numpy()
    first_tid = ev["tid"].to_numpy()[int(np.argmin(ev_ts))] if len(ev) else 0
    plan = pd.DataFrame({
        "step": np.where(launched, ev["step"].to_numpy()[safe], -1),
        "kind": [_KIND.get(c, "kernel") for c in kern["cat"].tolist()],
        "name": kern["name"].tolist(),
        "base": [kernel_base_name(n) for n in kern["name"].tolist()],
        "row": np.where(launched, rows_of[safe], lost_row),
        "main_thread": launched & (ev["tid"].to_numpy()[safe] == first_tid),
        "_t0": np.where(launched, ev_ts[safe], kern["ts"].to_numpy()),
        "_t1": kern["ts"].to_numpy(),
    })
    plan = plan[plan["step"] >= 0].sort_values(["step", "_t0", "_t1"], kind="stable")
    return plan[PLAN_COLUMNS].reset_index(drop=True)


def align(expected: list[str], measured: list[str]) -> list[int]:
    """For each measured kernel name, the index of the expected one it lines up with, or -1. By qualified
    name with template arguments (commands.kernel_key), in order: difflib's longest matching blocks, so a
    kernel missing or extra on either side leaves the rest matched. A gap between two matched blocks that
    is equally long on both sides is paired position by position where the function names agree (two
    profilers spelling a kernel's template arguments differently); any other gap stays unmatched rather
    than guessed."""
    out = [-1] * len(measured)
    matcher = difflib.SequenceMatcher(a=[kernel_key(n) for n in expected], b=[kernel_key(n) for n in measured],
                                      autojunk=False)
    prev_a = prev_b = 0
    for block in matcher.get_matching_blocks():  # ends with a (len(a), len(b), 0) block
        if block.a - prev_a == block.b - prev_b:
            for k in range(block.a - prev_a):
                if kernel_base_name(expected[prev_a + k]) == kernel_base_name(measured[prev_b + k]):
                    out[prev_b + k] = prev_a + k
        for k in range(block.size):
            out[block.b + k] = block.a + k
        prev_a, prev_b = block.a + block.size, block.b + block.size
    return out


def first_step(plan: pd.DataFrame) -> pd.DataFrame:
    return plan[plan["step"] == plan["step"].min()] if len(plan) else plan


def ncu_selection(run: Run, plan: pd.DataFrame, top: int) -> tuple[set[str], int, list[int]]:
    """What `--ncu-top N` measures: the function names of the kernels of the N op rows with the most GPU
    time (launched from the steps' thread, in the first step), how many launches of those names one step
    makes (ncu's -c), and the rows."""
    step = first_step(plan)
    step = step[(step["kind"] == "kernel") & step["main_thread"] & (step["row"] >= 0)]
    rows: list[int] = []
    launching = set(step["row"].tolist())
    for r in range(nrows(run.ops)):  # ops.csv is sorted by time
        if r in launching and run.ops["op"][r] != UNATTRIBUTED:
            rows.append(int(r))
        if len(rows) >= top:
            break
    bases = set(step.loc[step["row"].isin(rows), "base"].tolist())
    count = int(step["base"].isin(bases).sum())
    return bases, count, rows


# --- Nsight Compute -----------------------------------------------------------------------------


def _sum(df: pd.DataFrame, col: str) -> float:
    if col not in df.columns:
        return math.nan
    values = df[col].to_numpy(dtype=float)
    return float(np.nansum(values)) if np.isfinite(values).any() else math.nan


def kernel_flops(df: pd.DataFrame) -> np.ndarray:
    """CUDA-core FLOPs per measured kernel: 2 x FMA + add + multiply, over fp16/fp32/fp64 (NaN when no
    count is known)."""
    total = np.zeros(len(df))
    known = np.zeros(len(df), dtype=bool)
    for fma, add, mul in FLOP_METRICS:
        for col, weight in ((fma, 2.0), (add, 1.0), (mul, 1.0)):
            if col in df.columns:
                v = df[col].to_numpy(dtype=float)
                total += weight * np.nan_to_num(v)
                known |= np.isfinite(v)
    return np.where(known, total, np.nan)


def _weighted(df: pd.DataFrame, col: str) -> float:
    if col not in df.columns:
        return math.nan
    v = df[col].to_numpy(dtype=float)
    w = df[TIME].to_numpy(dtype=float) if TIME in df.columns else np.ones(len(df))
    ok = np.isfinite(v) & np.isfinite(w)
    if not ok.any():
        return math.nan
    return float(np.average(v[ok], weights=w[ok])) if w[ok].sum() > 0 else float(v[ok].mean())


def attach_ncu(run: Run, plan: pd.DataFrame, table: NcuTable, bases: set[str] | None = None) -> dict[str, Any]:
    """Adds the measured_* columns to run.ops (in place) from one step's worth of ncu measurements and
    returns what happened ({"kernels_profiled", "kernels_matched", "rows_measured"}). `bases`: the
    function names opscope asked ncu for (steps' thread only); None for a table recorded elsewhere (all
    planned kernels with a name the table has)."""
    ops = to_frame(run.ops)
    for col in MEASURED_COLUMNS:
        ops[col] = "" if col == "measured_kernels" else np.nan
    meas = table.kernels.copy()
    meas["flops"] = kernel_flops(meas)
    step = first_step(plan).reset_index(drop=True)
    if bases is not None:
        expected = step[(step["kind"] == "kernel") & step["main_thread"] & step["base"].isin(bases)]
    else:
        expected = step[(step["kind"] == "kernel") & step["base"].isin(set(meas["base"].tolist()))]
    match = align(expected["name"].tolist(), meas["kernel"].tolist())
    exp_rows = expected["row"].tolist()
    exp_index = expected.index.tolist()
    meas["row"] = [exp_rows[m] if m >= 0 else -1 for m in match]
    table.kernels = meas  # each measured kernel with its op row, for ncu_kernels.csv
    matched_plan = {exp_index[m] for m in match if m >= 0}
    steps = max(int(run.summary.get("steps") or 1), 1)
    measured_rows = 0
    for r, group in meas[meas["row"] >= 0].groupby("row"):
        planned = step.index[step["row"] == r].tolist()
        if not planned or any(i not in matched_plan for i in planned):
            continue  # some of the row's work was not measured: no per-call numbers for it
        calls = float(ops.at[r, "calls"]) / steps
        if not calls > 0:
            continue
        measured_rows += 1
        nbytes = _sum(group, DRAM_READ) + _sum(group, DRAM_WRITE)
        flops = float(np.nansum(group["flops"])) if np.isfinite(group["flops"]).any() else math.nan
        tensor = _sum(group, TENSOR)
        values = {
            "measured_time_us_per_call": _sum(group, TIME) / 1e3 / calls,
            "measured_dram_bytes_per_call": nbytes / calls,
            "measured_flops_per_call": flops / calls,
            "measured_tensor_inst_per_call": tensor / calls,
            "measured_dram_pct_peak": _weighted(group, DRAM_SOL),
            "measured_sm_pct_peak": _weighted(group, SM_SOL),
        }
        modeled_bytes, modeled_flops = float(ops.at[r, "bytes_per_call"]), float(ops.at[r, "flops_per_call"])
        if modeled_bytes > 0 and math.isfinite(values["measured_dram_bytes_per_call"]):
            values["measured_bytes_ratio"] = values["measured_dram_bytes_per_call"] / modeled_bytes
        if modeled_flops > 0 and math.isfinite(values["measured_flops_per_call"]) and not tensor > 0:
            values["measured_flops_ratio"] = values["measured_flops_per_call"] / modeled_flops
        for col, v in values.items():
            ops.at[r, col] = v
        traffic = sum((group[c].fillna(0.0) for c in (DRAM_READ, DRAM_WRITE) if c in group.columns),
                      pd.Series(0.0, index=group.index))
        order = traffic.groupby(group["kernel"]).sum().sort_values(ascending=False, kind="stable")
        ops.at[r, "measured_kernels"] = ";".join(order.index.tolist())
    run.ops = from_frame(ops)
    return {"kernels_profiled": int(len(meas)), "kernels_matched": int(sum(m >= 0 for m in match)),
            "rows_measured": measured_rows}


def ncu_kernels_table(run: Run, table: NcuTable) -> pd.DataFrame:
    """ncu_kernels.csv: each measured kernel, its derived numbers and the op row attach_ncu matched it to."""
    meas = table.kernels
    rows = [int(r) for r in meas["row"]] if "row" in meas.columns else [-1] * len(meas)

    def col(name: str) -> Any:
        return meas[name].to_numpy(dtype=float) if name in meas.columns else np.nan

    return pd.DataFrame({
        "id": meas["id"], "kernel": meas["kernel"], "ops_row": rows,
        "op": [run.ops["op"][r] if r >= 0 else "" for r in rows],
        "source_location": [run.ops["source_location"][r] if r >= 0 else "" for r in rows],
        "time_us": col(TIME) / 1e3, "dram_bytes": col(DRAM_READ) + col(DRAM_WRITE), "flops": kernel_flops(meas),
        "tensor_inst": col(TENSOR), "dram_pct_peak": col(DRAM_SOL), "sm_pct_peak": col(SM_SOL),
    })


# --- Nsight Systems -----------------------------------------------------------------------------


def attach_nsys(run: Run, plan: pd.DataFrame, data: NsysData) -> tuple[dict[str, Any], pd.DataFrame]:
    """Adds nsys_time_us_total to run.ops (in place); returns the summary's "nsys" object and
    nsys_kernels.csv (device work by kind, name, module, NVTX op and op row)."""
    act = attribute(data)
    ops = to_frame(run.ops)
    ops["nsys_time_us_total"] = np.nan
    act["row"] = -1
    ranges = data.ranges
    steps = ranges[ranges["text"] == STEP_RANGE] if len(ranges) else ranges
    in_steps = act[act["step"] >= 0] if len(steps) else act
    if len(steps):
        step_plan = first_step(plan)
        for _, group in in_steps.groupby("step"):
            group = group.sort_values(["launch", "start"], kind="stable")
            match = align(step_plan["name"].tolist(), group["name"].tolist())
            rows = step_plan["row"].tolist()
            act.loc[group.index, "row"] = [rows[m] if m >= 0 else -1 for m in match]
    else:  # no step ranges: the whole report against every step of the plan
        group = act.sort_values(["launch", "start"], kind="stable")
        match = align(plan["name"].tolist(), group["name"].tolist())
        rows = plan["row"].tolist()
        act.loc[group.index, "row"] = [rows[m] if m >= 0 else -1 for m in match]
    act["dur_us"] = (act["end"] - act["start"]) / 1e3
    counted = act.loc[in_steps.index]
    matched = counted[counted["row"] >= 0]
    ops.loc[:, "nsys_time_us_total"] = 0.0
    for r, t in matched.groupby("row")["dur_us"].sum().items():
        ops.at[int(r), "nsys_time_us_total"] = float(t)
    ops.loc[ops["nsys_time_us_total"] == 0.0, "nsys_time_us_total"] = np.nan
    run.ops = from_frame(ops)
    summary = nsys_summary(data, counted, steps)
    total = float(counted["dur_us"].sum())
    summary["matched_time_share"] = float(matched["dur_us"].sum()) / total if total > 0 else None
    return summary, nsys_kernels(run, counted)


def nsys_summary(data: NsysData, counted: pd.DataFrame, steps: pd.DataFrame) -> dict[str, Any]:
    """Step count and time, GPU busy share, and the device work inside the steps."""
    out: dict[str, Any] = {"steps": int(len(steps)), "gpu": data.gpu_name}
    if len(steps):
        durations = (steps["end"] - steps["start"]).to_numpy() / 1e3
        out["step_time_us"] = float(durations.mean())
        busy = union_length(counted["start"].to_numpy(dtype=float), counted["end"].to_numpy(dtype=float)) / 1e3
        out["device_busy_share"] = float(min(busy / durations.sum(), 1.0)) if durations.sum() > 0 else None
    kinds = counted.groupby("kind")
    for kind in ("kernel", "memcpy", "memset"):
        group = kinds.get_group(kind) if kind in kinds.groups else counted.iloc[:0]
        out[f"{kind}s"] = int(len(group))
        out[f"{kind}_time_us"] = float(group["dur_us"].sum()) if len(group) else 0.0
        if kind != "kernel":
            out[f"{kind}_bytes"] = float(np.nansum(group["bytes"].to_numpy(dtype=float))) if len(group) else 0.0
    return out


def nsys_kernels(run: Run, act: pd.DataFrame) -> pd.DataFrame:
    """nsys_kernels.csv: the steps' device work summed by (kind, name, module, NVTX op, op row)."""
    act = act.assign(nvtx_op=[(parse_op_range(t) or ("",))[0] for t in act["op_range"].tolist()])
    grouped = act.groupby(["kind", "name", "module", "nvtx_op", "row"], sort=False, dropna=False).agg(
        calls=("dur_us", "size"), time_us_total=("dur_us", "sum"),
        bytes_total=("bytes", lambda b: b.sum(min_count=1))).reset_index()
    grouped["op"] = [run.ops["op"][r] if r >= 0 else "" for r in grouped["row"].tolist()]
    grouped["source_location"] = [run.ops["source_location"][r] if r >= 0 else "" for r in grouped["row"].tolist()]
    grouped = grouped.rename(columns={"row": "ops_row"})
    columns = ["kind", "name", "module", "nvtx_op", "ops_row", "op", "source_location", "calls", "time_us_total",
               "bytes_total"]
    return grouped[columns].sort_values("time_us_total", ascending=False, kind="stable").reset_index(drop=True)


# --- after attaching ------------------------------------------------------------------------------


def add_measured_findings(run: Run) -> None:
    """Runs the rules that read measurements (excess-traffic) on run.ops and refreshes what the summary
    derives from the table and the findings. The other rules ran when the run was analyzed."""
    from opscope.findings import Context, run_rules
    from opscope.machine.peaks import Peaks

    ctx = Context(ops=run.ops, events={}, peaks=Peaks.from_json(run.meta.get("peaks") or {}), gpu=True,
                  source=str(run.meta.get("source", "trace")), steps=max(int(run.summary.get("steps") or 1), 1),
                  step_time_us=float(run.summary.get("step_time_us") or 0.0), meta=run.meta)
    found = run.findings + run_rules(ctx, only=["excess-traffic"])
    found.sort(key=lambda f: (f.get("est_savings_us") is None, -(f.get("est_savings_us") or 0.0)))
    run.findings = found
    run.summary["findings"] = len(found)
    run.summary["top_ops"] = top_ops(run.ops, 10)
