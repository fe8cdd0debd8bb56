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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from opscope.analysis.gpu_timeline import COMM_FAMILY, TRANSFER_CATS, merge
from opscope.analysis.gpu_timeline import _overlap_with as overlap_with
from opscope.analysis.modules import module_table
from opscope.analysis.ops_table import CONTRACT_COLUMNS, KEY, add_roofline
from opscope.analysis.pipeline import summarize
from opscope.errors import OpscopeError, TraceError
from opscope.findings import Context, run_rules
from opscope.findings.straggler import MIN_EXCESS
from opscope.machine.peaks import Peaks
from opscope.run.model import DEFAULT_REPORTS_DIR, STAGING_PREFIX, Run
from opscope.run.read import read_run
from opscope.run.write import check_out_dir, write_run
from opscope.table import Table, from_frame, group_codes, to_frame
from opscope.trace.kernel_names import kernel_family
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


# --- one rank ---------------------------------------------------------------------------------------


def _union_in(starts: np.ndarray, ends: np.ndarray, win_s: np.ndarray, win_e: np.ndarray) -> float:
    """Length of the union of [starts, ends) inside the union of the windows."""
    if not len(starts) or not len(win_s):
        return 0.0
    u_s, u_e = merge(np.asarray(starts, dtype=float), np.asarray(ends, dtype=float))
    w_s, w_e = merge(np.asarray(win_s, dtype=float), np.asarray(win_e, dtype=float))
    # numpy's sum of the per-interval overlaps (as ranks.csv had them before gpu_timeline gave lists)
    return float(np.asarray(overlap_with(u_s, u_e, w_s, w_e), dtype=float).sum())


def _intervals(df: pd.DataFrame, mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    ts = df["ts"].to_numpy(dtype=float)
    end = ts + df["dur"].to_numpy(dtype=float)
    return (ts, end) if mask is None else (ts[mask], end[mask])


def _collective_mask(names: pd.Series) -> np.ndarray:
    return names.astype(str).str.match(COLLECTIVE_RE).to_numpy(dtype=bool) if len(names) else np.zeros(0, bool)


def _frame(table: Table | pd.DataFrame) -> pd.DataFrame:
    """A TraceData table (opscope.table) as a DataFrame; a DataFrame as it is."""
    return to_frame(table) if isinstance(table, dict) else table


def _windows(steps: pd.DataFrame, ops: pd.DataFrame,
             kernels: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, tuple[int, int] | None]:
    """The profiled steps (ProfilerStep#N) as windows and the thread that ran them; without step
    annotations, one window over everything (as the step count of opscope.analysis.pipeline)."""
    if len(steps):
        s, e = _intervals(steps)
        pairs = list(zip(steps["pid"].tolist(), steps["tid"].tolist(), strict=True))
        return s, e, max(set(pairs), key=pairs.count)
    starts, ends = [], []
    for df in (ops, kernels):
        if len(df):
            s, e = _intervals(df)
            starts.append(s.min())
            ends.append(e.max())
    thread = None
    if len(ops):
        busiest = ops.groupby(["pid", "tid"])["dur"].sum().idxmax()
        thread = (int(busiest[0]), int(busiest[1]))
    if not starts:
        return np.zeros(0), np.zeros(0), thread
    return np.array([min(starts)]), np.array([max(ends)]), thread


def rank_stats(trace: TraceData, summary: dict[str, Any], *, rank: int, world_size: int | None = None,
               backend: str | None = None) -> dict[str, Any]:
    """One rank's numbers per profiled step (module docstring), with its collectives by name."""
    ops, ann, kern = _frame(trace.ops), _frame(trace.annotations), _frame(trace.kernels)
    win_s, win_e, thread = _windows(_frame(trace.steps), ops, kern)
    steps = max(len(win_s), 1)
    window = _union_in(win_s, win_e, win_s, win_e)
    op_coll = _collective_mask(ops["name"]) if len(ops) else np.zeros(0, bool)
    ann_coll = _collective_mask(ann["name"]) if len(ann) else np.zeros(0, bool)
    if len(kern):
        fam = (kern["family"] if "family" in kern.columns else
               pd.Series([kernel_family(n, c) for n, c in zip(kern["name"], kern["cat"], strict=True)]))
        comm = fam.to_numpy(dtype=object) == COMM_FAMILY
    else:
        comm = np.zeros(0, bool)
    gpu = trace.has_gpu
    if gpu and comm.any():
        coll_s, coll_e = _intervals(kern, comm)
    else:
        o_s, o_e = _intervals(ops, op_coll) if len(ops) else (np.zeros(0), np.zeros(0))
        a_s, a_e = _intervals(ann, ann_coll) if len(ann) else (np.zeros(0), np.zeros(0))
        coll_s, coll_e = np.concatenate([o_s, a_s]), np.concatenate([o_e, a_e])
    collective = _union_in(coll_s, coll_e, win_s, win_e)
    if gpu:
        work = ~comm & ~np.isin(kern["cat"].to_numpy(dtype=object), TRANSFER_CATS)
        compute = _union_in(*_intervals(kern, work), win_s, win_e)
        busy = _union_in(*_intervals(kern), win_s, win_e)
    else:
        on_thread = np.zeros(len(ops), bool)
        if thread is not None and len(ops):
            on_thread = (ops["pid"].to_numpy() == thread[0]) & (ops["tid"].to_numpy() == thread[1])
        busy = _union_in(*_intervals(ops, on_thread), win_s, win_e) if len(ops) else 0.0
        coll_here = _union_in(*_intervals(ops, on_thread & op_coll), win_s, win_e) if len(ops) else 0.0
        compute = busy - coll_here
    info = trace.distributed or {}
    n_steps = summary.get("steps") if isinstance(summary.get("steps"), int) else steps
    total = summary.get("total_time_us")
    overlap = summary.get("comm_compute_overlap_share")
    return {
        "rank": int(rank),
        "world_size": int(world_size if world_size is not None else info.get("world_size") or 0) or None,
        "backend": backend or (info.get("backend") if isinstance(info.get("backend"), str) else None),
        "steps": int(n_steps),
        "step_time_us": float(summary.get("step_time_us") or window / steps),
        "op_time_us": float(total) / max(int(n_steps), 1) if isinstance(total, (int, float)) else None,
        "collective_time_us": collective / steps,
        "compute_time_us": compute / steps,
        "idle_time_us": max(window - busy, 0.0) / steps,
        "comm_compute_overlap_share": overlap if isinstance(overlap, (int, float)) else None,
        "collectives": _collectives(ops, op_coll, ann, ann_coll, kern, comm),
    }


def _collectives(ops: pd.DataFrame, op_coll: np.ndarray, ann: pd.DataFrame, ann_coll: np.ndarray,
                 kern: pd.DataFrame, comm: np.ndarray) -> list[dict[str, Any]]:
    """Calls and summed durations of each collective event name (op, annotation or kernel)."""
    out = []
    for kind, df, mask in (("op", ops, op_coll), ("annotation", ann, ann_coll), ("kernel", kern, comm)):
        if not len(df) or not mask.any():
            continue
        sel = df[mask]
        for name, g in sel.groupby("name", sort=False)["dur"]:
            out.append({"name": str(name), "kind": kind, "calls": int(len(g)), "time_us": float(g.sum())})
    return sorted(out, key=lambda c: -c["time_us"])


def valid_stats(stats: Any) -> bool:
    return isinstance(stats, dict) and all(k in stats for k in STATS_KEYS) and isinstance(stats.get("rank"), int)


# --- the merge --------------------------------------------------------------------------------------


@dataclass
class RankRun:
    rank: int
    run: Run  # the rank's own run (ops, findings, summary, meta)
    stats: dict[str, Any]  # rank_stats
    folder: str  # its run directory inside the merged run, e.g. "ranks/3"


def merge_ranks(rank_runs: list[RankRun], *, target: str, warn: Callable[[str], None]) -> Run:
    """The merged run: ops summed over ranks, ranks.csv, the per-rank findings combined, the straggler
    finding, and summary.json "distributed"."""
    rank_runs = sorted(rank_runs, key=lambda r: r.rank)
    first = rank_runs[0].run
    gpu = "kernels" in first.ops
    peaks = Peaks.from_json(first.meta.get("peaks") or {})
    ops = merge_ops([to_frame(r.run.ops).assign(_rank=r.rank) for r in rank_runs], peaks, gpu=gpu)
    ranks = ranks_table(rank_runs)
    # A merged run counts rank-steps: its times are sums over ranks, and "per step" (time / steps) is what
    # the mean rank spent in one step, comparable with a one-process run.
    rank_steps = pd.to_numeric(ranks["steps"], errors="coerce").fillna(1).clip(lower=1)
    steps = int(rank_steps.sum())
    step_time = float((pd.to_numeric(ranks["step_time_us"], errors="coerce").fillna(0.0) * rank_steps).sum()) / steps
    busy_values = [r.run.summary.get("device_busy_share") for r in rank_runs]
    busy_values = [float(b) for b in busy_values if isinstance(b, (int, float))]
    busy = float(np.mean(busy_values)) if busy_values else None
    distributed = distributed_summary(rank_runs, ranks)
    expected = distributed.get("world_size")
    if expected and expected > len(rank_runs):
        warn(f"merged {len(rank_runs)} of {expected} ranks (the others' runs or traces are not in this folder: "
             "collect every node's ranks/ into one folder and run `opscope analyze FOLDER`)")
    ctx = Context(ops=from_frame(ops), events={}, peaks=peaks, gpu=gpu, source=str(first.meta.get("source")),
                  steps=steps, step_time_us=step_time, device_busy_share=busy, meta=first.meta, ranks=ranks)
    findings = merge_findings(rank_runs) + run_rules(ctx, only=["straggler"])
    findings.sort(key=lambda f: (f.get("est_savings_us") is None, -(f.get("est_savings_us") or 0.0)))
    gpu_keys = {"comm_compute_overlap_share": distributed["comm_compute_overlap_share"]} if gpu else None
    summary = summarize(from_frame(ops), steps=steps, step_time_us=step_time, n_findings=len(findings), busy=busy,
                        gpu_keys=gpu_keys)
    summary["distributed"] = distributed
    meta = dict(first.meta)
    meta.update(target=target, steps=steps)
    meta.pop("rank", None)
    meta["distributed"] = {"world_size": expected, "ranks": [r.rank for r in rank_runs],
                           "backend": distributed.get("backend"), "trace_rank": rank_runs[0].rank}
    first_modules = first.modules
    classes = (dict(zip(first_modules["module"], first_modules["module_class"], strict=True))
               if first_modules is not None else None)
    return Run(meta=meta, ops=from_frame(ops), findings=findings, summary=summary, ranks=from_frame(ranks),
               modules=module_table(from_frame(ops), findings, classes))


def merge_ops(tables: list[pd.DataFrame], peaks: Peaks, *, gpu: bool) -> pd.DataFrame:
    """One ops table over all ranks: rows with the same key (op, inputs, source line, module; GPU kernel rows
    also their launcher) summed (calls, time, CPU time), roofline columns recomputed from the sums; plus
    `ranks` (how many ranks ran the row), `slowest_rank` and `time_us_max_rank` (its time there)."""
    columns = list(dict.fromkeys([*(c for t in tables for c in t.columns if c != "_rank"), *CONTRACT_COLUMNS]))
    rows = pd.concat(tables, ignore_index=True, sort=False)
    # module (and launcher) only where the ranks' tables have them: runs written before module paths lack it
    key = [k for k in KEY if k in CONTRACT_COLUMNS or k in rows.columns]
    key += ["launcher"] if "launcher" in rows.columns else []
    for k in key:
        rows[k] = rows[k].fillna("").astype(str)
    codes = np.asarray(group_codes([rows[k].tolist() for k in key]), dtype=np.int64)
    g = int(codes.max()) + 1 if len(codes) else 0
    first = np.full(g, len(codes), dtype=np.int64)  # each group's first row (groups are numbered in that order)
    np.minimum.at(first, codes, np.arange(len(codes)))
    table = rows.iloc[first].reset_index(drop=True)
    time = rows["time_us_total"].to_numpy(dtype=float)
    for col in ("calls", "time_us_total", "cpu_time_us_total"):
        if col in rows.columns:
            table[col] = np.bincount(codes, weights=rows[col].fillna(0.0).to_numpy(dtype=float), minlength=g)
    order = np.lexsort((time, codes))  # within each group, ascending time: the group's last is its slowest
    last = np.zeros(g, dtype=np.int64)
    last[codes[order]] = order
    table["ranks"] = np.bincount(codes, minlength=g)
    table["slowest_rank"] = rows["_rank"].to_numpy()[last] if g else []
    table["time_us_max_rank"] = time[last] if g else []
    total = float(table["time_us_total"].sum())
    table["time_share"] = table["time_us_total"] / total if total > 0 else 0.0
    had_kernels = "kernels" in table.columns
    if not had_kernels:
        table["kernels"] = ""
    table["kernels"] = table["kernels"].fillna("")
    for col in ("family", "dtype"):
        table[col] = table[col].fillna("") if col in table.columns else ""
    table = add_roofline(table, peaks, gpu=gpu)
    if not had_kernels:
        table = table.drop(columns=["kernels"])
    table = table.sort_values("time_us_total", ascending=False, kind="stable").reset_index(drop=True)
    return table[[c for c in columns if c in table.columns] + MERGED_OP_COLUMNS]


def ranks_table(rank_runs: list[RankRun]) -> pd.DataFrame:
    """ranks.csv: one row per rank (module docstring), the straggler marked."""
    rows = []
    for r in rank_runs:
        s = r.stats
        rows.append({"rank": r.rank, "steps": s.get("steps"), "step_time_us": s.get("step_time_us"),
                     "op_time_us": s.get("op_time_us"), "collective_time_us": s.get("collective_time_us"),
                     "compute_time_us": s.get("compute_time_us"), "idle_time_us": s.get("idle_time_us"),
                     "comm_compute_overlap_share": s.get("comm_compute_overlap_share"), "straggler": 0,
                     "device": str((r.run.meta.get("device") or {}).get("name") or ""), "run": r.folder})
    df = pd.DataFrame(rows, columns=RANK_COLUMNS)
    compute = pd.to_numeric(df["compute_time_us"], errors="coerce")
    if compute.notna().any():
        df.loc[compute.idxmax(), "straggler"] = 1
    return df


def _spread(values: pd.Series) -> float | None:
    values = pd.to_numeric(values, errors="coerce").dropna()
    med = float(values.median()) if len(values) else 0.0
    return float(values.max() - values.min()) / med if med > 0 else None


def distributed_summary(rank_runs: list[RankRun], ranks: pd.DataFrame) -> dict[str, Any]:
    """summary.json "distributed" (README, "Run directory format")."""
    rank_steps = int(pd.to_numeric(ranks["steps"], errors="coerce").fillna(1).clip(lower=1).sum())
    compute = pd.to_numeric(ranks["compute_time_us"], errors="coerce")
    step = pd.to_numeric(ranks["step_time_us"], errors="coerce")
    slow = int(compute.idxmax()) if compute.notna().any() else 0
    median = float(compute.median()) if compute.notna().any() else None
    worlds = [r.stats.get("world_size") for r in rank_runs if isinstance(r.stats.get("world_size"), int)]
    backends = [r.stats.get("backend") for r in rank_runs if r.stats.get("backend")]
    overlaps = [r.stats.get("comm_compute_overlap_share") for r in rank_runs]
    overlaps = [float(o) for o in overlaps if isinstance(o, (int, float))]
    mean_step = float(step.mean()) if step.notna().any() else 0.0
    coll = pd.to_numeric(ranks["collective_time_us"], errors="coerce")
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
    straggler = int(ranks["rank"].iloc[slow])
    return {
        "world_size": max(worlds) if worlds else len(rank_runs),
        "ranks": len(rank_runs),
        "steps_per_rank": int(pd.to_numeric(ranks["steps"], errors="coerce").median()),
        "backend": backends[0] if backends else None,
        "straggler_rank": straggler,
        "straggler_compute_time_us": float(compute.iloc[slow]) if median is not None else None,
        "compute_time_us_median": median,
        "straggler_excess_share": (float(compute.iloc[slow]) - median) / median if median else None,
        # beyond run-to-run noise: what the straggler finding fires on (opscope.findings.straggler)
        "straggler_beyond_noise": bool(median and (float(compute.iloc[slow]) - median) / median >= MIN_EXCESS),
        "compute_spread_share": _spread(compute),
        "step_time_us_min": float(step.min()) if step.notna().any() else None,
        "step_time_us_max": float(step.max()) if step.notna().any() else None,
        "step_time_spread_share": _spread(step),
        "collective_time_us": float(coll.mean()) if coll.notna().any() else None,
        "collective_time_share": float(coll.mean()) / mean_step if coll.notna().any() and mean_step > 0 else None,
        "idle_time_us": float(pd.to_numeric(ranks["idle_time_us"], errors="coerce").mean()),
        "comm_compute_overlap_share": float(np.mean(overlaps)) if overlaps else None,
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
    groups: dict[tuple, list[tuple[int, dict[str, Any]]]] = {}
    for r in rank_runs:
        for f in r.run.findings:
            groups.setdefault((f.get("rule"), f.get("op"), f.get("source_location")), []).append((r.rank, f))
    out = []
    for items in groups.values():
        best = max(items, key=lambda x: x[1].get("est_savings_us") or 0.0)[1]
        savings = [f.get("est_savings_us") for _, f in items]
        merged = dict(best)
        merged["message"] = f"{rank_list([r for r, _ in items])}: {best.get('message', '')}"
        merged["est_savings_us"] = float(sum(savings)) if all(isinstance(s, (int, float)) for s in savings) else None
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
def staging_folder(parent: Path):  # noqa: ANN201
    """A hidden folder beside the final run (same file system, so ranks/ moves in by rename), named like
    a run being written so that a killed process's leftovers are removed (opscope.run.discard_staging)."""
    made = not parent.exists()
    parent.mkdir(parents=True, exist_ok=True)
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


def rank_entries(folder: Path) -> list[Path]:
    """The per-rank inputs of a folder: run directories (a run's ranks/<r>/) and trace files
    (*.json, *.json.gz, e.g. torch's *.pt.trace.json); a merged run's folder stands for its ranks/."""
    if not folder.is_dir():
        raise TraceError(f"{folder} is not a folder")
    if is_run_dir(folder):
        if not (folder / "ranks").is_dir():
            raise TraceError(f"{folder} is the run directory of one process: analyze its trace.json.gz, or give a "
                             "folder of several ranks' traces or runs")
        folder = folder / "ranks"
    try:
        children = sorted(p for p in folder.iterdir() if not p.name.startswith("."))
    except OSError as exc:
        raise TraceError(f"cannot read {folder}: {exc.strerror or exc}") from exc
    entries = [p for p in children if is_run_dir(p) or (p.is_file() and p.name.endswith(TRACE_SUFFIXES))]
    if not entries:
        raise TraceError(f"{folder} holds no per-rank traces (*.json, *.json.gz) or run directories to merge")
    return entries


def rank_hint(path: Path) -> int | None:
    """A rank number in a file or folder name: `rank3.json.gz`, `trace_rank_3...`, or a folder `3/`."""
    name = path.name
    if path.is_dir() and name.isdigit():
        return int(name)
    m = RANK_NAME_RE.search(name)
    return int(m.group(1)) if m else None


def analyze_rank_folder(folder: Path, *, out: Path | None = None, peak_bw: float | None = None,
                        peak_flops: list[str] | None = None, warn: Callable[[str], None] = lambda m: None,
                        max_trace_gb: float | None = None) -> Run:
    """`opscope analyze FOLDER`: analyzes (or reads) each rank's trace or run directory, then merges."""
    from opscope.analysis.trace_file import analyze_trace_file

    base = DEFAULT_REPORTS_DIR.absolute()
    out = out.absolute() if out is not None else None
    check_out_dir(out, base)
    entries = rank_entries(folder)
    seen: set[str] = set()

    def warn_once(message: str) -> None:
        if message not in seen:
            seen.add(message)
            warn(message)

    with staging_folder(out.parent if out is not None else base) as staging:
        ranks_dir = staging / "ranks"
        ranks_dir.mkdir()
        rank_runs: list[RankRun] = []
        sources: dict[int, Path] = {}
        for i, entry in enumerate(entries):
            fallback = rank_hint(entry)
            if is_run_dir(entry):
                rr = _read_rank_dir(entry, fallback if fallback is not None else i, max_trace_gb)
                _claim(sources, rr.rank, entry)
                shutil.copytree(entry, ranks_dir / str(rr.rank))
            else:
                holder: dict[str, Any] = {}

                def finish(run: Run, trace: TraceData, hint: int = fallback if fallback is not None else i,
                           holder: dict[str, Any] = holder) -> None:
                    info = trace.distributed or {}
                    rank = info.get("rank") if isinstance(info.get("rank"), int) else hint
                    run.summary["rank"] = holder["stats"] = rank_stats(trace, run.summary, rank=rank)
                    run.meta["rank"] = rank

                pending = ranks_dir / f".entry-{i}"
                run = analyze_trace_file(entry, out=pending, peak_bw=peak_bw, peak_flops=peak_flops,
                                         warn=warn_once, max_trace_gb=max_trace_gb, finish=finish)
                stats = holder["stats"]
                _claim(sources, stats["rank"], entry)
                os.replace(pending, ranks_dir / str(stats["rank"]))
                rr = RankRun(stats["rank"], run, stats, "")
            rr.folder = f"ranks/{rr.rank}"
            rank_runs.append(rr)
        merged = merge_ranks(rank_runs, target=str(folder), warn=warn_once)
        write_merged(merged, ranks_dir, out=out, stem=_stem(folder), base=base)
    return merged


def _stem(folder: Path) -> str:
    name = folder.absolute().name
    parent = folder.absolute().parent.name
    return f"{parent}-{name}" if name == "ranks" and parent else name


def _claim(sources: dict[int, Path], rank: int, entry: Path) -> None:
    if rank in sources:
        raise TraceError(f"{sources[rank]} and {entry} are both rank {rank}: one folder must hold one job's ranks, "
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
        rank = info.get("rank") if isinstance(info.get("rank"), int) else fallback
        stats = rank_stats(trace, run.summary, rank=rank)
    return RankRun(int(stats["rank"]), run, stats, "")
