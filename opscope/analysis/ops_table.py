"""The per-op table (ops.csv): events grouped by (op, inputs, source line, module), with FLOPs, bytes and
the roofline columns.

Cost attribution follows the contract's "no double counting" rule in two layers: the cost model marks
ops that always delegate (aten::linear, aten::conv2d, ...) as composites, and here, in the call tree,
any op whose descendant does the same family of work (e.g. aten::clone over aten::copy_, the outer
aten::sum over the inner one) is treated as a composite too.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from opscope.analysis.events import is_row_name
from opscope.analysis.gpu_timeline import Windows, time_inside
from opscope.costmodel import Cost, OpCall, UnreadableCall, estimate, floating_dtype
from opscope.costmodel.base import BIAS_COPIED_BY_CHILD, DELEGATES_TO_ANY_CHILD, DTYPE_NAMES
from opscope.machine.peaks import Peaks, ceiling_key
from opscope.run.schema import (
    BACKLOG,
    BACKLOG_NOTE,
    GPU_ONLY_NOTE,
    GRAPH_KERNEL_NOTE,
    LOOSE_KERNEL_NOTE,
    UNATTRIBUTED,
)
from opscope.table import NAN, Table, concat, group_codes, nrows, pairwise_sum, take

# A row is one (op, inputs, source line, module): the same call in two modules (every block's c_attn runs
# the same line of a shared Conv1D) is two rows.
KEY = ["op", "input_dims", "input_dtypes", "input_strides", "concrete_inputs", "source_location", "module"]
CONTRACT_COLUMNS = KEY[:6] + [
    "calls", "time_us_total", "time_share", "flops_per_call", "bytes_per_call", "arithmetic_intensity",
    "achieved_gflops", "achieved_gbps", "pct_peak_flops", "pct_peak_bandwidth", "bound",
]
GPU_COLUMNS = ["cpu_time_us_total", "kernels"]
EXTRA_COLUMNS = ["family", "dtype", "ceiling", "time_us_per_call", "note", "compiled_graph"]
# GPU runs, after EXTRA_COLUMNS: the kernel family with most of the row's kernel time
# (opscope.trace.kernel_names), and for kernel rows the op/annotation that launched them.
GPU_EXTRA_COLUMNS = ["kernel_family", "launcher"]
MODULE_COLUMNS = ["module", "module_class"]  # after the columns above, so their order stays the contract's
JSON_TEXT_COLUMNS = ["input_dims", "input_dtypes", "input_strides", "concrete_inputs"]
BOUNDS = ("memory", "compute", "overhead", "unknown")

# An op whose work would take under this long at the machine's peaks cannot be limited by that work:
# per-op dispatch (CPU, a few µs) or kernel launch latency (GPU) dominates. See docs/reference/reading.md.
OVERHEAD_IDEAL_US = 1.0


def event_costs(ev: Table) -> Table:
    """Per event: flops, bytes, family, note after composite resolution (NaN flops/bytes = unknown)."""
    n = nrows(ev)
    flops = [NAN] * n
    nbytes = [NAN] * n
    family = [""] * n
    note = [""] * n
    dtype = [""] * n
    # inputs -> cost, dtype, flops, bytes: one float object per distinct call, not per event
    cache: dict[tuple[str, str, str, str, str], tuple[Cost | None, str, float, float]] = {}
    list_dtype = dominant_float_type(ev)
    names = ev["name"]
    # TensorList element dtypes seen by `profile`'s dispatch pass, where it ran (events.py)
    seen = ev["dispatch_input_types"] if "dispatch_input_types" in ev else [""] * n
    cols = zip(names, ev["input_dims"], ev["input_dtypes"], ev["input_strides"], ev["concrete_inputs"], ev["is_row"],
               seen, strict=True)
    for i, (name, dims, types, strides, concrete, row, seen_types) in enumerate(cols):
        if not row:
            continue
        types = seen_types or types
        key = (name, dims, types, strides, concrete)
        hit = cache.get(key)
        if hit is None:
            try:
                call = OpCall.from_json_text(name, dims, types, strides, concrete, list_dtype)
            except UnreadableCall:  # an input column that is not a JSON list: no cost, no dtype
                hit = (None, "", NAN, NAN)
            else:  # estimate() itself gives None for inputs no cost function can read; a bug raises
                c = estimate(call)
                hit = (c, floating_dtype(call) or "", float(c.flops) if c is not None else NAN,
                       float(c.bytes) if c is not None else NAN)
            cache[key] = hit
        cost, dt, f, b = hit
        dtype[i] = dt
        if cost is not None:
            flops[i], nbytes[i], family[i], note[i] = f, b, cost.family, cost.note

    # A row ancestor doing the same family of work as a descendant with real work only dispatches.
    # So does an op that runs its work as child ops of other families on this backend.
    row_parent = ev["row_parent"]
    delegates = [False] * n
    for i in range(n):
        if not (flops[i] > 0 or nbytes[i] > 0):
            continue
        fam = family[i]
        a = row_parent[i]
        while a >= 0:
            if family[a] == fam or names[a] in DELEGATES_TO_ANY_CHILD:
                delegates[a] = True
            a = row_parent[a]
    for i in range(n):
        if delegates[i]:
            flops[i], nbytes[i], family[i] = 0.0, 0.0, "composite"

    # An op whose bias a child aten::copy_ wrote into its output (CPU addmm): the child counts the bias
    # read and the output write, the op what is left (BIAS_COPIED_BY_CHILD).
    parents_of_copies = {row_parent[j] for j in range(n) if names[j] == "aten::copy_" and row_parent[j] >= 0}
    for i in sorted(parents_of_copies):
        if names[i] in BIAS_COPIED_BY_CHILD and not delegates[i] and family[i] == "matmul":
            call = OpCall.from_json_text(names[i], ev["input_dims"][i], ev["input_dtypes"][i], ev["input_strides"][i],
                                         ev["concrete_inputs"][i])
            cost = estimate(call, bias_copied_by_child=True)
            if cost is not None:
                flops[i], nbytes[i], note[i] = float(cost.flops), float(cost.bytes), cost.note
    return {"flops": flops, "bytes": nbytes, "family": family, "note": note, "dtype": dtype}


def dominant_float_type(ev: Table) -> str:
    """The most common floating "Input type" among row ops: the guess for TensorList elements whose dtype
    neither the trace nor the dispatch pass recorded (the cost's note says so)."""
    texts: dict[str, int] = {}
    for text, row in zip(ev["input_dtypes"], ev["is_row"], strict=True):
        if row and text == text:
            texts[text] = texts.get(text, 0) + 1
    counts: dict[str, int] = {}
    # most frequent text first (pandas' value_counts order, which the tie between dtypes below follows)
    for text, k in sorted(texts.items(), key=lambda tk: -tk[1]):
        try:
            types = json.loads(text) if text else []
        except ValueError:
            continue
        first = next((t for t in types if isinstance(t, str) and t in DTYPE_NAMES), None)
        if first:
            counts[first] = counts.get(first, 0) + k
    return max(counts, key=counts.__getitem__) if counts else ""


# The columns of ev that make the ops table (the others stay behind).
_ROW_COLUMNS = ["name", *KEY[1:], "module_class", "row_kind", "kernel_num_gb", "kernel_flop", "flops", "bytes",
                "family", "note", "dtype", "self_us", "device_us", "ts", "kernels", "compiled_graph"]


def build_ops_table(ev: Table, *, gpu: bool, peaks: Peaks, kernels: Table | None = None,
                    windows: Windows | None = None) -> Table:
    """Groups row events into ops.csv rows and adds the cost and roofline columns. `windows`: the profiled
    steps (opscope.analysis.gpu_timeline.step_windows), to which kernels launched before the trace are
    clipped."""
    if "flops" not in ev:
        ev = {**ev, **event_costs(ev)}
    row_events = [i for i, r in enumerate(ev["is_row"]) if r]
    row_columns = {c: ev[c] for c in _ROW_COLUMNS if c in ev}
    # every event a row (an eager trace without folded children): the event columns as they are, not a
    # copy of them all; _compiled_costs copies what it changes
    rows = row_columns if len(row_events) == nrows(ev) else take(row_columns, row_events)
    rows["op"] = rows["name"]
    for col in MODULE_COLUMNS:
        if col not in rows:
            rows[col] = [""] * len(row_events)
    _compiled_costs(rows)
    rows["time"] = rows["device_us"] if gpu else rows["self_us"]
    codes = group_codes([rows[k] for k in KEY])
    table = _aggregate(rows, codes)
    kern = kernels if gpu and kernels is not None and nrows(kernels) else None
    if kern is not None:
        n = nrows(table)
        table["kernel_family"] = _row_families(kern, codes, row_events, n)
        table["launcher"] = [""] * n
        _custom_op_families(table)
        kernel_rows = [i for i, k in enumerate(kern["kernel_row"]) if k]
        extra = [_kernel_rows(take(kern, kernel_rows)), _unattributed_row(kern), _backlog_row(kern, windows)]
        parts = [table] + [x for x in extra if x is not None and nrows(x)]
        # a column the kernel rows lack (module_class) is missing there, as pandas' concat left it
        table = concat(parts, list(dict.fromkeys(c for t in parts for c in t)), fill=lambda c: NAN)
    times = table["time_us_total"]
    total = pairwise_sum(times)
    table["time_share"] = [t / total for t in times] if total > 0 else [0.0] * len(times)
    table = add_roofline(table, peaks, gpu=gpu)
    order = sorted(range(len(times)), key=lambda i: (descending_key(table["time_us_total"][i]),
                                                     ascending_key(table["first_ts"][i])))
    columns = CONTRACT_COLUMNS + (GPU_COLUMNS if gpu else []) + EXTRA_COLUMNS
    n = nrows(table)
    if gpu:
        for col in GPU_EXTRA_COLUMNS:
            if col not in table:
                table[col] = [""] * n
        columns += GPU_EXTRA_COLUMNS
    for col in MODULE_COLUMNS:
        table[col] = [v if v == v else "" for v in table[col]] if col in table else [""] * n
    columns += MODULE_COLUMNS
    return take({c: table[c] for c in columns}, order)


def descending_key(x: float) -> tuple[bool, float]:
    """Sort key of a number sorted largest first, NaN last (pandas' sort_values)."""
    return (True, 0.0) if x != x else (False, -x)


def ascending_key(x: float) -> tuple[bool, float]:
    """Sort key of a number sorted smallest first, NaN last (numpy's and pandas' sorts)."""
    return (True, 0.0) if x != x else (False, x)


def first_index(codes: Sequence[int], n_groups: int, valid: Sequence[bool] | None = None) -> list[int]:
    """Per group, the first row (of the `valid` ones); len(codes) where there is none."""
    first = [len(codes)] * n_groups
    for i in range(len(codes) - 1, -1, -1):
        if valid is None or valid[i]:
            first[codes[i]] = i
    return first


def sum_by_group(codes: Sequence[int], values: Sequence[float], n_groups: int) -> list[float]:
    """Per group, its rows' values added in row order (as np.bincount adds them)."""
    out = [0.0] * n_groups
    for g, v in zip(codes, values, strict=True):
        out[g] += v
    return out


def count_by_group(codes: Sequence[int], n_groups: int) -> list[int]:
    out = [0] * n_groups
    for g in codes:
        out[g] += 1
    return out


def _min_by_group(codes: Sequence[int], values: Sequence[float], n_groups: int) -> list[float]:
    out = [math.inf] * n_groups
    for g, v in zip(codes, values, strict=True):
        if v < out[g] or v != v:
            out[g] = v
    return out


def _aggregate(rows: Table, codes: list[int]) -> Table:
    """One row per group: sums, the first value (pandas' "first": first non-missing), the union of
    kernel names and compiled graphs, the earliest start."""
    g = max(codes) + 1 if codes else 0
    first = first_index(codes, g)
    out: Table = {k: [rows[k][i] for i in first] for k in KEY}
    out["calls"] = count_by_group(codes, g)
    out["time_us_total"] = sum_by_group(codes, [float(t) for t in rows["time"]], g)
    out["cpu_time_us_total"] = sum_by_group(codes, [float(t) for t in rows["self_us"]], g)
    for src, dst in (("flops", "flops_per_call"), ("bytes", "bytes_per_call")):
        values = rows[src]
        f = first_index(codes, g, [v == v for v in values])
        out[dst] = [values[i] if i < len(values) else NAN for i in f]
    for col in ("family", "dtype", "note", "module_class"):
        out[col] = [rows[col][i] for i in first]
    for col in ("kernels", "compiled_graph"):
        out[col] = _join_unique_by_group(rows[col], codes, g)
    out["first_ts"] = _min_by_group(codes, [float(t) for t in rows["ts"]], g)
    return out


def _join_unique_by_group(values: Sequence[Any], codes: Sequence[int], n_groups: int) -> list[str]:
    """Per group, the distinct `;`-separated names of its rows, in order of appearance."""
    seen: list[dict[str, None]] = [{} for _ in range(n_groups)]
    for v, g in zip(values, codes, strict=True):
        if v != "" and isinstance(v, str):
            for k in v.split(";"):
                seen[g][k] = None
    return [";".join(d) for d in seen]


def _dominant(times: dict[str, float]) -> str:
    return max(times, key=times.__getitem__) if times else ""


def _row_families(kern: Table, group_of_row: Sequence[int], row_events: Sequence[int], n_groups: int) -> list[str]:
    """Per op row (group), the kernel family with the most of its kernels' time."""
    group_of_event = dict(zip(row_events, group_of_row, strict=True))
    times: list[dict[str, float]] = [{} for _ in range(n_groups)]
    for op, fam, dur in zip(kern["op"], kern["family"], kern["dur"], strict=True):
        if op < 0:
            continue
        g = group_of_event.get(op, -1)
        if g >= 0:
            times[g][fam] = times[g].get(fam, 0.0) + dur
    return [_dominant(t) for t in times]


# Custom ops (`vllm::unified_attention_with_output`, not aten) without a cost function take their cost
# family from their kernels where it decides the ceiling: attention and GEMM run on tensor cores.
KERNEL_TO_COST_FAMILY = {"attention": "attention", "gemm": "matmul"}
CUSTOM_OP_NOTE = "custom op: family from its kernels; no cost model for it"


def _custom_op_families(table: Table) -> None:
    cols = zip(table["op"], table["kernel_family"], table["flops_per_call"], strict=True)
    for i, (op, fam, flops) in enumerate(cols):
        op = str(op)
        if fam in KERNEL_TO_COST_FAMILY and flops != flops and not op.startswith("aten::") and is_row_name(op):
            table["family"][i] = KERNEL_TO_COST_FAMILY[fam]
            table["note"][i] = CUSTOM_OP_NOTE


def _kernel_rows(kern: Table) -> Table | None:
    """One row per (launcher, kernel name, launcher's source location): kernels no op row launched."""
    n = nrows(kern)
    if not n:
        return None
    codes = group_codes([kern[k] for k in ("launcher", "name", "launcher_loc")])
    g = max(codes) + 1
    first = first_index(codes, g)
    first_ts = _min_by_group(codes, [float(t) for t in kern["ts"]], g)
    graph = [-1] * g
    for c, launch in zip(codes, kern["graph_launch"], strict=True):
        graph[c] = max(graph[c], launch)
    gpu_only = "launcher_op" in kern and all(x == "" for x in kern["launcher"]) and all(x < 0 for x in kern["launcher_op"])
    names = [kern["name"][i] for i in first]
    out: Table = {k: [""] * g for k in KEY}
    out["op"] = names
    out["source_location"] = [kern["launcher_loc"][i] for i in first]
    out["launcher"] = [kern["launcher"][i] for i in first]
    out["calls"] = count_by_group(codes, g)
    out["time_us_total"] = sum_by_group(codes, [float(d) for d in kern["dur"]], g)
    out["cpu_time_us_total"] = [0.0] * g
    out["flops_per_call"] = [NAN] * g
    out["bytes_per_call"] = [NAN] * g
    out["family"] = [""] * g
    out["dtype"] = [""] * g
    loose = GPU_ONLY_NOTE if gpu_only else LOOSE_KERNEL_NOTE
    out["note"] = [GRAPH_KERNEL_NOTE if x >= 0 else loose for x in graph]
    out["kernels"] = list(names)
    out["compiled_graph"] = [""] * g
    out["first_ts"] = first_ts
    out["kernel_family"] = [kern["family"][i] for i in first]
    return out


def _unattributed_row(kern: Table) -> Table | None:
    backlog = kern.get("backlog") or [False] * nrows(kern)
    lost = [i for i, (op, row, b) in enumerate(zip(kern["op"], kern["kernel_row"], backlog, strict=True))
            if op < 0 and not row and not b]
    if not lost:
        return None
    times: dict[str, float] = {}
    for i in lost:
        fam = kern["family"][i]
        times[fam] = times.get(fam, 0.0) + kern["dur"][i]
    extra: dict[str, Any] = {k: "" for k in KEY}
    extra.update(op=UNATTRIBUTED, calls=len(lost), time_us_total=pairwise_sum([kern["dur"][i] for i in lost]),
                 cpu_time_us_total=0.0, flops_per_call=NAN, bytes_per_call=NAN, family="",
                 dtype="", note="", compiled_graph="", launcher="", kernel_family=_dominant(times),
                 kernels=";".join(dict.fromkeys(kern["name"][i] for i in lost)),
                 first_ts=_nanmin(float(kern["ts"][i]) for i in lost))
    return {k: [v] for k, v in extra.items()}


def _backlog_row(kern: Table, windows: Windows | None) -> Table | None:
    """One row for the kernels launched before the trace started (opscope.analysis.events): their calls,
    and only their time inside the profiled steps (the rest ran before the steps began)."""
    late = [i for i, b in enumerate(kern.get("backlog") or []) if b]
    if not late:
        return None
    start = [float(kern["ts"][i]) for i in late]
    times: dict[str, float] = {}
    for i in late:
        fam = kern["family"][i]
        times[fam] = times.get(fam, 0.0) + kern["dur"][i]
    extra: dict[str, Any] = {k: "" for k in KEY}
    extra.update(op=BACKLOG, calls=len(late),
                 time_us_total=pairwise_sum(time_inside(start, [kern["dur"][i] for i in late], windows)),
                 cpu_time_us_total=0.0, flops_per_call=NAN, bytes_per_call=NAN, family="",
                 dtype="", note=BACKLOG_NOTE, compiled_graph="", launcher="", kernel_family=_dominant(times),
                 kernels=";".join(dict.fromkeys(kern["name"][i] for i in late)), first_ts=_nanmin(start))
    return {k: [v] for k, v in extra.items()}


def _nanmin(values: Any) -> float:
    """The smallest non-NaN value (pandas' min), NaN if none."""
    return min((v for v in values if v == v), default=NAN)


GRAPH_NOTE = "compiled code: time inside it outside the rows below it; no cost model"
KERNEL_NOTE = "inductor kernel: the trace records no cost for it"


def _compiled_costs(rows: Table) -> None:
    """torch.compile rows (docs/reference/run-format.md, ops.csv `op`): regions and graphs have no cost; an inductor kernel
    keeps the cost opscope.analysis.compiled gave it, else the one inductor estimated when the trace records it
    (kernel_flop, kernel_num_gb), else none."""
    kinds = rows["row_kind"]
    compiled = [i for i, kind in enumerate(kinds) if kind in ("graph", "kernel")]
    if not compiled:
        return
    for col in ("flops", "bytes", "family", "note"):
        rows[col] = list(rows[col])  # the event table's own columns are never changed in place
    flops, nbytes, family, note = rows["flops"], rows["bytes"], rows["family"], rows["note"]
    has_estimates = "kernel_num_gb" in rows
    for i in compiled:
        if flops[i] == flops[i] or nbytes[i] == nbytes[i]:
            continue  # costed by opscope.analysis.compiled
        flops[i], nbytes[i], family[i] = NAN, NAN, ""
        note[i] = GRAPH_NOTE if kinds[i] == "graph" else (note[i] if note[i] else KERNEL_NOTE)
        if not has_estimates or kinds[i] != "kernel":
            continue
        # inductor reports 0 where it has no estimate (its FLOP count covers matmul-like nodes only)
        gb, flop = float(rows["kernel_num_gb"][i]), float(rows["kernel_flop"][i])
        if not gb > 0:
            continue
        nbytes[i] = gb * 1e9
        if flop > 0:
            flops[i] = flop
            family[i] = "matmul" if rows["name"][i].startswith("triton_tem_") else "compiled"
            note[i] = "inductor kernel: FLOPs and bytes as inductor estimated them"
        else:
            note[i] = "inductor kernel: bytes as inductor estimated them; FLOPs unknown"


ROOFLINE_COLUMNS = ["time_us_per_call", "arithmetic_intensity", "achieved_gflops", "achieved_gbps",
                    "pct_peak_flops", "pct_peak_bandwidth", "ceiling", "bound"]


def add_roofline(table: Table, peaks: Peaks, *, gpu: bool) -> Table:
    """A new table: `table` with the arithmetic intensity, achieved rates, % of the applicable peaks and
    the bound class per row (roofline_columns)."""
    return {**table, **roofline_columns(table, peaks)}


def roofline_columns(table: Table, peaks: Peaks) -> Table:
    """The columns add_roofline adds (ROOFLINE_COLUMNS), from calls, time_us_total, flops_per_call,
    bytes_per_call, family, dtype and (if there) kernels."""
    bw = peaks.memory_bandwidth_gbps
    bw_div = bw if bw else NAN
    out: Table = {c: [] for c in ROOFLINE_COLUMNS}
    kernels = table["kernels"] if "kernels" in table else [""] * nrows(table)  # CPU: no kernel names
    ceilings: dict[tuple[str, str, str], tuple[str, float | None]] = {}  # (family, dtype, kernels) -> ceiling, its peak
    cols = zip(table["calls"], table["time_us_total"], table["flops_per_call"], table["bytes_per_call"],
               table["family"], table["dtype"], kernels, strict=True)
    for calls, time_total, f, b, fam, dt, kern in cols:
        calls, time_total, f, b = float(calls), float(time_total), float(f), float(b)
        per_call = time_total / calls if calls > 0 else NAN
        timed = per_call > 0
        gflops = f / per_call / 1e3 if timed and f == f else NAN
        gbps = b / per_call / 1e3 if timed and b == b else NAN
        hit = ceilings.get((fam, dt, kern))
        if hit is None:
            key = ceiling_key(fam or "", dt or None, kern or "") if fam else ""
            hit = ceilings[(fam, dt, kern)] = (key, peaks.flops_for(key) if key else None)
        key, pf = hit
        out["time_us_per_call"].append(per_call)
        out["arithmetic_intensity"].append(f / b if b > 0 else NAN)
        out["achieved_gflops"].append(gflops)
        out["achieved_gbps"].append(gbps)
        out["pct_peak_flops"].append(gflops / (pf if pf else NAN) * 100.0)
        out["pct_peak_bandwidth"].append(gbps / bw_div * 100.0)
        out["ceiling"].append(key)
        out["bound"].append(classify_bound(f, b, fam, pf, bw))
    return out


def classify_bound(flops: float, nbytes: float, family: str, peak_gflops: float | None,
                   peak_gbps: float | None) -> str:
    """memory / compute / overhead / unknown for one op (see docs/reference/reading.md)."""
    if family == "" or flops is None or nbytes is None or math.isnan(flops) or math.isnan(nbytes):
        return "unknown"
    if flops == 0 and nbytes == 0:
        return "overhead"
    if not peak_gflops or not peak_gbps:
        return "unknown"
    ideal_us = max(flops / (peak_gflops * 1e3), nbytes / (peak_gbps * 1e3))
    if ideal_us < OVERHEAD_IDEAL_US:
        return "overhead"
    ridge = peak_gflops / peak_gbps  # FLOP per byte where the roofline bends
    if nbytes == 0 or flops / nbytes > ridge:
        return "compute"
    return "memory"
