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

import numpy as np
import pandas as pd

from opscope.analysis.events import is_row_name
from opscope.costmodel import Cost, OpCall, estimate, floating_dtype
from opscope.costmodel.base import BIAS_COPIED_BY_CHILD, DELEGATES_TO_ANY_CHILD, DTYPE_NAMES
from opscope.hardware import Peaks, ceiling_key

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
# (opscope.analysis.kernels), and for kernel rows the op/annotation that launched them.
GPU_EXTRA_COLUMNS = ["kernel_family", "launcher"]
MODULE_COLUMNS = ["module", "module_class"]  # after the columns above, so their order stays the contract's
JSON_TEXT_COLUMNS = ["input_dims", "input_dtypes", "input_strides", "concrete_inputs"]
UNATTRIBUTED = "(unattributed kernels)"
BOUNDS = ("memory", "compute", "overhead", "unknown")

# An op whose work would take under this long at the machine's peaks cannot be limited by that work:
# per-op dispatch (CPU, a few µs) or kernel launch latency (GPU) dominates. See README, "bound".
OVERHEAD_IDEAL_US = 1.0


def event_costs(ev: pd.DataFrame) -> pd.DataFrame:
    """Per event: flops, bytes, family, note after composite resolution (NaN flops/bytes = unknown)."""
    n = len(ev)
    flops = np.full(n, np.nan)
    nbytes = np.full(n, np.nan)
    family = [""] * n
    note = [""] * n
    dtype = [""] * n
    cache: dict[tuple, tuple[Cost | None, str]] = {}
    list_dtype = dominant_float_type(ev)
    # TensorList element dtypes seen by `profile`'s dispatch pass, where it ran (events.py)
    seen = ev["dispatch_input_types"].tolist() if "dispatch_input_types" in ev.columns else [""] * n
    cols = zip(ev["name"].tolist(), ev["input_dims"].tolist(), ev["input_dtypes"].tolist(),
               ev["input_strides"].tolist(), ev["concrete_inputs"].tolist(), ev["is_row"].tolist(), seen, strict=True)
    for i, (name, dims, types, strides, concrete, row, seen_types) in enumerate(cols):
        if not row:
            continue
        types = seen_types or types
        key = (name, dims, types, strides, concrete)
        hit = cache.get(key)
        if hit is None:
            try:
                call = OpCall.from_json_text(name, dims, types, strides, concrete, list_dtype)
                hit = (estimate(call), floating_dtype(call) or "")
            except (ValueError, TypeError):  # inputs recorded in a shape no cost function can read
                hit = (None, "")
            cache[key] = hit
        cost, dt = hit
        dtype[i] = dt
        if cost is not None:
            flops[i], nbytes[i], family[i], note[i] = cost.flops, cost.bytes, cost.family, cost.note

    # A row ancestor doing the same family of work as a descendant with real work only dispatches.
    # So does an op that runs its work as child ops of other families on this backend.
    row_parent = ev["row_parent"].to_numpy()
    names = ev["name"].tolist()
    delegates = np.zeros(n, dtype=bool)
    for i in np.flatnonzero((flops > 0) | (nbytes > 0)).tolist():
        fam = family[i]
        a = row_parent[i]
        while a >= 0:
            if family[a] == fam or names[a] in DELEGATES_TO_ANY_CHILD:
                delegates[a] = True
            a = row_parent[a]
    for i in np.flatnonzero(delegates).tolist():
        flops[i], nbytes[i], family[i] = 0.0, 0.0, "composite"

    # An op whose bias a child aten::copy_ wrote into its output (CPU addmm): the child counts the bias
    # read and the output write, the op what is left (BIAS_COPIED_BY_CHILD).
    parents_of_copies = {row_parent[j] for j in np.flatnonzero(ev["name"].to_numpy() == "aten::copy_").tolist()
                         if row_parent[j] >= 0}
    for i in sorted(parents_of_copies):
        if names[i] in BIAS_COPIED_BY_CHILD and not delegates[i] and family[i] == "matmul":
            row = ev.iloc[i]
            call = OpCall.from_json_text(names[i], row["input_dims"], row["input_dtypes"], row["input_strides"],
                                         row["concrete_inputs"])
            cost = estimate(call, bias_copied_by_child=True)
            if cost is not None:
                flops[i], nbytes[i], note[i] = cost.flops, cost.bytes, cost.note
    return pd.DataFrame({"flops": flops, "bytes": nbytes, "family": family, "note": note, "dtype": dtype},
                        index=ev.index)


def dominant_float_type(ev: pd.DataFrame) -> str:
    """The most common floating "Input type" among row ops: the guess for TensorList elements whose dtype
    neither the trace nor the dispatch pass recorded (the cost's note says so)."""
    counts: dict[str, int] = {}
    for text, k in ev.loc[ev["is_row"], "input_dtypes"].value_counts().items():
        try:
            types = json.loads(text) if text else []
        except ValueError:
            continue
        first = next((t for t in types if isinstance(t, str) and t in DTYPE_NAMES), None)
        if first:
            counts[first] = counts.get(first, 0) + int(k)
    return max(counts, key=counts.get) if counts else ""


def build_ops_table(ev: pd.DataFrame, *, gpu: bool, peaks: Peaks, kernels: pd.DataFrame | None = None) -> pd.DataFrame:
    """Groups row events into ops.csv rows and adds the cost and roofline columns."""
    if "flops" not in ev.columns:
        ev = ev.join(event_costs(ev))
    rows = ev[ev["is_row"]].copy()
    rows["op"] = rows["name"]
    for col in MODULE_COLUMNS:
        if col not in rows.columns:
            rows[col] = ""
    _compiled_costs(rows)
    rows["time"] = rows["device_us"] if gpu else rows["self_us"]
    codes = group_codes([rows[k].to_numpy(dtype=object) for k in KEY])
    table = _aggregate(rows, codes)
    kern = kernels if gpu and kernels is not None and len(kernels) else None
    if kern is not None:
        table["kernel_family"] = _row_families(kern, codes, rows.index.to_numpy(), len(table))
        table["launcher"] = ""
        _custom_op_families(table)
        extra = [_kernel_rows(kern[kern["kernel_row"].to_numpy()]), _unattributed_row(kern)]
        table = pd.concat([table] + [x for x in extra if x is not None and len(x)], ignore_index=True)
    total = float(table["time_us_total"].sum())
    table["time_share"] = table["time_us_total"] / total if total > 0 else 0.0
    table = add_roofline(table, peaks, gpu=gpu)
    table = table.sort_values(["time_us_total", "first_ts"], ascending=[False, True], kind="stable")
    columns = CONTRACT_COLUMNS + (GPU_COLUMNS if gpu else []) + EXTRA_COLUMNS
    if gpu:
        for col in GPU_EXTRA_COLUMNS:
            if col not in table.columns:
                table[col] = ""
        columns += GPU_EXTRA_COLUMNS
    for col in MODULE_COLUMNS:
        table[col] = table[col].fillna("") if col in table.columns else ""
    columns += MODULE_COLUMNS
    return table[columns].reset_index(drop=True)


_AGG_COLUMNS = ["calls", "time_us_total", "cpu_time_us_total", "flops_per_call", "bytes_per_call", "family",
                "dtype", "note", "kernels", "compiled_graph", "first_ts"]


def group_codes(columns: list[np.ndarray]) -> np.ndarray:
    """Group number of each row by the values of `columns`, numbered in order of first appearance (what
    pandas' groupby(sort=False) does, without its per-aggregation overhead)."""
    n = len(columns[0]) if columns else 0
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    codes = np.zeros(n, dtype=np.int64)
    for col in columns:
        c, uniques = pd.factorize(col)
        codes = codes * len(uniques) + c
        codes = pd.factorize(codes)[0]  # compact again: no overflow however many columns
    return codes.astype(np.int64)


def first_index(codes: np.ndarray, n_groups: int, valid: np.ndarray | None = None) -> np.ndarray:
    """Per group, the first row (of the `valid` ones); len(codes) where there is none."""
    idx = np.arange(len(codes))
    first = np.full(n_groups, len(codes), dtype=np.int64)
    if valid is None:
        np.minimum.at(first, codes, idx)
    else:
        np.minimum.at(first, codes[valid], idx[valid])
    return first


def _aggregate(rows: pd.DataFrame, codes: np.ndarray) -> pd.DataFrame:
    """One row per group: sums, the first value (pandas' "first": first non-missing), the union of
    kernel names and compiled graphs, the earliest start."""
    g = int(codes.max()) + 1 if len(codes) else 0
    first = first_index(codes, g)
    out: dict[str, object] = {k: rows[k].to_numpy(dtype=object)[first] for k in KEY}
    out["calls"] = np.bincount(codes, minlength=g)
    out["time_us_total"] = np.bincount(codes, weights=rows["time"].to_numpy(dtype=float), minlength=g)
    out["cpu_time_us_total"] = np.bincount(codes, weights=rows["self_us"].to_numpy(dtype=float), minlength=g)
    for src, dst in (("flops", "flops_per_call"), ("bytes", "bytes_per_call")):
        values = rows[src].to_numpy(dtype=float)
        f = first_index(codes, g, ~np.isnan(values))
        out[dst] = np.where(f < len(values), values[np.minimum(f, max(len(values) - 1, 0))], np.nan) if g else values[:0]
    for col in ("family", "dtype", "note", "module_class"):
        out[col] = rows[col].to_numpy(dtype=object)[first]
    for col in ("kernels", "compiled_graph"):
        out[col] = _join_unique_by_group(rows[col].to_numpy(dtype=object), codes, g)
    first_ts = np.full(g, np.inf)
    np.minimum.at(first_ts, codes, rows["ts"].to_numpy(dtype=float))
    out["first_ts"] = first_ts
    return pd.DataFrame(out)


def _join_unique_by_group(values: np.ndarray, codes: np.ndarray, n_groups: int) -> list[str]:
    """Per group, the distinct `;`-separated names of its rows, in order of appearance."""
    seen: list[dict[str, None]] = [{} for _ in range(n_groups)]
    for i in np.flatnonzero(values != "").tolist():
        v = values[i]
        if isinstance(v, str):
            for k in v.split(";"):
                seen[codes[i]][k] = None
    return [";".join(d) for d in seen]


GRAPH_KERNEL_NOTE = ("replayed from a CUDA/HIP graph: the trace records no shapes for it (analyze with --capture "
                     "to map it to the op that launched it during capture)")
LOOSE_KERNEL_NOTE = "launched outside any op: the trace records no shapes for it"
GPU_ONLY_NOTE = "GPU-only trace: no op or shapes recorded"


def _dominant(times: dict[str, float]) -> str:
    return max(times, key=times.get) if times else ""


def _row_families(kern: pd.DataFrame, group_of_row: np.ndarray, row_events: np.ndarray, n_groups: int) -> list[str]:
    """Per op row (group), the kernel family with the most of its kernels' time."""
    group_of_event = dict(zip(row_events.tolist(), group_of_row.tolist(), strict=True))
    times: list[dict[str, float]] = [{} for _ in range(n_groups)]
    ops = kern["op"].to_numpy()
    linked = np.flatnonzero(ops >= 0)
    fams, durs = kern["family"].to_numpy(dtype=object)[linked].tolist(), kern["dur"].to_numpy()[linked].tolist()
    for op, fam, dur in zip(ops[linked].tolist(), fams, durs, strict=True):
        g = group_of_event.get(op, -1)
        if g >= 0:
            times[g][fam] = times[g].get(fam, 0.0) + dur
    return [_dominant(t) for t in times]


# Custom ops (`vllm::unified_attention_with_output`, not aten) without a cost function take their cost
# family from their kernels where it decides the ceiling: attention and GEMM run on tensor cores.
KERNEL_TO_COST_FAMILY = {"attention": "attention", "gemm": "matmul"}
CUSTOM_OP_NOTE = "custom op: family from its kernels; no cost model for it"


def _custom_op_families(table: pd.DataFrame) -> None:
    # Plain lists: a custom op with GEMM/attention kernels is rare, and pandas' string methods cost more
    # than the whole test on a small table.
    no_cost = np.isnan(table["flops_per_call"].to_numpy(dtype=float)).tolist()
    custom = np.asarray([fam in KERNEL_TO_COST_FAMILY and unknown and not op.startswith("aten::") and is_row_name(op)
                         for op, fam, unknown in zip(table["op"].astype(str).tolist(), table["kernel_family"].tolist(),
                                                     no_cost, strict=True)], dtype=bool)
    if custom.any():
        table.loc[custom, "family"] = table.loc[custom, "kernel_family"].map(KERNEL_TO_COST_FAMILY)
        table.loc[custom, "note"] = CUSTOM_OP_NOTE


def _kernel_rows(kern: pd.DataFrame) -> pd.DataFrame | None:
    """One row per (launcher, kernel name, launcher's source location): kernels no op row launched."""
    if not len(kern):
        return None
    codes = group_codes([kern[k].to_numpy(dtype=object) for k in ("launcher", "name", "launcher_loc")])
    g = int(codes.max()) + 1
    first = first_index(codes, g)
    first_ts = np.full(g, np.inf)
    np.minimum.at(first_ts, codes, kern["ts"].to_numpy(dtype=float))
    graph = np.full(g, -1, dtype=np.int64)
    np.maximum.at(graph, codes, kern["graph_launch"].to_numpy())
    table = pd.DataFrame({k: kern[k].to_numpy(dtype=object)[first] for k in ("launcher", "name", "launcher_loc")})
    table["calls"] = np.bincount(codes, minlength=g)
    table["time_us_total"] = np.bincount(codes, weights=kern["dur"].to_numpy(dtype=float), minlength=g)
    table["first_ts"] = first_ts
    table["kernel_family"] = kern["family"].to_numpy(dtype=object)[first]
    table["graph"] = graph
    gpu_only = "launcher_op" in kern.columns and (kern["launcher"] == "").all() and (kern["launcher_op"] < 0).all()
    out = pd.DataFrame({k: "" for k in KEY}, index=table.index)
    out["op"] = table["name"]
    out["source_location"] = table["launcher_loc"]
    out["launcher"] = table["launcher"]
    out["calls"] = table["calls"]
    out["time_us_total"] = table["time_us_total"]
    out["cpu_time_us_total"] = 0.0
    out["flops_per_call"] = np.nan
    out["bytes_per_call"] = np.nan
    out["family"] = ""
    out["dtype"] = ""
    out["note"] = np.where(table["graph"].to_numpy() >= 0, GRAPH_KERNEL_NOTE,
                           GPU_ONLY_NOTE if gpu_only else LOOSE_KERNEL_NOTE)
    out["kernels"] = table["name"]
    out["compiled_graph"] = ""
    out["first_ts"] = table["first_ts"]
    out["kernel_family"] = table["kernel_family"]
    return out


def _unattributed_row(kern: pd.DataFrame) -> pd.DataFrame | None:
    lost = kern[(kern["op"].to_numpy() < 0) & ~kern["kernel_row"].to_numpy()]
    if not len(lost):
        return None
    times: dict[str, float] = {}
    for fam, dur in zip(lost["family"].tolist(), lost["dur"].tolist(), strict=True):
        times[fam] = times.get(fam, 0.0) + dur
    extra = {k: "" for k in KEY}
    extra.update(op=UNATTRIBUTED, calls=len(lost), time_us_total=float(lost["dur"].sum()),
                 cpu_time_us_total=0.0, flops_per_call=np.nan, bytes_per_call=np.nan, family="",
                 dtype="", note="", compiled_graph="", launcher="", kernel_family=_dominant(times),
                 kernels=";".join(dict.fromkeys(lost["name"].tolist())),
                 first_ts=float(lost["ts"].min()))
    return pd.DataFrame([extra])


GRAPH_NOTE = "compiled code: time inside it outside the rows below it; no cost model"
KERNEL_NOTE = "inductor kernel: the trace records no cost for it"


def _compiled_costs(rows: pd.DataFrame) -> None:
    """torch.compile rows (README, ops.csv `op`): regions and graphs have no cost; an inductor kernel
    has the cost inductor estimated when the trace records it (kernel_flop, kernel_num_gb), else none."""
    kind = rows["row_kind"].to_numpy()
    graph = kind == "graph"
    kernel = kind == "kernel"
    if not (graph.any() or kernel.any()):
        return
    for col in ("flops", "bytes"):
        rows.loc[graph | kernel, col] = np.nan
    rows.loc[graph | kernel, "family"] = ""
    rows.loc[graph, "note"] = GRAPH_NOTE
    rows.loc[kernel, "note"] = KERNEL_NOTE
    if "kernel_num_gb" not in rows.columns:
        return
    # inductor reports 0 where it has no estimate (its FLOP count covers matmul-like nodes only)
    gb = rows["kernel_num_gb"].to_numpy(dtype=float)
    flop = rows["kernel_flop"].to_numpy(dtype=float)
    known_bytes = kernel & (gb > 0)
    known_flops = known_bytes & (flop > 0)
    rows.loc[known_bytes, "bytes"] = gb[known_bytes] * 1e9
    rows.loc[known_flops, "flops"] = flop[known_flops]
    template = rows["name"].str.startswith("triton_tem_").to_numpy()
    rows.loc[known_flops, "family"] = np.where(template[known_flops], "matmul", "compiled")
    rows.loc[known_bytes, "note"] = np.where(
        known_flops[known_bytes], "inductor kernel: FLOPs and bytes as inductor estimated them",
        "inductor kernel: bytes as inductor estimated them; FLOPs unknown")


def add_roofline(table: pd.DataFrame, peaks: Peaks, *, gpu: bool) -> pd.DataFrame:
    """Arithmetic intensity, achieved rates, % of the applicable peaks and the bound class per row."""
    out = table.copy()
    calls = out["calls"].astype(float).to_numpy()
    time_total = out["time_us_total"].astype(float).to_numpy()
    per_call = np.divide(time_total, calls, out=np.full(len(out), np.nan), where=calls > 0)
    out["time_us_per_call"] = per_call
    flops = out["flops_per_call"].astype(float).to_numpy()
    nbytes = out["bytes_per_call"].astype(float).to_numpy()
    timed = per_call > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        out["arithmetic_intensity"] = np.where(nbytes > 0, flops / nbytes, np.nan)
        out["achieved_gflops"] = np.where(timed & ~np.isnan(flops), flops / per_call / 1e3, np.nan)
        out["achieved_gbps"] = np.where(timed & ~np.isnan(nbytes), nbytes / per_call / 1e3, np.nan)
    ceilings, peak_flops, bounds = [], [], []
    bw = peaks.memory_bandwidth_gbps
    for fam, dt, kern, f, b in zip(out["family"].tolist(), out["dtype"].tolist(), out["kernels"].tolist(),
                                   flops.tolist(), nbytes.tolist(), strict=True):
        key = ceiling_key(fam or "", dt or None, kern or "") if fam else ""
        pf = peaks.flops_for(key) if key else None
        ceilings.append(key)
        peak_flops.append(pf if pf else np.nan)
        bounds.append(classify_bound(f, b, fam, pf, bw))
    pf_arr = np.asarray(peak_flops, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out["pct_peak_flops"] = out["achieved_gflops"].to_numpy() / pf_arr * 100.0
        out["pct_peak_bandwidth"] = out["achieved_gbps"].to_numpy() / (bw if bw else np.nan) * 100.0
    out["ceiling"] = ceilings
    out["bound"] = bounds
    return out


def classify_bound(flops: float, nbytes: float, family: str, peak_gflops: float | None,
                   peak_gbps: float | None) -> str:
    """memory / compute / overhead / unknown for one op (see README "How to read the numbers")."""
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
