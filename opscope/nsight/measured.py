"""Measured numbers next to the modeled ones.

A profiled run knows, for each kernel it recorded, the op row that launched it. The tools see kernels
only. The link is the kernel plan: the device work of the run's first profiled step in launch order,
each with its op row. The kernels a tool measured in one step are aligned to the plan by their function
names, in order (align: a kernel missing on either side shifts nothing else), so each measured kernel
gets the op row of the planned kernel it lines up with.

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

import bisect
import math
import sys
from collections.abc import Sequence
from typing import Any

from opscope.analysis.pipeline import top_ops, union_length
from opscope.capture.options import STEP_RANGE
from opscope.findings.tree import ops_rows_for_events
from opscope.nsight.commands import kernel_base_name, kernel_key
from opscope.nsight.ncu_csv import NcuTable
from opscope.nsight.nsys_sqlite import NsysData, attribute, parse_op_range
from opscope.run.model import Run
from opscope.run.schema import UNATTRIBUTED
from opscope.table import NAN, Table, empty, factorize, group_sums, largest_first, nrows, pairwise_sum, take

MEASURED_COLUMNS = ["measured_time_us_per_call", "measured_dram_bytes_per_call", "measured_flops_per_call",
                    "measured_tensor_inst_per_call", "measured_dram_pct_peak", "measured_sm_pct_peak",
                    "measured_bytes_ratio", "measured_flops_ratio", "measured_kernels"]
PLAN_COLUMNS = ["step", "kind", "name", "base", "row", "main_thread"]
NSYS_KERNELS_COLUMNS = ["kind", "name", "module", "nvtx_op", "ops_row", "op", "source_location", "calls",
                        "time_us_total", "bytes_total"]
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
_FLOAT_MAX = sys.float_info.max


def _nan_last(x: float) -> tuple[bool, float]:
    """A sort key putting NaN after every number, as pandas' sort_values does."""
    return (True, 0.0) if x != x else (False, x)


# --- the plan -----------------------------------------------------------------------------------


def kernel_plan(run: Run) -> Table:
    """The run's device activities in launch order (launching op's start, then the activity's own), with
    their step, kind (kernel/memcpy/memset), name, function name, op row (-1: none) and whether the
    launching thread is the one that ran the steps (the first op's thread; backward runs elsewhere)."""
    ev, kern = run.events, run.kernels
    if ev is None or kern is None or not nrows(kern):
        return empty(PLAN_COLUMNS)
    rows_of = ops_rows_for_events(run.ops, ev)
    lost = [i for i, op in enumerate(run.ops["op"]) if op == UNATTRIBUTED]
    lost_row = lost[0] if lost else -1
    ev_ts, ev_tid, ev_step = ev["ts"], ev["tid"], ev["step"]
    first_tid = ev_tid[_argmin(ev_ts)] if ev_ts else 0
    entries = []
    for op, cat, name, ts in zip(kern["op"], kern["cat"], kern["name"], kern["ts"], strict=True):
        launched = op >= 0
        step = ev_step[op] if launched else -1
        if step < 0:
            continue
        t0 = float(ev_ts[op]) if launched else float(ts)
        entries.append(((step, _nan_last(t0), _nan_last(float(ts))),
                        (step, _KIND.get(cat, "kernel"), name, kernel_base_name(name),
                         rows_of[op] if launched else lost_row, launched and ev_tid[op] == first_tid)))
    entries.sort(key=lambda e: e[0])  # stable: activities launched at the same time keep their order
    return {c: [e[1][k] for e in entries] for k, c in enumerate(PLAN_COLUMNS)}


def _argmin(values: Sequence[float]) -> int:
    """numpy's argmin: the first NaN if there is one, else the first smallest value."""
    for i, v in enumerate(values):
        if v != v:
            return i
    return min(range(len(values)), key=values.__getitem__)


def align(expected: list[str], measured: list[str]) -> list[int]:
    """For each measured kernel name, the index of the expected one it lines up with, or -1. By qualified
    name with template arguments (commands.kernel_key), in order, so a kernel missing or extra on either
    side leaves the rest matched (matched_pairs). A gap between two matched kernels that is equally long
    on both sides is paired position by position where the function names agree (two profilers spelling
    a kernel's template arguments differently); any other gap stays unmatched rather than guessed."""
    out = [-1] * len(measured)
    pairs = matched_pairs([kernel_key(n) for n in expected], [kernel_key(n) for n in measured])
    prev_a = prev_b = 0
    for i, j in [*pairs, (len(expected), len(measured))]:
        if i - prev_a == j - prev_b:
            for k in range(i - prev_a):
                if kernel_base_name(expected[prev_a + k]) == kernel_base_name(measured[prev_b + k]):
                    out[prev_b + k] = prev_a + k
        if j < len(measured):
            out[j] = i
        prev_a, prev_b = i + 1, j + 1
    return out


def matched_pairs(a: Sequence[str], b: Sequence[str]) -> list[tuple[int, int]]:
    """The (index in a, index in b) of equal items lined up in order (both indices increasing). Walks
    both sequences in step: equal items are paired; at a difference it skips, on the side where the next
    resynchronization is nearer, to the next occurrence of the other side's current item (items missing
    on one side, or extra on the other), or past both items when neither occurs again. Every step
    advances at least one side and costs a binary search: O((n + m) log n). (difflib's longest matching
    blocks, used before, took 83 s for a step of 34,500 kernels, and on a step repeated with kernels
    dropped and added lined whole stretches up one repeat off: benchmarks/kernel_align.py.)"""
    where_a: dict[str, list[int]] = {}
    where_b: dict[str, list[int]] = {}
    for i, key in enumerate(a):
        where_a.setdefault(key, []).append(i)
    for j, key in enumerate(b):
        where_b.setdefault(key, []).append(j)

    def next_at(where: dict[str, list[int]], key: str, start: int) -> int | None:
        found = where.get(key)
        if not found:
            return None
        k = bisect.bisect_left(found, start)
        return found[k] if k < len(found) else None

    pairs: list[tuple[int, int]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] == b[j]:
            pairs.append((i, j))
            i, j = i + 1, j + 1
            continue
        in_a, in_b = next_at(where_a, b[j], i), next_at(where_b, a[i], j)
        if in_a is not None and (in_b is None or in_a - i <= in_b - j):
            i = in_a  # a's items up to there are missing from b
        elif in_b is not None:
            j = in_b  # b's items up to there are extra
        else:
            i, j = i + 1, j + 1
    return pairs


def first_step(plan: Table) -> Table:
    """The plan's rows of its first step."""
    if not nrows(plan):
        return plan
    first = min(plan["step"])
    return take(plan, [i for i, s in enumerate(plan["step"]) if s == first])


def ncu_selection(run: Run, plan: Table, top: int) -> tuple[set[str], int, list[int]]:
    """What `--ncu-top N` measures: the function names of the kernels of the N op rows with the most GPU
    time (launched from the steps' thread, in the first step), how many launches of those names one step
    makes (ncu's -c), and the rows."""
    step = first_step(plan)
    step = take(step, [i for i, (kind, main, row) in enumerate(zip(step["kind"], step["main_thread"], step["row"],
                                                                   strict=True))
                       if kind == "kernel" and main and row >= 0])
    rows: list[int] = []
    launching = set(step["row"])
    for r in range(nrows(run.ops)):  # ops.csv is sorted by time
        if r in launching and run.ops["op"][r] != UNATTRIBUTED:
            rows.append(r)
        if len(rows) >= top:
            break
    chosen = set(rows)
    bases = {base for base, row in zip(step["base"], step["row"], strict=True) if row in chosen}
    count = sum(base in bases for base in step["base"])
    return bases, count, rows


# --- Nsight Compute -----------------------------------------------------------------------------


def _column(table: Table, col: str, rows: Sequence[int]) -> list[float]:
    values = table[col]
    return [float(values[i]) for i in rows]


def _sum(table: Table, col: str, rows: Sequence[int]) -> float:
    """np.nansum of the column over `rows`; NaN when none of them is finite (or the column is missing)."""
    if col not in table:
        return NAN
    values = _column(table, col, rows)
    return pairwise_sum(values) if any(math.isfinite(v) for v in values) else NAN


def _nan_to_num(x: float) -> float:
    """numpy's nan_to_num: NaN -> 0, infinities -> the largest finite floats."""
    if x != x:
        return 0.0
    if math.isinf(x):
        return _FLOAT_MAX if x > 0 else -_FLOAT_MAX
    return x


def kernel_flops(table: Table) -> list[float]:
    """CUDA-core FLOPs per measured kernel: 2 x FMA + add + multiply, over fp16/fp32/fp64 (NaN when no
    count is known)."""
    n = nrows(table)
    total = [0.0] * n
    known = [False] * n
    for fma, add, mul in FLOP_METRICS:
        for col, weight in ((fma, 2.0), (add, 1.0), (mul, 1.0)):
            if col in table:
                for i, v in enumerate(table[col]):
                    v = float(v)
                    total[i] += weight * _nan_to_num(v)
                    known[i] = known[i] or math.isfinite(v)
    return [t if k else NAN for t, k in zip(total, known, strict=True)]


def _weighted(table: Table, col: str, rows: Sequence[int]) -> float:
    """The time-weighted mean of the column over `rows` (np.average), the plain mean where the times add up
    to nothing; rows whose value or time is not finite are left out."""
    if col not in table:
        return NAN
    values = _column(table, col, rows)
    weights = _column(table, TIME, rows) if TIME in table else [1.0] * len(rows)
    ok = [(v, w) for v, w in zip(values, weights, strict=True) if math.isfinite(v) and math.isfinite(w)]
    if not ok:
        return NAN
    weight = pairwise_sum([w for _, w in ok])
    if weight > 0:
        return pairwise_sum([v * w for v, w in ok]) / weight
    return pairwise_sum([v for v, _ in ok]) / len(ok)


def attach_ncu(run: Run, plan: Table, table: NcuTable, bases: set[str] | None = None) -> dict[str, Any]:
    """Adds the measured_* columns to run.ops (a new ops table) from one step's worth of ncu measurements
    and returns what happened ({"kernels_profiled", "kernels_matched", "rows_measured"}). `bases`: the
    function names opscope asked ncu for (steps' thread only); None for a table recorded elsewhere (all
    planned kernels with a name the table has). The table's kernels get columns flops and row (the op row
    each lined up with, -1: none), for ncu_kernels_table."""
    ops = dict(run.ops)
    n_ops = nrows(ops)
    for col in MEASURED_COLUMNS:
        ops[col] = [""] * n_ops if col == "measured_kernels" else [NAN] * n_ops
    meas = dict(table.kernels)
    meas["flops"] = kernel_flops(meas)
    step = first_step(plan)
    if bases is not None:
        wanted = bases
        expected = [i for i, (kind, main, base) in enumerate(zip(step["kind"], step["main_thread"], step["base"],
                                                                 strict=True))
                    if kind == "kernel" and main and base in wanted]
    else:
        wanted = set(meas["base"])
        expected = [i for i, (kind, base) in enumerate(zip(step["kind"], step["base"], strict=True))
                    if kind == "kernel" and base in wanted]
    match = align([step["name"][i] for i in expected], meas["kernel"])
    meas["row"] = [step["row"][expected[m]] if m >= 0 else -1 for m in match]
    table.kernels = meas
    matched_plan = {expected[m] for m in match if m >= 0}
    steps = max(int(run.summary.get("steps") or 1), 1)
    by_row: dict[int, list[int]] = {}
    for i, r in enumerate(meas["row"]):
        if r >= 0:
            by_row.setdefault(r, []).append(i)
    measured_rows = 0
    for r in sorted(by_row):
        group = by_row[r]
        planned = [i for i, row in enumerate(step["row"]) if row == r]
        if not planned or any(i not in matched_plan for i in planned):
            continue  # some of the row's work was not measured: no per-call numbers for it
        calls = float(ops["calls"][r]) / steps
        if not calls > 0:
            continue
        measured_rows += 1
        nbytes = _sum(meas, DRAM_READ, group) + _sum(meas, DRAM_WRITE, group)
        flops = _sum(meas, "flops", group)
        tensor = _sum(meas, TENSOR, group)
        values = {
            "measured_time_us_per_call": _sum(meas, TIME, group) / 1e3 / calls,
            "measured_dram_bytes_per_call": nbytes / calls,
            "measured_flops_per_call": flops / calls,
            "measured_tensor_inst_per_call": tensor / calls,
            "measured_dram_pct_peak": _weighted(meas, DRAM_SOL, group),
            "measured_sm_pct_peak": _weighted(meas, SM_SOL, group),
        }
        modeled_bytes, modeled_flops = float(ops["bytes_per_call"][r]), float(ops["flops_per_call"][r])
        if modeled_bytes > 0 and math.isfinite(values["measured_dram_bytes_per_call"]):
            values["measured_bytes_ratio"] = values["measured_dram_bytes_per_call"] / modeled_bytes
        if modeled_flops > 0 and math.isfinite(values["measured_flops_per_call"]) and not tensor > 0:
            values["measured_flops_ratio"] = values["measured_flops_per_call"] / modeled_flops
        for col, v in values.items():
            ops[col][r] = v
        traffic = [0.0] * len(group)
        for c in (DRAM_READ, DRAM_WRITE):
            if c in meas:
                traffic = [t + (0.0 if v != v else v) for t, v in zip(traffic, _column(meas, c, group), strict=True)]
        by_traffic = largest_first(group_sums([meas["kernel"][i] for i in group], traffic))
        ops["measured_kernels"][r] = ";".join(name for name, _ in by_traffic)
    run.ops = ops
    return {"kernels_profiled": nrows(meas), "kernels_matched": sum(m >= 0 for m in match),
            "rows_measured": measured_rows}


def ncu_kernels_table(run: Run, table: NcuTable) -> Table:
    """ncu_kernels.csv: each measured kernel, its derived numbers and the op row attach_ncu matched it to."""
    meas = table.kernels
    n = nrows(meas)
    rows = [int(r) for r in meas["row"]] if "row" in meas else [-1] * n

    def col(name: str) -> list[float]:
        return [float(v) for v in meas[name]] if name in meas else [NAN] * n

    return {
        "id": list(meas["id"]), "kernel": list(meas["kernel"]), "ops_row": rows,
        "op": [run.ops["op"][r] if r >= 0 else "" for r in rows],
        "source_location": [run.ops["source_location"][r] if r >= 0 else "" for r in rows],
        "time_us": [t / 1e3 for t in col(TIME)],
        "dram_bytes": [a + b for a, b in zip(col(DRAM_READ), col(DRAM_WRITE), strict=True)],
        "flops": kernel_flops(meas), "tensor_inst": col(TENSOR), "dram_pct_peak": col(DRAM_SOL),
        "sm_pct_peak": col(SM_SOL),
    }


# --- Nsight Systems -----------------------------------------------------------------------------


def attach_nsys(run: Run, plan: Table, data: NsysData) -> tuple[dict[str, Any], Table]:
    """Adds nsys_time_us_total to run.ops (a new ops table); returns the summary's "nsys" object and
    nsys_kernels.csv (device work by kind, name, module, NVTX op and op row)."""
    act = attribute(data)
    n = nrows(act)
    launch, start, names = act["launch"], act["start"], act["name"]
    row = [-1] * n
    steps = take(data.ranges, [i for i, t in enumerate(data.ranges["text"]) if t == STEP_RANGE])  # export order
    in_steps = [i for i, s in enumerate(act["step"]) if s >= 0] if nrows(steps) else list(range(n))

    def line_up(indices: list[int], planned: Table) -> None:
        order = sorted(indices, key=lambda i: (launch[i], start[i]))  # stable: launch order, then start
        planned_rows = planned["row"]
        for i, m in zip(order, align(planned["name"], [names[i] for i in order]), strict=True):
            row[i] = planned_rows[m] if m >= 0 else -1

    if nrows(steps):
        step_plan = first_step(plan)
        by_step: dict[int, list[int]] = {}
        for i in in_steps:
            by_step.setdefault(act["step"][i], []).append(i)
        for s in sorted(by_step):
            line_up(by_step[s], step_plan)
    else:  # no step ranges: the whole report against every step of the plan
        line_up(list(range(n)), plan)
    act["row"] = row
    act["dur_us"] = [(e - s) / 1e3 for s, e in zip(act["start"], act["end"], strict=True)]
    counted = take(act, in_steps)
    matched = [i for i, r in enumerate(counted["row"]) if r >= 0]
    nsys_time = [NAN] * nrows(run.ops)
    per_row = group_sums([counted["row"][i] for i in matched], [counted["dur_us"][i] for i in matched])
    for r, t in per_row.items():
        nsys_time[r] = t if t != 0.0 else NAN  # a row whose kernels took no time was not measured
    run.ops = {**run.ops, "nsys_time_us_total": nsys_time}
    summary = nsys_summary(data, counted, steps)
    total = pairwise_sum(counted["dur_us"])
    summary["matched_time_share"] = pairwise_sum([counted["dur_us"][i] for i in matched]) / total \
        if total > 0 else None
    return summary, nsys_kernels(run, counted)


def nsys_summary(data: NsysData, counted: Table, steps: Table) -> dict[str, Any]:
    """Step count and time, GPU busy share, and the device work inside the steps."""
    out: dict[str, Any] = {"steps": nrows(steps), "gpu": data.gpu_name}
    if nrows(steps):
        durations = [(e - s) / 1e3 for s, e in zip(steps["start"], steps["end"], strict=True)]
        total = pairwise_sum(durations)
        out["step_time_us"] = total / len(durations)
        busy = union_length([float(s) for s in counted["start"]], [float(e) for e in counted["end"]]) / 1e3
        out["device_busy_share"] = min(busy / total, 1.0) if total > 0 else None
    for kind in ("kernel", "memcpy", "memset"):
        rows = [i for i, k in enumerate(counted["kind"]) if k == kind]
        out[f"{kind}s"] = len(rows)
        out[f"{kind}_time_us"] = pairwise_sum([counted["dur_us"][i] for i in rows]) if rows else 0.0
        if kind != "kernel":
            out[f"{kind}_bytes"] = pairwise_sum([counted["bytes"][i] for i in rows]) if rows else 0.0
    return out


def nsys_kernels(run: Run, counted: Table) -> Table:
    """nsys_kernels.csv: the steps' device work summed by (kind, name, module, NVTX op, op row), groups in
    order of first appearance, the most time first."""
    nvtx_op = [(parse_op_range(t) or ("",))[0] for t in counted["op_range"]]
    codes, keys = factorize(zip(counted["kind"], counted["name"], counted["module"], nvtx_op, counted["row"],
                                strict=True))
    members: list[list[int]] = [[] for _ in keys]
    for i, g in enumerate(codes):
        members[g].append(i)
    times = group_sums(codes, counted["dur_us"])  # pandas' groupby sum: its float, to the last bit
    nbytes = counted["bytes"]
    out = empty(NSYS_KERNELS_COLUMNS)
    for g, (kind, name, module, op_name, r) in enumerate(keys):
        group_bytes = [nbytes[i] for i in members[g]]
        out["kind"].append(kind)
        out["name"].append(name)
        out["module"].append(module)
        out["nvtx_op"].append(op_name)
        out["ops_row"].append(r)
        out["op"].append(run.ops["op"][r] if r >= 0 else "")
        out["source_location"].append(run.ops["source_location"][r] if r >= 0 else "")
        out["calls"].append(len(members[g]))
        out["time_us_total"].append(times[g])
        # sum(min_count=1): NaN when no activity of the group has a byte count (kernels)
        out["bytes_total"].append(pairwise_sum(group_bytes) if any(b == b for b in group_bytes) else NAN)
    order = [g for g, _ in largest_first(dict(enumerate(out["time_us_total"])))]
    return take(out, order)


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
