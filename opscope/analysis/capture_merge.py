"""`opscope analyze REPLAY --capture CAPTURE`: maps the kernels of a CUDA/HIP graph replay back to the ops
(and shapes) that launched them while the graph was captured.

A replay trace records one graph launch and the hundreds of kernels it ran, with no op or shape behind
them. The trace recorded while the graph was captured (vLLM's and SGLang's profilers can record one)
has the ops, their shapes and Python stacks, and the launch calls each op made into the graph, but no
kernel ran then. The matching rule:

1. The capture trace is cut into captured graphs at each thread's `cudaStreamBeginCapture` /
   `cudaStreamEndCapture` (hip...) calls; without them the whole trace is one graph. A graph's launches
   are its kernel, memcpy and memset launch calls, in CPU order. A launch's kernel name is the launch
   record's own (ROCm's roctracer writes it), else that of a kernel the capture trace correlates with it.
2. Each graph launch of the replay, with its kernels in GPU start order, is matched to the first captured
   graph with as many kernel launches and, when the capture names its kernels, the same kernels (as a
   multiset). Copies and fills go by kind (memcpy, memset): a captured graph may have more of them than
   the replay shows (a copy of 0 bytes leaves no GPU record), not fewer.
3. Within the pair, the k-th replayed kernel named X is the k-th captured launch of X (kernel name and
   order within the graph), the k-th memcpy the k-th memcpy launch. A capture without kernel names
   (CUDA's runtime records do not carry them) is matched by order alone: the i-th kernel to start on the
   GPU is the i-th kernel launch.

Limits: a graph whose replayed kernels interleave across streams differently from the capture's launch
order can swap identical-name kernels between their ops (and, matched by order alone, any kernels: a
warning says when the replay used several streams); captured graphs with the same kernels but different
shapes (one graph per batch size) cannot be told apart, so the first is used and a warning says so:
record the capture of the batch size you replay. A replayed graph no captured graph matches keeps its
kernel rows (launcher, family, kernel), with a warning.

The result is an ordinary trace: each matched graph launch gets a copy of its captured graph's ops (and
Python frames) on a thread of its own, starting at the launch, with one launch call per kernel, so the
normal pipeline gives those kernels their ops, shapes, costs, roofline and findings. The copies' CPU
time is not the replay's: it counts as 0 (ops column `captured`), and they are placed in the replay's
step (column `replay_ts`).
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from opscope.analysis.events import GRAPH_LAUNCH_RE
from opscope.errors import TraceError
from opscope.table import Table, concat, from_records, nrows, take
from opscope.trace.reader import TraceData

BEGIN_RE = re.compile(r"StreamBeginCapture", re.IGNORECASE)
END_RE = re.compile(r"StreamEndCapture", re.IGNORECASE)
# Calls that put a node into a captured graph: kernel launches, async copies and fills.
LAUNCH_API_RE = re.compile(r"LaunchKernel|LaunchCooperativeKernel|cuLaunch|Memcpy|Memset", re.IGNORECASE)
_COPY_CAT = {"gpu_memcpy": "memcpy", "gpu_memset": "memset"}
COPY_KEYS = frozenset(_COPY_CAT.values())
COPY_THREAD_PID = -7_000_000  # synthetic threads of the graph copies: (COPY_THREAD_PID, -1 - graph)


@dataclass
class CaptureMerge:
    """What the merge did, for the run's summary and warnings."""

    graph_launches: int = 0
    merged_launches: int = 0
    kernels: int = 0
    captured_graphs: int = 0
    by_name: bool = True
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"graph_launches": self.graph_launches, "merged_launches": self.merged_launches,
                "kernels": self.kernels, "captured_graphs": self.captured_graphs,
                "matched_by": "kernel name and order" if self.by_name else "order"}


@dataclass
class _Graph:
    thread: tuple[int, int] | None  # None: the whole trace
    start: float
    end: float
    launches: list[int]  # capture.launches indices, CPU order
    names: list[str]  # per launch: "memcpy", "memset", or the kernel name ("" when the capture does not say)

    @property
    def named(self) -> bool:
        return all(self.names)

    def keys(self) -> list[str]:
        """Matching keys: kernel names, or "kernel" for every kernel when some are not named."""
        named = self.named
        return [n if named or n in COPY_KEYS else "kernel" for n in self.names]


def _node_key(name: str) -> str:
    """memcpy/memset nodes go by kind (their names differ between launch call and GPU record)."""
    return " ".join(name.split())


def _launch_name(api: str, kernel: str) -> str:
    lowered = api.lower()
    if "memcpy" in lowered:
        return "memcpy"
    if "memset" in lowered:
        return "memset"
    return _node_key(kernel)


def captured_graphs(capture: TraceData) -> list[_Graph]:
    """The captured graphs of a capture trace, each with its launches in CPU order (rule 1)."""
    cl = capture.launches
    n = nrows(cl)
    if not n:
        raise TraceError(f"{capture.path} has no launch calls: not a trace recorded during graph capture")
    names = cl["name"]
    kernel_arg = cl["kernel"] if "kernel" in cl else [""] * n
    by_corr: dict[int, str] = {}
    k = capture.kernels
    for corr, name in zip(k["correlation"], k["name"], strict=True):
        by_corr.setdefault(corr, name)
    corr = cl["correlation"]
    pid, tid, ts = cl["pid"], cl["tid"], cl["ts"]
    end = [t + d for t, d in zip(ts, cl["dur"], strict=True)]
    is_launch = [bool(LAUNCH_API_RE.search(n)) and not GRAPH_LAUNCH_RE.search(n) for n in names]
    launch_name = [_launch_name(n, kernel_arg[i] or by_corr.get(corr[i], "")) if is_launch[i] else ""
                   for i, n in enumerate(names)]
    order = sorted(range(n), key=lambda i: ts[i])
    spans: list[tuple[tuple[int, int] | None, float, float]] = []
    open_at: dict[tuple[int, int], float] = {}
    for i in order:
        if BEGIN_RE.search(names[i]):
            open_at[(pid[i], tid[i])] = ts[i]
        elif END_RE.search(names[i]) and (pid[i], tid[i]) in open_at:
            spans.append(((pid[i], tid[i]), open_at.pop((pid[i], tid[i])), end[i]))
    if not spans:
        spans = [(None, -math.inf, math.inf)]
    graphs = []
    for thread, a, b in spans:
        members = [i for i in order if is_launch[i] and a <= ts[i] <= b
                   and (thread is None or (pid[i], tid[i]) == thread)]
        if members:
            graphs.append(_Graph(thread, a, b, members, [launch_name[i] for i in members]))
    if not graphs:
        raise TraceError(f"{capture.path} has no kernel launches inside a graph capture: nothing to map "
                         "replayed kernels to")
    return graphs


def merge_capture(replay: TraceData, capture: TraceData) -> tuple[TraceData, CaptureMerge]:
    """The replay trace with each matched graph launch's kernels linked to a copy of the captured graph's
    ops (module docstring), and what was matched."""
    report = CaptureMerge()
    graphs = captured_graphs(capture)
    report.captured_graphs = len(graphs)
    rl, rk = replay.launches, replay.kernels
    graph_idx = [i for i, n in enumerate(rl["name"]) if GRAPH_LAUNCH_RE.search(n)]
    report.graph_launches = len(graph_idx)
    if not graph_idx:
        report.warnings.append(f"--capture: {replay.path} has no CUDA/HIP graph launches; the capture trace is "
                               "not used")
        return replay, report
    corr_of = {i: rl["correlation"][i] for i in graph_idx}
    kernels_of: dict[int, list[int]] = defaultdict(list)
    k_corr = rk["correlation"]
    launch_by_corr = {c: i for i, c in corr_of.items()}
    for j, c in enumerate(k_corr):
        if c in launch_by_corr:
            kernels_of[launch_by_corr[c]].append(j)
    k_ts = rk["ts"]
    k_key = [_COPY_CAT.get(c, "") or _node_key(n) for c, n in zip(rk["cat"], rk["name"], strict=True)]
    graph_keys = [g.keys() for g in graphs]
    signatures = [Counter(keys) for keys in graph_keys]
    report.by_name = all(g.named for g in graphs)

    new_ops: list[Table] = []
    new_py: list[Table] = []
    new_mods: list[Table] = []
    new_launches: list[dict[str, Any]] = []
    new_corr = list(k_corr)
    captured = [False] * len(k_corr)
    replay_launch = [-1] * len(k_corr)
    next_corr = int(max([*k_corr, *rl["correlation"], *capture.launches["correlation"], 0])) + 1
    ambiguous = unmatched = 0
    multi_stream = False
    cl = capture.launches
    for copy_no, li in enumerate(graph_idx):
        ks = sorted(kernels_of.get(li, []), key=lambda j: k_ts[j])
        if not ks:
            continue
        fits = [i for i, g in enumerate(graphs) if _fits(_replay_keys([k_key[j] for j in ks], g.named), signatures[i])]
        if not fits:
            unmatched += 1
            continue
        if len(fits) > 1:
            ambiguous += 1
        g = graphs[fits[0]]
        queues: dict[str, deque[int]] = defaultdict(deque)
        for pos, key in enumerate(graph_keys[fits[0]]):
            queues[key].append(pos)
        positions = [queues[key].popleft() for key in _replay_keys([k_key[j] for j in ks], g.named)]
        if not g.named:
            multi_stream |= len({rk["stream"][j] for j in ks}) > 1
        thread = (COPY_THREAD_PID, -1 - copy_no)
        launch_ts = float(rl["ts"][li])
        shift = launch_ts - _segment_start(capture, g)
        new_ops.append(_copy_ops(capture, g, thread, shift, launch_ts))
        new_py.append(_copy_frames(capture.python, g, thread, shift))
        new_mods.append(_copy_frames(capture.modules, g, thread, shift))
        for j, pos in zip(ks, positions, strict=True):
            c = g.launches[pos]
            new_launches.append({"name": cl["name"][c], "pid": thread[0], "tid": thread[1],
                                 "ts": float(cl["ts"][c]) + shift, "dur": float(cl["dur"][c]),
                                 "correlation": next_corr, "ext_id": -1, "kernel": ""})
            new_corr[j] = next_corr
            captured[j] = True
            replay_launch[j] = li
            next_corr += 1
        report.merged_launches += 1
        report.kernels += len(ks)
    if unmatched:
        sizes = sorted({len(g.launches) for g in graphs})
        report.warnings.append(
            f"--capture: {unmatched} of {len(graph_idx)} graph launch(es) match no captured graph (captured graphs "
            f"have {', '.join(map(str, sizes[:6]))} launches{' with other kernels' if report.by_name else ''}); "
            "their kernels stay rows by (launcher, kernel family, kernel)")
    if ambiguous:
        report.warnings.append(
            f"--capture: {ambiguous} graph launch(es) match several captured graphs with the same kernels; the first "
            "is used, whose shapes may differ (one graph per batch size?): record the capture of the graph you replay")
    if multi_stream:
        report.warnings.append("--capture: the capture trace names no kernels, so replayed kernels were matched by "
                               "order alone, and the replay ran them on several streams: kernels of parallel "
                               "branches may be credited to each other's ops")
    if not report.merged_launches:
        return replay, report
    merged = _with_copies(replay, new_ops, new_py, new_mods, new_launches)
    merged.kernels = {**rk, "correlation": new_corr,
                      "ext_id": [-1 if c else x for c, x in zip(captured, rk["ext_id"], strict=True)],
                      "captured": captured, "replay_launch": replay_launch}
    return merged, report


def _replay_keys(keys: list[str], named: bool) -> list[str]:
    return keys if named else [k if k in COPY_KEYS else "kernel" for k in keys]


def _fits(replayed: list[str], captured: Counter[str]) -> bool:
    """Same kernels as the captured graph; no more copies/fills of a kind than it launched."""
    want = Counter(replayed)
    for key in set(want) | set(captured):
        have = captured.get(key, 0)
        if want.get(key, 0) > have or (key not in COPY_KEYS and want.get(key, 0) != have):
            return False
    return True


def _segment_start(capture: TraceData, g: _Graph) -> float:
    if math.isfinite(g.start):
        return g.start
    starts = [float(capture.launches["ts"][g.launches[0]])]
    if nrows(capture.ops):
        starts.append(float(min(capture.ops["ts"])))
    return min(starts)


def _moved(table: Table, rows: list[int], thread: tuple[int, int], shift: float) -> Table:
    """`rows` of `table` on `thread`, `shift` later."""
    out = take(table, rows)
    out["pid"] = [thread[0]] * len(rows)
    out["tid"] = [thread[1]] * len(rows)
    out["ts"] = [t + shift for t in out["ts"]]
    return out


def _copy_ops(capture: TraceData, g: _Graph, thread: tuple[int, int], shift: float, launch_ts: float) -> Table:
    ops = capture.ops
    ts, dur, pid, tid = ops["ts"], ops["dur"], ops["pid"], ops["tid"]
    rows = [i for i in range(nrows(ops)) if ts[i] >= g.start and ts[i] + dur[i] <= g.end
            and (g.thread is None or (pid[i], tid[i]) == g.thread)]
    out = _moved(ops, rows, thread, shift)
    for col in ("ext_id", "seq", "fwd_tid"):
        out[col] = [-1] * len(rows)
    out["captured"] = [True] * len(rows)
    out["replay_ts"] = [launch_ts] * len(rows)
    return out


def _copy_frames(py: Table, g: _Graph, thread: tuple[int, int], shift: float) -> Table:
    """The Python frames (or nn.Module calls) around the captured ops: those overlapping the capture (a
    frame opened before it began still encloses its ops)."""
    ts, dur, pid, tid = py["ts"], py["dur"], py["pid"], py["tid"]
    rows = [i for i in range(nrows(py)) if ts[i] <= g.end and ts[i] + dur[i] >= g.start
            and (g.thread is None or (pid[i], tid[i]) == g.thread)]
    return _moved(py, rows, thread, shift)


def _concat(tables: list[Table]) -> Table:
    """Rows of each table in turn, as pandas.concat: the columns of all tables in order of first
    appearance, NaN where a table lacks one."""
    return concat(tables, list(dict.fromkeys(c for t in tables for c in t)), lambda c: math.nan)


def _with_copies(replay: TraceData, ops: list[Table], py: list[Table], mods: list[Table],
                 launches: list[dict[str, Any]]) -> TraceData:
    n = nrows(replay.ops)
    base = {**replay.ops, "captured": [False] * n, "replay_ts": [math.nan] * n}
    all_ops = _concat([base, *ops])
    python = _concat([replay.python, *py]) if any(nrows(p) for p in py) else replay.python
    modules = _concat([replay.modules, *mods]) if any(nrows(m) for m in mods) else replay.modules
    new_l = from_records(launches, list(launches[0]))
    all_launches = _concat([replay.launches, new_l])
    return TraceData(path=replay.path, ops=all_ops, kernels=replay.kernels, launches=all_launches,
                     steps=replay.steps, python=python, annotations=replay.annotations,
                     device_properties=replay.device_properties, torch_version=replay.torch_version,
                     gpu_runtime=replay.gpu_runtime, distributed=replay.distributed, n_events=replay.n_events,
                     warnings=list(replay.warnings), modules=modules, memory=replay.memory,
                     opscope_block=replay.opscope_block)
