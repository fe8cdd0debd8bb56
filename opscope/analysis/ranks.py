"""Multi-process jobs: one run from the runs of its ranks. Torch-free, like all analysis: the merge of
`opscope profile --nproc-per-node N` and `opscope analyze FOLDER` (a folder of per-rank traces, or a
run's `ranks/`).

Each rank's numbers (`rank_stats`, from its trace; kept in its own summary.json as "rank", and a row of
the merged run's ranks.csv), per profiled step:

- `step_time_us`: the rank's mean step wall time; `op_time_us`: its op time (ops.csv time / steps);
- `collective_time_us`: wall time inside collectives. GPU traces with communication kernels: the union
  of those kernels (NCCL/RCCL, opscope.trace.kernel_names). Otherwise (CPU, gloo): the union, over all
  threads, of the collective CPU events: c10d ops (`c10d::allreduce_`, functional collectives),
  `record_param_comms`, and the backends' ranges (`gloo:all_reduce`, `nccl:all_reduce`, ...), which on
  gloo run on its own threads and include the wait for the other ranks;
- `compute_time_us`: the time the rank's device worked on anything but communication. GPU: the union of
  the other kernels (memcpy/memset excluded). CPU: the union of the step thread's ops, less the
  collective ops among them;
- `idle_time_us`: step wall time in which the device did nothing. GPU: no kernel on any stream. CPU: the
  step thread ran no op (it waited for a collective or for data, or ran Python between ops).

The straggler is the rank with the most compute time per step. In a synchronous job (DDP, FSDP) every
other rank waits for it inside collectives, so all step times come out alike; compute is where the slow
rank shows. ranks.csv marks it; summary.json "distributed" has it with the spread across ranks.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeGuard

from opscope import units
from opscope.analysis.gpu_timeline import COMM_FAMILY, TRANSFER_CATS, merge
from opscope.analysis.gpu_timeline import _overlap_with as overlap_with
from opscope.analysis.modules import module_table
from opscope.analysis.ops_table import (
    CONTRACT_COLUMNS,
    KEY,
    add_roofline,
    ascending_key,
    count_by_group,
    descending_key,
    first_index,
    sum_by_group,
)
from opscope.analysis.pipeline import summarize, swap_candidates
from opscope.errors import OpscopeError, TraceError
from opscope.findings import Context, run_rules
from opscope.findings.straggler import MIN_EXCESS
from opscope.kernels.incontext import not_measured
from opscope.machine.peaks import Peaks
from opscope.run.model import DEFAULT_REPORTS_DIR, STAGING_PREFIX, Run
from opscope.run.read import read_run
from opscope.run.write import check_out_dir, make_folders, write_run
from opscope.table import (
    NAN,
    Table,
    filled,
    from_records,
    group_codes,
    group_sums,
    mean,
    median,
    nrows,
    pairwise_sum,
    take,
)
from opscope.trace.kernel_names import kernel_family
from opscope.trace.location import Url, display, list_url_folder, url_info, url_of
from opscope.trace.reader import TraceData, load_trace, max_trace_bytes

COLLECTIVE_RE = re.compile(r"^(c10d::|_?c10d_functional::|record_param_comms$|(nccl|gloo|mpi|ucc|xccl|hccl):)")
RANK_NAME_RE = re.compile(r"(?:^|[^a-z])rank[_-]?(\d{1,7})(?!\d)", re.IGNORECASE)
TRACE_SUFFIXES = (".json", ".json.gz")
STATS_KEYS = ("rank", "steps", "step_time_us", "op_time_us", "collective_time_us", "compute_time_us",
              "idle_time_us")
RANK_COLUMNS = ["rank", "steps", "step_time_us", "op_time_us", "collective_time_us", "compute_time_us",
                "idle_time_us", "comm_compute_overlap_share", "straggler", "device", "run"]
MERGED_OP_COLUMNS = ["ranks", "slowest_rank", "time_us_max_rank"]
TOP_COLLECTIVES = 20

Intervals = tuple[list[float], list[float]]  # (starts, ends)
Thread = tuple[int, int]  # (pid, tid)

# a profile times each rank's candidates in that rank's own run; the merged table's rows were not timed as such
MERGED_KERNELS_REASON = ("a merged run of several processes: each rank's profile timed its own candidates "
                         "(ranks/<r>/summary.json); the merged rows were not timed")


# --- one rank ---------------------------------------------------------------------------------------


def _union_in(starts: Sequence[float], ends: Sequence[float], win_s: Sequence[float], win_e: Sequence[float]) -> float:
    """Length of the union of [starts, ends) inside the union of the windows."""
    if not starts or not win_s:
        return 0.0
    u_s, u_e = merge(starts, ends)
    w_s, w_e = merge(win_s, win_e)
    # numpy's (pairwise) sum of the per-interval overlaps, as ranks.csv had them when computed with numpy
    return pairwise_sum(overlap_with(u_s, u_e, w_s, w_e))


def _intervals(table: Table, rows: Sequence[bool] | None = None) -> Intervals:
    """[ts, ts + dur) of the table's rows (of those where `rows` is true)."""
    ts = [float(t) for t in table["ts"]]
    end = [t + float(d) for t, d in zip(ts, table["dur"], strict=True)]
    if rows is None:
        return ts, end
    return ([t for t, r in zip(ts, rows, strict=True) if r], [e for e, r in zip(end, rows, strict=True) if r])


def _collective_rows(names: Sequence[Any]) -> list[bool]:
    return [COLLECTIVE_RE.match(str(name)) is not None for name in names]


def _windows(steps: Table, ops: Table, kernels: Table) -> tuple[list[float], list[float], Thread | None]:
    """The profiled steps (ProfilerStep#N) as windows and the thread that ran them; without step
    annotations, one window over everything (as the step count of opscope.analysis.pipeline)."""
    if nrows(steps):
        s, e = _intervals(steps)
        pairs: list[Thread] = list(zip(steps["pid"], steps["tid"], strict=True))
        return s, e, max(set(pairs), key=pairs.count)
    starts, ends = [], []
    for table in (ops, kernels):
        if nrows(table):
            s, e = _intervals(table)
            starts.append(min(s))
            ends.append(max(e))
    thread = None
    if nrows(ops):
        # the thread with the most op time (pandas' groupby sum and idxmax: the first of equal sums)
        time = group_sums(list(zip(ops["pid"], ops["tid"], strict=True)), ops["dur"])
        busiest = max(time, key=time.__getitem__)
        thread = (int(busiest[0]), int(busiest[1]))
    if not starts:
        return [], [], thread
    return [min(starts)], [max(ends)], thread


def rank_stats(trace: TraceData, summary: dict[str, Any], *, rank: int, world_size: int | None = None,
               backend: str | None = None) -> dict[str, Any]:
    """One rank's numbers per profiled step (module docstring), with its collectives by name."""
    ops, ann, kern = trace.ops, trace.annotations, trace.kernels
    win_s, win_e, thread = _windows(trace.steps, ops, kern)
    steps = max(len(win_s), 1)
    window = _union_in(win_s, win_e, win_s, win_e)
    op_coll = _collective_rows(ops["name"]) if nrows(ops) else []
    ann_coll = _collective_rows(ann["name"]) if nrows(ann) else []
    comm: list[bool] = []
    if nrows(kern):
        families = kern["family"] if "family" in kern else \
            [kernel_family(n, c) for n, c in zip(kern["name"], kern["cat"], strict=True)]
        comm = [f == COMM_FAMILY for f in families]
    gpu = trace.has_gpu
    if gpu and any(comm):
        coll_s, coll_e = _intervals(kern, comm)
    else:
        o_s, o_e = _intervals(ops, op_coll) if nrows(ops) else ([], [])
        a_s, a_e = _intervals(ann, ann_coll) if nrows(ann) else ([], [])
        coll_s, coll_e = o_s + a_s, o_e + a_e
    collective = _union_in(coll_s, coll_e, win_s, win_e)
    if gpu:
        work = [not c and cat not in TRANSFER_CATS for c, cat in zip(comm, kern["cat"], strict=True)]
        compute = _union_in(*_intervals(kern, work), win_s, win_e)
        busy = _union_in(*_intervals(kern), win_s, win_e)
    elif nrows(ops):
        on_thread = [thread is not None and (p, t) == thread for p, t in zip(ops["pid"], ops["tid"], strict=True)]
        busy = _union_in(*_intervals(ops, on_thread), win_s, win_e)
        coll_here = _union_in(*_intervals(ops, [a and b for a, b in zip(on_thread, op_coll, strict=True)]),
                              win_s, win_e)
        compute = busy - coll_here
    else:
        busy = compute = 0.0
    info = trace.distributed or {}
    recorded_steps = summary.get("steps")
    n_steps = recorded_steps if isinstance(recorded_steps, int) else steps
    total = units.number(summary.get("total_time_us"))
    return {
        "rank": int(rank),
        "world_size": int(world_size if world_size is not None else info.get("world_size") or 0) or None,
        "backend": backend or (info.get("backend") if isinstance(info.get("backend"), str) else None),
        "steps": int(n_steps),
        "step_time_us": float(summary.get("step_time_us") or window / steps),
        "op_time_us": total / max(int(n_steps), 1) if total is not None else None,
        "collective_time_us": collective / steps,
        "compute_time_us": compute / steps,
        "idle_time_us": max(window - busy, 0.0) / steps,
        "comm_compute_overlap_share": units.number(summary.get("comm_compute_overlap_share")),
        "collectives": _collectives(ops, op_coll, ann, ann_coll, kern, comm),
    }


def _collectives(ops: Table, op_coll: list[bool], ann: Table, ann_coll: list[bool], kern: Table,
                 comm: list[bool]) -> list[dict[str, Any]]:
    """Calls and summed durations of each collective event name (op, annotation or kernel)."""
    out = []
    for kind, table, rows in (("op", ops, op_coll), ("annotation", ann, ann_coll), ("kernel", kern, comm)):
        if not any(rows):
            continue
        durations: dict[Any, list[float]] = {}  # by name, in order of first appearance
        for name, dur, row in zip(table["name"], table["dur"], rows, strict=True):
            if row:
                durations.setdefault(name, []).append(dur)
        for name, durs in durations.items():
            # pairwise: the sum pandas' groupby gave each name
            out.append({"name": str(name), "kind": kind, "calls": len(durs), "time_us": pairwise_sum(durs)})
    return sorted(out, key=lambda c: -c["time_us"])


def valid_stats(stats: Any) -> TypeGuard[dict[str, Any]]:
    """Whether `stats` (a rank's summary.json "rank", decoded JSON) has every number rank_stats gives."""
    return isinstance(stats, dict) and all(k in stats for k in STATS_KEYS) and isinstance(stats.get("rank"), int)


# --- the merge --------------------------------------------------------------------------------------


@dataclass
class RankRun:
    rank: int
    run: Run  # the rank's own run (ops, findings, summary, meta)
    stats: dict[str, Any]  # rank_stats
    folder: str  # its run directory inside the merged run, e.g. "ranks/3"


def merge_ranks(rank_runs: list[RankRun], *, target: str, warn: Callable[[str], None],
                failed: list[dict[str, Any]] | None = None) -> Run:
    """The merged run: ops summed over ranks, ranks.csv, the per-rank findings combined, the straggler
    finding, and summary.json "distributed". `failed`: the ranks whose analysis failed ({rank, source,
    error} each; --engine ray): summary.json "distributed" "failed_ranks" names them."""
    rank_runs = sorted(rank_runs, key=lambda r: r.rank)
    first = rank_runs[0].run
    gpu = "kernels" in first.ops
    peaks = Peaks.from_json(first.meta.get("peaks") or {})
    ops = merge_ops([(r.rank, r.run.ops) for r in rank_runs], peaks, gpu=gpu)
    ranks = ranks_table(rank_runs)
    # A merged run counts rank-steps: its times are sums over ranks, and "per step" (time / steps) is what
    # the mean rank spent in one step, comparable with a one-process run.
    rank_steps = _rank_steps(ranks)
    steps = int(pairwise_sum(rank_steps))
    step_times = [0.0 if t != t else t for t in _numbers(ranks["step_time_us"])]
    step_time = pairwise_sum([t * n for t, n in zip(step_times, rank_steps, strict=True)]) / steps
    busy_values = [b for r in rank_runs if (b := units.number(r.run.summary.get("device_busy_share"))) is not None]
    busy = pairwise_sum(busy_values) / len(busy_values) if busy_values else None  # numpy's mean
    distributed = distributed_summary(rank_runs, ranks)
    if failed:
        distributed["failed_ranks"] = failed
    expected = distributed.get("world_size")
    if expected and expected > len(rank_runs) + len(failed or []):
        warn(f"merged {len(rank_runs)} of {expected} ranks (the others' runs or traces are not in this folder: "
             "collect every node's ranks/ into one folder and run `opscope analyze FOLDER`)")
    ctx = Context(ops=ops, events={}, peaks=peaks, gpu=gpu, source=str(first.meta.get("source")),
                  steps=steps, step_time_us=step_time, device_busy_share=busy, meta=first.meta, ranks=ranks)
    findings = merge_findings(rank_runs) + run_rules(ctx, only=["straggler"])
    findings.sort(key=lambda f: (f.get("est_savings_us") is None, -(f.get("est_savings_us") or 0.0)))
    gpu_keys = {"comm_compute_overlap_share": distributed["comm_compute_overlap_share"]} if gpu else None
    summary = summarize(ops, steps=steps, step_time_us=step_time, n_findings=len(findings), busy=busy,
                        gpu_keys=gpu_keys, candidates=not_measured(swap_candidates(ops), MERGED_KERNELS_REASON))
    summary["distributed"] = distributed
    meta = dict(first.meta)
    meta.update(target=target, steps=steps)
    meta.pop("rank", None)
    meta["distributed"] = {"world_size": expected, "ranks": [r.rank for r in rank_runs],
                           "backend": distributed.get("backend"), "trace_rank": rank_runs[0].rank}
    first_modules = first.modules
    classes = (dict(zip(first_modules["module"], first_modules["module_class"], strict=True))
               if first_modules is not None else None)
    return Run(meta=meta, ops=ops, findings=findings, summary=summary, ranks=ranks,
               modules=module_table(ops, findings, classes))


def merge_ops(tables: Sequence[tuple[int, Table]], peaks: Peaks, *, gpu: bool) -> Table:
    """One ops table over all ranks ((rank, its ops table) each): rows with the same key (op, inputs,
    source line, module; GPU kernel rows also their launcher) summed (calls, time, CPU time), roofline
    columns recomputed from the sums; plus `ranks` (how many ranks ran the row), `slowest_rank` and
    `time_us_max_rank` (its time there)."""
    names = list(dict.fromkeys(c for _, t in tables for c in t))
    columns = list(dict.fromkeys([*names, *CONTRACT_COLUMNS]))
    rows = _concat_as_pandas([t for _, t in tables], names)
    rank_of_row = [rank for rank, t in tables for _ in range(nrows(t))]
    # module (and launcher) only where the ranks' tables have them: runs written before module paths lack it
    key = [k for k in KEY if k in CONTRACT_COLUMNS or k in rows]
    key += ["launcher"] if "launcher" in rows else []
    for k in key:
        rows[k] = ["" if v is None or v != v else str(v) for v in rows[k]]
    codes = group_codes([rows[k] for k in key])
    g = max(codes) + 1 if codes else 0
    table = take(rows, first_index(codes, g))  # each group's first row (groups are numbered in that order)
    time = [NAN if t is None else float(t) for t in rows["time_us_total"]]
    for col in ("calls", "time_us_total", "cpu_time_us_total"):
        if col in rows:
            # in row order, as np.bincount added them
            table[col] = sum_by_group(codes, [0.0 if v is None or v != v else float(v) for v in rows[col]], g)
    # each group's slowest row: the last in ascending time with NaN last and ties in row order (the
    # stable np.lexsort this replaces), so the longest time, the latest row of equal times, any NaN first
    slowest = [-1] * g
    for i, (c, t) in enumerate(zip(codes, time, strict=True)):
        j = slowest[c]
        if j < 0 or ascending_key(t) >= ascending_key(time[j]):
            slowest[c] = i
    table["ranks"] = count_by_group(codes, g)
    table["slowest_rank"] = [rank_of_row[i] for i in slowest]
    table["time_us_max_rank"] = [time[i] for i in slowest]
    times = table["time_us_total"]
    total = pairwise_sum(times)
    table["time_share"] = [t / total for t in times] if total > 0 else [0.0] * g
    had_kernels = "kernels" in table
    for col in ("kernels", "family", "dtype"):
        table[col] = filled(table[col]) if col in table else [""] * g
    table = add_roofline(table, peaks, gpu=gpu)
    if not had_kernels:
        del table["kernels"]
    # largest time first, NaN last; equal times keep their order (pandas' stable sort_values)
    order = sorted(range(g), key=lambda i: descending_key(times[i]))
    return take({c: table[c] for c in [c for c in columns if c in table] + MERGED_OP_COLUMNS}, order)


def _concat_as_pandas(tables: Sequence[Table], columns: Sequence[str]) -> Table:
    """The tables' rows one after another, each value as pandas' concat of their DataFrames (to_frame)
    held it: a column a table lacks is NaN there, and a column of numbers is a float column (whole
    numbers become floats) when any table's part of it holds a float or a missing value, or no rows.
    Text, bools and mixed columns keep their values (no column of an ops table holds bools or None, the
    cases where pandas converts those too)."""
    out: Table = {}
    for c in columns:
        parts = [t.get(c) for t in tables]
        kinds = [_number_kind(p) if p is not None else "float" for p in parts]
        values: list[Any] = []
        for t, part, kind in zip(tables, parts, kinds, strict=True):
            values += [NAN] * nrows(t) if part is None else _floats(part) if kind == "float" else part
        out[c] = _floats(values) if set(kinds) <= {"int", "float"} and "float" in kinds else values
    return out


_PLAIN_NUMBERS: dict[type, str] = {int: "int", float: "float", type(None): "none"}


def _number_kind(values: Sequence[Any]) -> str:
    """The numpy type pandas gives a column of these values: "int" (whole numbers only), "float"
    (numbers with a float or NaN among them, whole numbers with None, or no values), "none" (None only),
    or "other" (text, bools, mixed: kept as they are)."""
    types = set(map(type, values))
    if _PLAIN_NUMBERS.keys() >= types:  # what ops tables hold: decided by the types alone, in one C pass
        plain = {_PLAIN_NUMBERS[t] for t in types}
        if not plain or "float" in plain or plain == {"int", "none"}:
            return "float"
        return "int" if plain == {"int"} else "none"
    kinds = set()
    for v in values:
        if v is None:
            kinds.add("none")
        elif isinstance(v, bool) or not isinstance(v, (int, float)):
            return "other"
        else:
            kinds.add("int" if isinstance(v, int) else "float")
    if not kinds or "float" in kinds or kinds == {"int", "none"}:
        return "float"
    return "int" if kinds == {"int"} else "none"


def _floats(values: Sequence[Any]) -> list[float]:
    return [NAN if v is None else float(v) for v in values]


def ranks_table(rank_runs: list[RankRun]) -> Table:
    """ranks.csv: one row per rank (module docstring), the straggler marked."""
    rows = []
    for r in rank_runs:
        s = r.stats
        rows.append({"rank": r.rank, "steps": s.get("steps"), "step_time_us": s.get("step_time_us"),
                     "op_time_us": s.get("op_time_us"), "collective_time_us": s.get("collective_time_us"),
                     "compute_time_us": s.get("compute_time_us"), "idle_time_us": s.get("idle_time_us"),
                     "comm_compute_overlap_share": s.get("comm_compute_overlap_share"), "straggler": 0,
                     "device": str((r.run.meta.get("device") or {}).get("name") or ""), "run": r.folder})
    table = from_records(rows, RANK_COLUMNS)
    for col, values in table.items():  # typed as a DataFrame of these rows typed them
        if _number_kind(values) == "float":
            table[col] = _floats(values)
    slow = _first_max(_numbers(table["compute_time_us"]))
    if slow is not None:
        table["straggler"][slow] = 1
    return table


def _numbers(values: Sequence[Any]) -> list[float]:
    """The values as numbers (units.number), NaN where not one: pandas' to_numeric(errors="coerce")."""
    return [NAN if (x := units.number(v)) is None else x for v in values]


def _first_max(values: Sequence[float]) -> int | None:
    """Index of the largest value (the first of equal ones), NaN skipped; None if all are NaN (idxmax)."""
    best = None
    for i, v in enumerate(values):
        if v == v and (best is None or v > values[best]):
            best = i
    return best


def _rank_steps(ranks: Table) -> list[float]:
    """Each rank's profiled steps, at least 1 (a rank without the number counts 1)."""
    return [1.0 if s != s else max(s, 1.0) for s in _numbers(ranks["steps"])]


def _spread(values: Sequence[float]) -> float | None:
    present = [v for v in values if v == v]
    med = median(present) if present else 0.0
    return (max(present) - min(present)) / med if med > 0 else None


def distributed_summary(rank_runs: list[RankRun], ranks: Table) -> dict[str, Any]:
    """summary.json "distributed" (opscope.run.schema.Distributed)."""
    rank_steps = int(pairwise_sum(_rank_steps(ranks)))
    compute = _numbers(ranks["compute_time_us"])
    step = _numbers(ranks["step_time_us"])
    coll = _numbers(ranks["collective_time_us"])
    slowest = _first_max(compute)
    slow = slowest if slowest is not None else 0
    med = median(compute) if slowest is not None else None
    worlds = [w for r in rank_runs if isinstance(w := r.stats.get("world_size"), int)]
    backends = [r.stats.get("backend") for r in rank_runs if r.stats.get("backend")]
    overlaps = [o for r in rank_runs if (o := units.number(r.stats.get("comm_compute_overlap_share"))) is not None]
    steps_known = [s for s in step if s == s]
    coll_known = any(c == c for c in coll)
    mean_step = mean(step) if steps_known else 0.0
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rank_runs:
        for c in r.stats.get("collectives") or []:
            entry = merged.setdefault((c["kind"], c["name"]), {"name": c["name"], "kind": c["kind"], "calls": 0,
                                                               "time_us": 0.0, "ranks": 0})
            entry["calls"] += int(c.get("calls") or 0)
            entry["time_us"] += float(c.get("time_us") or 0.0)
            entry["ranks"] += 1
    collectives = sorted(merged.values(), key=lambda c: -c["time_us"])[:TOP_COLLECTIVES]
    for c in collectives:
        c["time_us_per_step"] = c["time_us"] / rank_steps
        c["share"] = c["time_us_per_step"] / mean_step if mean_step > 0 else None
    straggler = int(ranks["rank"][slow])
    excess = (compute[slow] - med) / med if med else None
    return {
        "world_size": max(worlds) if worlds else len(rank_runs),
        "ranks": len(rank_runs),
        "steps_per_rank": int(median(_numbers(ranks["steps"]))),
        "backend": backends[0] if backends else None,
        "straggler_rank": straggler,
        "straggler_compute_time_us": compute[slow] if med is not None else None,
        "compute_time_us_median": med,
        "straggler_excess_share": excess,
        # beyond run-to-run noise: what the straggler finding fires on (opscope.findings.straggler)
        "straggler_beyond_noise": bool(excess is not None and excess >= MIN_EXCESS),
        "compute_spread_share": _spread(compute),
        "step_time_us_min": min(steps_known) if steps_known else None,
        "step_time_us_max": max(steps_known) if steps_known else None,
        "step_time_spread_share": _spread(step),
        "collective_time_us": mean(coll) if coll_known else None,
        "collective_time_share": mean(coll) / mean_step if coll_known and mean_step > 0 else None,
        "idle_time_us": mean(_numbers(ranks["idle_time_us"])),
        "comm_compute_overlap_share": pairwise_sum(overlaps) / len(overlaps) if overlaps else None,  # numpy's mean
        "collectives": collectives,
    }


def rank_list(ranks: list[int]) -> str:
    """'rank 3', 'ranks 0-7', 'ranks 0, 2, 5'."""
    ranks = sorted(set(ranks))
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


def merge_findings(rank_runs: list[RankRun]) -> list[dict[str, Any]]:
    """The ranks' findings, one per (rule, op, source line): the text of the rank where it saves most,
    prefixed with the ranks it fired on; the saving summed over them (the merged run sums time over
    ranks)."""
    groups: dict[tuple[Any, Any, Any], list[tuple[int, dict[str, Any]]]] = {}
    for r in rank_runs:
        for f in r.run.findings:
            groups.setdefault((f.get("rule"), f.get("op"), f.get("source_location")), []).append((r.rank, f))
    out = []
    for items in groups.values():
        best = max(items, key=lambda x: x[1].get("est_savings_us") or 0.0)[1]
        savings = [s for _, f in items if isinstance(s := f.get("est_savings_us"), (int, float))]
        merged = dict(best)
        merged["message"] = f"{rank_list([r for r, _ in items])}: {best.get('message', '')}"
        # unknown (None) as soon as one rank's saving is
        merged["est_savings_us"] = float(sum(savings)) if len(savings) == len(items) else None
        out.append(merged)
    return out


# --- run directories ----------------------------------------------------------------------------------


def write_merged(run: Run, ranks_dir: Path, *, out: Path | None, stem: str, base: Path) -> Path:
    """Writes the merged run atomically, with the ranks' run directories moved into its ranks/ and the
    lowest rank's trace as its trace.json.gz."""
    trace_rank = run.meta.get("distributed", {}).get("trace_rank")

    def add_ranks(folder: Path) -> None:
        os.replace(ranks_dir, folder / "ranks")
        src = folder / "ranks" / str(trace_rank) / "trace.json.gz"
        if src.is_file():
            try:
                os.link(src, folder / "trace.json.gz")
            except OSError:
                shutil.copyfile(src, folder / "trace.json.gz")

    return write_run(run, out, stem, None, base=base, extra=add_ranks)


@contextlib.contextmanager
def staging_folder(parent: Path) -> Iterator[Path]:
    """A hidden folder beside the final run (same file system, so ranks/ moves in by rename), named like
    a run being written so that a killed process's leftovers are removed (opscope.run.discard_staging)."""
    made = not parent.exists()
    make_folders(parent)
    path = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-ranks-", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        if made:
            with contextlib.suppress(OSError):
                parent.rmdir()  # only if still empty: a failed merge leaves no empty reports/


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and all((path / f).is_file() for f in ("meta.json", "ops.csv", "summary.json"))


def rank_entries(folder: Path | Url) -> list[tuple[Path | Url, int | None]]:
    """The per-rank inputs of a folder, each with the rank its folder's name gives (or None): run
    directories (a run's ranks/<r>/), trace files (*.json, *.json.gz, e.g. torch's *.pt.trace.json), and
    the one trace inside a sub-folder that is not a run directory (tensorboard_trace_handler's per-rank
    folders `0/`, `1/`); a merged run's folder stands for its ranks/. A folder given by URL holds traces
    (run directories are read from local paths)."""
    if isinstance(folder, Url):
        return _url_rank_entries(folder)
    if not folder.is_dir():
        raise TraceError(f"{folder} is not a folder")
    if is_run_dir(folder):
        if not (folder / "ranks").is_dir():
            raise TraceError(f"{folder} is the run directory of one process: analyze its trace.json.gz, or give a "
                             "folder of several ranks' traces or runs")
        folder = folder / "ranks"
    children = _listing(folder)
    entries: list[tuple[Path | Url, int | None]] = []
    for p in children:
        if is_run_dir(p) or _is_trace(p):
            entries.append((p, rank_hint(p)))
        elif p.is_dir():
            traces = [c for c in _listing(p) if _is_trace(c)]
            if len(traces) > 1:
                shown = ", ".join(c.name for c in traces[:3]) + (", ..." if len(traces) > 3 else "")
                raise TraceError(f"{p} holds {len(traces)} traces ({shown}): a rank's folder must hold one trace "
                                 "(move the others out, or give one folder per job)")
            if traces:
                own = rank_hint(traces[0])
                entries.append((traces[0], own if own is not None else rank_hint(p)))
    if not entries:
        raise TraceError(f"{folder} holds no per-rank traces (*.json, *.json.gz), folders of one trace each, or run "
                         "directories to merge")
    return entries


def _url_rank_entries(folder: Url) -> list[tuple[Path | Url, int | None]]:
    """rank_entries of a folder URL: its traces, and the one trace of each sub-folder."""
    entries: list[tuple[Path | Url, int | None]] = []
    for url, is_dir in list_url_folder(folder):
        if url.name.startswith("."):
            continue
        if not is_dir:
            if url.name.endswith(TRACE_SUFFIXES):
                entries.append((url, rank_hint(url, folder=False)))
            continue
        traces = [u for u, d in list_url_folder(url) if not d and u.name.endswith(TRACE_SUFFIXES)]
        if len(traces) > 1:
            shown = ", ".join(u.name for u in traces[:3]) + (", ..." if len(traces) > 3 else "")
            raise TraceError(f"{url.shown} holds {len(traces)} traces ({shown}): a rank's folder must hold one trace "
                             "(move the others out, or give one folder per job)")
        if traces:
            own = rank_hint(traces[0], folder=False)
            entries.append((traces[0], own if own is not None else rank_hint(url, folder=True)))
    if not entries:
        raise TraceError(f"{folder.shown} holds no per-rank traces (*.json, *.json.gz) or folders of one trace each")
    return entries


def _listing(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if not p.name.startswith("."))
    except OSError as exc:
        raise TraceError(f"cannot read {folder}: {exc.strerror or exc}") from exc


def _is_trace(path: Path) -> bool:
    return path.name.endswith(TRACE_SUFFIXES) and path.is_file()


def rank_hint(path: Path | Url, folder: bool | None = None) -> int | None:
    """A rank number in a file or folder name: `rank3.json.gz`, `trace_rank_3...`, or a folder `3/`
    (`folder`: whether it is one, when known; a local path is asked)."""
    name = path.name
    if folder is None:
        folder = isinstance(path, Path) and path.is_dir()
    if folder and name.isdigit():
        return int(name)
    m = RANK_NAME_RE.search(name)
    return int(m.group(1)) if m else None


# A Ray task's memory (its scheduling declaration): a worker with opscope's analysis imported, plus the
# rank's trace as decoded tables and run files, in proportion to its JSON. Measured (peak RSS of one rank's
# analysis less the process's after imports: benchmarks/analyze_workers.py --memory): 5.5 bytes per JSON byte
# on a copy of the shared H100 ViT trace (1.3 MiB of JSON), 3.8 on the ~132k-event synthetic trace
# (34 MiB); declared with headroom.
TASK_BASE_BYTES = 256 * 2**20
JSON_EXPANSION = 6
GZIP_RATIO = 16  # JSON bytes per gzipped byte when the gzip trailer cannot say (a trace over 4 GiB)


@dataclass(frozen=True)
class RankJob:
    """One rank's analysis as a worker process or a Ray task receives it: small and picklable."""

    index: int  # its place in the folder's listing (the merge's order of warnings and errors)
    entry: str  # the rank's trace or run directory, read where the analysis runs
    hint: int  # its rank when its trace does not record one (the name's number, else `index`)
    peak_bw: float | None
    peak_flops: tuple[str, ...]
    max_trace_gb: float | None
    # where to write its run directory (the staging folder, on this machine); None: return its files
    # (a Ray task that may run on another machine)
    dest: str | None
    json_bytes: int = 0  # its JSON's size, for the task's declared memory


@dataclass
class RankDone:
    """What comes back of a rank: what the merge needs (the run without its events), the warnings it
    gave, and (a Ray task) its run directory's files."""

    index: int
    rank_run: RankRun
    warnings: list[str]
    files: dict[str, bytes] | None = None


def rank_memory(job: RankJob) -> int:
    """Bytes a rank's analysis is declared to need (the constants' comment)."""
    return TASK_BASE_BYTES + JSON_EXPANSION * job.json_bytes


def analyze_rank(job: RankJob, warn: Callable[[str], None] | None = None) -> RankDone:
    """Analyzes (or reads) one rank's trace or run directory into its run directory. Without `warn`, the
    warnings are kept in the result (a worker process's or a Ray task's)."""
    kept: list[str] = []
    say = warn if warn is not None else kept.append
    if job.dest is not None:
        return RankDone(job.index, _analyze_rank_into(job, Path(job.dest), say), kept)
    with tempfile.TemporaryDirectory(prefix="opscope-rank-") as tmp:
        run_dir = Path(tmp) / "run"
        rank_run = _analyze_rank_into(job, run_dir, say)
        files = {p.relative_to(run_dir).as_posix(): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}
    return RankDone(job.index, rank_run, kept, files)


def _analyze_rank_into(job: RankJob, dest: Path, warn: Callable[[str], None]) -> RankRun:
    from opscope.analysis.trace_file import analyze_trace_file

    entry: Path | Url = url_of(job.entry) or Path(job.entry)
    if isinstance(entry, Path) and is_run_dir(entry):
        rr = _read_rank_dir(entry, job.hint, job.max_trace_gb)
        shutil.copytree(entry, dest)
    else:
        holder: dict[str, Any] = {}

        def finish(run: Run, trace: TraceData) -> None:
            info = trace.distributed or {}
            rank = recorded if isinstance(recorded := info.get("rank"), int) else job.hint
            run.summary["rank"] = holder["stats"] = rank_stats(trace, run.summary, rank=rank)
            run.meta["rank"] = rank

        run = analyze_trace_file(entry, out=dest, peak_bw=job.peak_bw, peak_flops=list(job.peak_flops) or None,
                                 warn=warn, max_trace_gb=job.max_trace_gb, finish=finish)
        rr = RankRun(holder["stats"]["rank"], run, holder["stats"], "")
    # only what the merge reads travels back (and stays in memory while the other ranks run)
    r = rr.run
    rr.run = Run(meta=r.meta, ops=r.ops, findings=r.findings, summary=r.summary, modules=r.modules)
    return rr


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity mask: a container's or taskset's share)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def analyze_rank_folder(folder: Path | Url, *, out: Path | None = None, peak_bw: float | None = None,
                        peak_flops: list[str] | None = None, warn: Callable[[str], None] = lambda m: None,
                        max_trace_gb: float | None = None, workers: int | None = None, engine: str = "local",
                        address: str | None = None, on_rank: Callable[[int, int], None] | None = None) -> Run:
    """`opscope analyze FOLDER`: analyzes (or reads) each rank's trace or run directory, then merges.
    `workers`: ranks analyzed at once in worker processes (default: the usable cores, at most one per
    rank; 1: one after the other in this process). `engine="ray"`: each rank a Ray task (on the cluster
    at `address`, else on a local Ray of `workers` CPUs); a rank whose task fails twice is left out and
    named in the merged run. `on_rank(done, total)` after each rank. The merged run does not depend on
    either: ranks are merged in their order, whatever order they finish in."""
    from opscope.analysis import engines

    if workers is not None and workers < 1:
        raise OpscopeError(f"--workers {workers}: give 1 or more")
    if engine not in engines.ENGINES:
        raise OpscopeError(f"--engine {engine}: one of {', '.join(engines.ENGINES)}")
    base = DEFAULT_REPORTS_DIR.absolute()
    out = out.absolute() if out is not None else None
    check_out_dir(out, base)
    entries = rank_entries(folder)
    seen: set[str] = set()

    def warn_once(message: str) -> None:
        if message not in seen:
            seen.add(message)
            warn(message)

    n = min(workers or usable_cores(), len(entries))
    ray = engine == "ray"
    with staging_folder(out.parent if out is not None else base) as staging:
        ranks_dir = staging / "ranks"
        ranks_dir.mkdir()
        jobs = [RankJob(i, str(entry) if isinstance(entry, Url) else str(entry.absolute()), hint if hint is not None else i, peak_bw, tuple(peak_flops or ()),
                        max_trace_gb, None if ray else str(ranks_dir / f".entry-{i}"),
                        json_size(entry) if ray else 0)  # only a Ray task declares its memory
                for i, (entry, hint) in enumerate(entries)]
        rank_runs: list[RankRun] = []
        sources: dict[int, Path | Url] = {}
        failed: list[dict[str, Any]] = []
        runner: engines.Engine
        if ray:
            runner = engines.RayEngine(address, cpus=workers or usable_cores())
        elif n > 1:
            runner = engines.LocalPool(n, preload=[__name__, "opscope.analysis.trace_file"])
        else:
            runner = engines.InProcess()
        # in this process the warnings come as they are given; from workers, with their rank's result
        fn: Callable[[RankJob], RankDone] = (partial(analyze_rank, warn=warn_once) if isinstance(runner, engines.InProcess)
                                             else analyze_rank)
        if on_rank is not None:
            on_rank(0, len(jobs))
        with runner:
            outcomes: dict[int, RankDone | BaseException | engines.Failed] = {}
            following = 0
            for done, (index, outcome) in enumerate(runner.run(fn, jobs, [rank_memory(j) for j in jobs]), 1):
                if on_rank is not None:
                    on_rank(done, len(jobs))
                outcomes[index] = outcome
                # in the folder's order, whatever order they finish in: the same warnings, the same first
                # error, the same merge as one after the other
                while following in outcomes:
                    job, result = jobs[following], outcomes.pop(following)
                    entry = entries[following][0]
                    following += 1
                    if isinstance(result, engines.WorkerDied):
                        raise OpscopeError(f"{display(entry)}: {result}")
                    if isinstance(result, BaseException):
                        raise result
                    if isinstance(result, engines.Failed):
                        failed.append({"rank": job.hint, "source": entry.name, "error": result.message})
                        warn_once(f"{entry.name} (rank {job.hint}): {result.message}; its analysis failed "
                                  f"{result.tries} times, the merged run lacks it")
                        continue
                    pending = ranks_dir / f".entry-{job.index}"
                    if result.files is not None:
                        _write_files(result.files, pending)
                    for line in result.warnings:
                        warn_once(line)
                    rr = result.rank_run
                    _claim(sources, rr.rank, entry)
                    os.replace(pending, ranks_dir / str(rr.rank))
                    rr.folder = f"ranks/{rr.rank}"
                    rank_runs.append(rr)
                    check_ranks_agree(rank_runs, sources, folder, None)  # a mixed folder stops at its first odd rank
        if not rank_runs:
            raise TraceError(f"{display(folder)}: every rank's analysis failed ({failed[0]['source']}: {failed[0]['error']})")
        check_ranks_agree(rank_runs, sources, folder, warn_once)
        merged = merge_ranks(rank_runs, target=folder.shown if isinstance(folder, Url) else os.path.normpath(folder),
                             warn=warn_once, failed=failed)
        write_merged(merged, ranks_dir, out=out, stem=_stem(folder), base=base)
    return merged


def json_size(entry: Path | Url) -> int:
    """A trace's JSON size without reading it (a gzipped one's from its trailer: the size mod 4 GiB, or
    GZIP_RATIO times its size by URL), or a run directory's files' size."""
    if isinstance(entry, Url):
        try:
            _kind, size = url_info(entry)
        except TraceError:
            return 0  # unreadable: the analysis says why
        return (size or 0) * (GZIP_RATIO if entry.name.endswith(".gz") else 1)
    try:
        if entry.is_dir():
            return sum(p.stat().st_size for p in entry.rglob("*") if p.is_file())
        size = entry.stat().st_size
        if not entry.name.endswith(".gz") or size < 18:
            return size
        with open(entry, "rb") as f:
            f.seek(-4, os.SEEK_END)
            isize = int.from_bytes(f.read(4), "little")
        return isize if isize >= size else size * GZIP_RATIO  # smaller: wrapped past 4 GiB
    except OSError:
        return 0  # unreadable: the analysis says why


def _write_files(files: dict[str, bytes], folder: Path) -> None:
    """A rank's run directory from its files (a Ray task's result)."""
    for name, data in files.items():
        path = folder / name
        make_folders(path.parent)
        path.write_bytes(data)


def check_ranks_agree(rank_runs: list[RankRun], sources: dict[int, Path | Url], folder: Path | Url,
                      warn: Callable[[str], None] | None) -> None:
    """Refuses a folder whose ranks cannot be one job: different device types, world sizes or backends
    recorded, or more ranks (or a higher rank) than the world size; with `warn`, warns when the GPU
    models or the step counts differ (one line each)."""
    def who(rs: list[RankRun]) -> str:
        names = ", ".join(sources[r.rank].name if r.rank in sources else r.folder for r in rs[:3])
        return f"{rank_list([r.rank for r in rs])} ({names}{', ...' if len(rs) > 3 else ''})"

    def by(value: Callable[[RankRun], Any]) -> dict[Any, list[RankRun]]:
        groups: dict[Any, list[RankRun]] = {}
        for r in sorted(rank_runs, key=lambda r: r.rank):
            v = value(r)
            if v is not None:
                groups.setdefault(v, []).append(r)
        return groups

    def device(r: RankRun) -> dict[str, Any]:
        d = r.run.meta.get("device")
        return d if isinstance(d, dict) else {}

    not_one_job = f"{display(folder)}: one folder must hold the ranks of one job"
    types = by(lambda r: str(device(r).get("type") or "") or None)
    if len(types) > 1:
        parts = [f"{who(rs)} on {t}" + ("" if t == "cpu" else f" ({str(device(rs[0]).get('name') or '?')[:60]})")
                 for t, rs in types.items()]
        raise TraceError(f"ranks ran on different device types: {'; '.join(parts)}; {not_one_job}")
    worlds = by(lambda r: w if isinstance(w := r.stats.get("world_size"), int) and w > 0 else None)
    if len(worlds) > 1:
        parts = [f"{who(rs)} world size {w}" for w, rs in worlds.items()]
        raise TraceError(f"ranks record different world sizes: {'; '.join(parts)}; {not_one_job}")
    backends = by(lambda r: b if isinstance(b := r.stats.get("backend"), str) and b else None)
    if len(backends) > 1:
        parts = [f"{who(rs)} {b}" for b, rs in backends.items()]
        raise TraceError(f"ranks record different backends: {'; '.join(parts)}; {not_one_job}")
    if worlds:
        world = next(iter(worlds))
        beyond = [r for r in rank_runs if r.rank >= world]
        if len(rank_runs) > world or beyond:
            extra = f"; {who(beyond)} beyond it" if beyond else ""
            raise TraceError(f"{len(rank_runs)} ranks, but the traces record a world size of {world}{extra}; "
                             f"{not_one_job}")
    if warn is None:
        return
    names = by(lambda r: str(device(r).get("name") or "") or None)
    if len(names) > 1 and next(iter(types), "cpu") != "cpu":  # a CPU trace does not record its CPU
        parts = [f"{who(rs)} {str(n)[:60]}" for n, rs in names.items()]
        warn(f"ranks ran on different GPU models ({'; '.join(parts)}): the straggler may be the slower GPU, "
             "not slower work")
    steps = by(lambda r: s if isinstance(s := r.stats.get("steps"), int) else None)
    if len(steps) > 1:
        parts = [f"{who(rs)} {n}" for n, rs in sorted(steps.items())]
        warn(f"ranks profiled different numbers of steps ({'; '.join(parts)}): per-step numbers are each "
             "rank's own mean; check that the traces come from the same profiling window")


def _stem(folder: Path | Url) -> str:
    if isinstance(folder, Url):
        parts = [p for p in folder.shown.split("://", 1)[-1].split("/") if p]
        name, parent = (parts[-1] if parts else "ranks"), (parts[-2] if len(parts) > 1 else "")
        return f"{parent}-{name}" if name == "ranks" and parent else name
    name = folder.absolute().name
    parent = folder.absolute().parent.name
    return f"{parent}-{name}" if name == "ranks" and parent else name


def _claim(sources: dict[int, Path | Url], rank: int, entry: Path | Url) -> None:
    if rank in sources:
        raise TraceError(f"{display(sources[rank])} and {display(entry)} are both rank {rank}: one folder must hold one job's ranks, "
                         "each once (name the files rank0..., rank1..., when the traces do not record their rank)")
    sources[rank] = entry


def _read_rank_dir(path: Path, fallback: int, max_trace_gb: float | None) -> RankRun:
    run = read_run(path)
    stats = run.summary.get("rank")
    if not valid_stats(stats):
        trace_path = path / "trace.json.gz"
        if not trace_path.is_file():
            raise OpscopeError(f"{path} has neither the rank's numbers (summary.json \"rank\") nor its trace.json.gz")
        trace = load_trace(trace_path, with_python=False, max_bytes=max_trace_bytes(max_trace_gb))
        info = trace.distributed or {}
        rank = recorded if isinstance(recorded := info.get("rank"), int) else fallback
        stats = rank_stats(trace, run.summary, rank=rank)
    return RankRun(int(stats["rank"]), run, stats, "")
