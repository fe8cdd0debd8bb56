"""The GPU side of a run beyond per-op rows: where kernel time went by kernel family, how much of it a
CUDA/HIP graph replayed, how busy each stream was, how much communication overlapped compute, and the
longest idle gaps on the GPU timeline with the CPU op running during each.

All of it is read from trace.kernels after opscope.analysis.events attributed them (columns op,
kernel_row, graph_launch, family). The keys it returns go into summary.json as they are
(opscope.run.schema.Summary).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import accumulate
from typing import Any

from opscope.table import Table, indexable, nrows, pairwise_sum
from opscope.trace.kernel_names import FAMILY_NAMES, OTHER
from opscope.trace.reader import TraceData

TOP_GAPS = 5  # idle gaps listed
MIN_GAP_US = 1.0  # shorter gaps are launch latency, not idleness worth naming
COMM_FAMILY = "communication"
TRANSFER_CATS = ("gpu_memcpy", "gpu_memset")  # DMA transfers: neither communication nor compute


def merge(starts: Sequence[float], ends: Sequence[float]) -> tuple[list[float], list[float]]:
    """The union of intervals as sorted, disjoint (starts, ends)."""
    if not len(starts):
        return [], []
    order = sorted(range(len(starts)), key=starts.__getitem__)
    out_s: list[float] = [float(starts[order[0]])]
    out_e: list[float] = []
    reach = float(ends[order[0]])  # the latest end so far
    for i in order[1:]:
        s, e = float(starts[i]), float(ends[i])
        if s > reach:  # starts after everything before it: a new interval
            out_e.append(reach)
            out_s.append(s)
        reach = max(reach, e)
    out_e.append(reach)
    return out_s, out_e


Windows = tuple[list[float], list[float]]  # sorted, disjoint (starts, ends)


def step_windows(trace: TraceData) -> Windows | None:
    """The profiled steps (ProfilerStep#N ranges) as sorted, disjoint windows; None without step
    annotations (then the whole trace is the one step, and nothing lies outside it)."""
    if not nrows(trace.steps):
        return None
    starts = [float(x) for x in trace.steps["ts"]]
    return merge(starts, [a + float(d) for a, d in zip(starts, trace.steps["dur"], strict=True)])


def clip(starts: Sequence[float], ends: Sequence[float], windows: Windows | None) -> tuple[list[float], list[float]]:
    """The parts of the intervals inside the windows, in order. An interval inside one window is kept as
    it is (the same numbers, so sums over a trace whose kernels all lie in its steps do not change); one
    across a window's edge is cut there; one outside every window is dropped. No windows: all kept."""
    if windows is None:
        return [float(s) for s in starts], [float(e) for e in ends]
    w_s, w_e = windows
    out_s: list[float] = []
    out_e: list[float] = []
    for s, e in zip(starts, ends, strict=True):
        s, e = float(s), float(e)
        i = bisect_right(w_s, s) - 1  # the last window starting at or before s
        if i >= 0 and e <= w_e[i]:
            out_s.append(s)
            out_e.append(e)
            continue
        j = max(i, 0)
        while j < len(w_s) and w_s[j] < e:
            a, b = max(s, w_s[j]), min(e, w_e[j])
            if b > a:
                out_s.append(a)
                out_e.append(b)
            j += 1
    return out_s, out_e


def time_inside(starts: Sequence[float], durations: Sequence[float], windows: Windows | None) -> list[float]:
    """Per interval [start, start + duration), its time inside the windows: its duration, exactly, when it
    lies inside one (start + duration - start loses digits at trace timestamps of ~1e12 µs)."""
    out = []
    for s, d in zip(starts, durations, strict=True):
        piece_s, piece_e = clip([s], [float(s) + float(d)], windows)
        whole = len(piece_s) == 1 and piece_s[0] == float(s) and piece_e[0] == float(s) + float(d)
        out.append(float(d) if whole else _length(piece_s, piece_e))
    return out


def _length(starts: Sequence[float], ends: Sequence[float]) -> float:
    return pairwise_sum([e - s for s, e in zip(starts, ends, strict=True)])


def _overlap_with(k_start: Sequence[float], k_end: Sequence[float], u_start: Sequence[float],
                  u_end: Sequence[float]) -> list[float]:
    """Per interval k, the time it shares with the disjoint sorted union u (prefix sums over u)."""
    if not len(u_start) or not len(k_start):
        return [0.0] * len(k_start)
    lengths = [e - s for s, e in zip(u_start, u_end, strict=True)]
    cum = [0.0]
    for x in lengths:
        cum.append(cum[-1] + x)

    def covered(t: float) -> float:  # union length in (-inf, t]
        i = bisect_right(u_start, t)  # unions starting at or before t
        if i == 0:
            return 0.0
        return cum[i - 1] + min(max(t - u_start[i - 1], 0.0), lengths[i - 1])

    return [max(covered(e) - covered(s), 0.0) for s, e in zip(k_start, k_end, strict=True)]


def gpu_summary(trace: TraceData, ev: Table, *, steps: int, step_time_us: float) -> dict[str, Any]:
    """summary.json keys for a GPU run (empty for a CPU run): kernel_family_time_share,
    kernel_families_cover_share, unattributed_time_share, backlog_kernels (when kernels launched before
    the trace ran in it), graph_replay (when a graph replayed kernels), streams (busy inside the steps),
    comm_compute_overlap_share, idle_gaps, gpu_only (when the trace has no CPU ops)."""
    k = trace.kernels
    if not nrows(k) or "family" not in k:
        return {}
    dur = [float(x) for x in k["dur"]]
    total = pairwise_sum(dur)
    fam = k["family"]
    by_family = dict.fromkeys(FAMILY_NAMES, 0.0)
    for f, d in zip(fam, dur, strict=True):
        by_family[f] += d
    shares = {f: by_family[f] / total if total > 0 else 0.0 for f in FAMILY_NAMES}
    backlog = k.get("backlog") or [False] * len(dur)
    lost = [d for d, op, row, b in zip(dur, k["op"], k["kernel_row"], backlog, strict=True)
            if op < 0 and not row and not b]
    windows = step_windows(trace)
    start = [float(x) for x in k["ts"]]
    end = [s + d for s, d in zip(start, dur, strict=True)]
    out: dict[str, Any] = {
        "kernel_family_time_share": shares,
        "kernel_families_cover_share": 1.0 - shares[OTHER] if total > 0 else 0.0,
        "unattributed_time_share": pairwise_sum(lost) / total if total > 0 else 0.0,
    }
    late = [i for i, b in enumerate(backlog) if b]
    if late:
        out["backlog_kernels"] = {
            "kernels": len(late),
            "kernel_time_us": pairwise_sum([dur[i] for i in late]),
            "in_steps_us": pairwise_sum(time_inside([start[i] for i in late], [dur[i] for i in late], windows)),
            "kernel_time_share": pairwise_sum([dur[i] for i in late]) / total if total > 0 else 0.0,
        }
    graph = [i for i, g in enumerate(k["graph_launch"]) if g >= 0]
    if graph:
        launch, launcher = k["graph_launch"], k["launcher"]
        out["graph_replay"] = {
            "launches": len({launch[i] for i in graph}),
            "kernels": len(graph),
            "kernel_time_share": pairwise_sum([dur[i] for i in graph]) / total if total > 0 else 0.0,
            "launchers": [x for x in dict.fromkeys(launcher[i] for i in graph) if x][:5],
        }
    cap = [i for i, c in enumerate(k["captured"]) if c] if "captured" in k else []
    if cap:
        out.setdefault("graph_replay", {}).update(
            captured_kernels=len(cap),
            captured_time_share=pairwise_sum([dur[i] for i in cap]) / total if total > 0 else 0.0)
    window = steps * step_time_us
    out["streams"] = _streams(k, start, end, window, windows)
    out["comm_compute_overlap_share"] = _comm_overlap(k, fam, start, end)
    out["idle_gaps"] = _idle_gaps(trace, ev, k, start, end)
    if trace.gpu_only:
        out["gpu_only"] = True
    return out


def _streams(k: Table, start: list[float], end: list[float], window: float,
             windows: Windows | None) -> list[dict[str, Any]]:
    """Per (device, stream): its kernels, their summed time, and busy time (the union of its kernels
    inside the profiled steps: a kernel before or after them is not the steps' work)."""
    members: dict[tuple[Any, Any], list[int]] = {}  # (device, stream) -> its kernels
    for i, pair in enumerate(zip(k["device"], k["stream"], strict=True)):
        members.setdefault(pair, []).append(i)
    rows: list[dict[str, Any]] = []
    for (device, stream), sel in sorted(members.items()):
        s, e = merge(*clip([start[i] for i in sel], [end[i] for i in sel], windows))
        busy = _length(s, e)
        rows.append({"device": int(device), "stream": int(stream), "kernels": len(sel),
                     "kernel_time_us": pairwise_sum([end[i] - start[i] for i in sel]), "busy_us": busy,
                     "busy_share": min(busy / window, 1.0) if window > 0 else None})
    rows.sort(key=lambda r: -r["busy_us"])
    return rows


def _comm_overlap(k: Table, fam: list[str], start: list[float], end: list[float]) -> float | None:
    """Share of communication kernel time during which a compute kernel (anything but communication and
    memcpy/memset) ran; None without communication kernels."""
    comm = [i for i, f in enumerate(fam) if f == COMM_FAMILY]
    if not comm:
        return None
    compute = [i for i, (f, c) in enumerate(zip(fam, k["cat"], strict=True))
               if f != COMM_FAMILY and c not in TRANSFER_CATS]
    u_s, u_e = merge([start[i] for i in compute], [end[i] for i in compute])
    c_s, c_e = [start[i] for i in comm], [end[i] for i in comm]
    comm_time = _length(c_s, c_e)
    if comm_time <= 0:
        return None
    return pairwise_sum(_overlap_with(c_s, c_e, u_s, u_e)) / comm_time


def _idle_gaps(trace: TraceData, ev: Table, k: Table, start: list[float],
               end: list[float]) -> list[dict[str, Any]]:
    """The TOP_GAPS longest stretches with no kernel on any stream, inside the profiled steps (between
    the first and last kernel when the trace has no step annotations)."""
    u_s, u_e = merge(start, end)
    gap_s, gap_e = u_e[:-1], u_s[1:]
    n_steps = nrows(trace.steps)
    if n_steps:  # a step that starts (or ends) with the GPU idle: that idle time counts too
        st = [float(x) for x in trace.steps["ts"]]
        se = [a + float(d) for a, d in zip(st, trace.steps["dur"], strict=True)]
        lead_s, lead_e, tail_s, tail_e = [], [], [], []
        for a, b in zip(st, se, strict=True):
            # the unions overlapping the step: they are sorted and disjoint, so a contiguous run
            first, stop = bisect_right(u_e, a), bisect_left(u_s, b)
            if first >= stop:
                lead_s.append(a)
                lead_e.append(b)
                continue
            lead_s.append(a)
            lead_e.append(max(a, u_s[first]))
            tail_s.append(min(b, u_e[stop - 1]))
            tail_e.append(b)
        gap_s = gap_s + lead_s + tail_s
        gap_e = gap_e + lead_e + tail_e
        # A gap is inside a step when some step starting at or before it ends at or after it: the
        # latest end among the steps that start by the gap's start decides (linear, not gaps x steps).
        by_start = sorted(range(len(st)), key=st.__getitem__)
        starts_sorted = [st[j] for j in by_start]
        reach = list(accumulate((se[j] for j in by_start), max))
        keep = [i for i, (gs, ge) in enumerate(zip(gap_s, gap_e, strict=True))
                if (j := bisect_right(starts_sorted, gs) - 1) >= 0 and reach[j] >= ge]
        gap_s, gap_e = [gap_s[i] for i in keep], [gap_e[i] for i in keep]
    length = [e - s for s, e in zip(gap_s, gap_e, strict=True)]
    order = [i for i in sorted(range(len(length)), key=lambda i: -length[i]) if length[i] >= MIN_GAP_US][:TOP_GAPS]
    if not order:
        return []
    origin = min(float(x) for x in trace.steps["ts"]) if n_steps else min(start)
    by_end = sorted(range(len(end)), key=end.__getitem__)
    by_start = sorted(range(len(start)), key=start.__getitem__)
    end_sorted = [end[i] for i in by_end]
    start_sorted = [start[i] for i in by_start]
    names = k["name"]
    cpu = _CpuTimeline(trace, ev)
    out = []
    for i in order:
        a, b = gap_s[i], gap_e[i]
        before = bisect_right(end_sorted, a) - 1
        after = bisect_left(start_sorted, b)
        op, where = cpu.during((a + b) / 2)
        # No op held the CPU: it ran the Python between ops; the op it started next says where that was
        next_op, next_where = cpu.next_op((a + b) / 2) if not op else ("", "")
        out.append({"start_us": a - origin, "duration_us": b - a,
                    "kernel_before": names[by_end[before]] if before >= 0 else "",
                    "kernel_after": names[by_start[after]] if after < len(by_start) else "",
                    "cpu_op": op, "cpu_source_location": where,
                    "cpu_next_op": next_op, "cpu_next_source_location": next_where})
    return out


class _CpuTimeline:
    """What ran on the CPU at a given time: the innermost op event holding it on a thread that launches
    GPU work (reported as its op row when it has one), else the innermost annotation holding it."""

    def __init__(self, trace: TraceData, ev: Table) -> None:
        n = nrows(ev)
        live = [True] * n
        if "captured" in ev:  # copies of a graph capture's ops did not run then
            live = [not c for c in ev["captured"]]
        if n and nrows(trace.launches):
            launching = set(zip(trace.launches["pid"], trace.launches["tid"], strict=True))
            live = [x and pt in launching for x, pt in zip(live, zip(ev["pid"], ev["tid"], strict=True), strict=True)]
        self.live = [i for i, x in enumerate(live) if x]
        self.ev = ev
        self.ann = trace.annotations

    def next_op(self, t: float) -> tuple[str, str]:
        """The first op the CPU started after `t` on a thread that launches GPU work (the outermost of
        those starting then; as its op row when it has one), or ("", "")."""
        ts, depth = indexable(self.ev["ts"]), self.ev["depth"]
        best, best_ts, best_depth = -1, math.inf, 0
        for i in self.live:  # a scan per gap (a few), as during(): no per-event structure on a large trace
            x = ts[i]
            if t < x < best_ts or (x == best_ts and depth[i] < best_depth):
                best, best_ts, best_depth = i, x, depth[i]
        return self._shown(best) if best >= 0 else ("", "")

    def _shown(self, i: int) -> tuple[str, str]:
        """Event i's op row's name and line (the event's own when it is in no row)."""
        row = int(self.ev["row_anc"][i])
        k = row if row >= 0 else i
        return str(self.ev["name"][k]), str(self.ev["source_location"][k])

    def during(self, t: float) -> tuple[str, str]:
        ev = self.ev
        best, best_depth = -1, None
        if self.live:
            ts, end, depth = indexable(ev["ts"]), indexable(ev["end"]), ev["depth"]
            for i in self.live:  # the first of the deepest events holding t
                if ts[i] <= t <= end[i] and (best_depth is None or depth[i] > best_depth):
                    best, best_depth = i, depth[i]
        if best >= 0:
            return self._shown(best)
        ann = self.ann
        if nrows(ann):
            holder, latest = -1, None
            for i, (a, d) in enumerate(zip(ann["ts"], ann["dur"], strict=True)):
                if a <= t <= a + d and (latest is None or a > latest):
                    holder, latest = i, a
            if holder >= 0:
                return str(ann["name"][holder]), ""
        return "", ""
