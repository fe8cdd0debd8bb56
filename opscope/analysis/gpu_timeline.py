"""The GPU side of a run beyond per-op rows: where kernel time went by kernel family, how much of it a
CUDA/HIP graph replayed, how busy each stream was, how much communication overlapped compute, and the
longest idle gaps on the GPU timeline with the CPU op running during each.

All of it is read from trace.kernels after opscope.analysis.events attributed them (columns op,
kernel_row, graph_launch, family). The keys it returns go into summary.json as they are (README, "Run
directory format").
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from opscope.analysis.kernels import FAMILY_NAMES, OTHER
from opscope.trace import TraceData

TOP_GAPS = 5  # idle gaps listed
MIN_GAP_US = 1.0  # shorter gaps are launch latency, not idleness worth naming
COMM_FAMILY = "communication"
TRANSFER_CATS = ("gpu_memcpy", "gpu_memset")  # DMA transfers: neither communication nor compute


def merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals as sorted, disjoint (starts, ends)."""
    if not len(starts):
        return np.zeros(0), np.zeros(0)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > reach[:-1]
    idx = np.flatnonzero(new)
    return s[idx], np.append(reach[idx[1:] - 1], reach[-1])


def _length(starts: np.ndarray, ends: np.ndarray) -> float:
    return float((ends - starts).sum())


def _overlap_with(k_start: np.ndarray, k_end: np.ndarray, u_start: np.ndarray, u_end: np.ndarray) -> np.ndarray:
    """Per interval k, the time it shares with the disjoint sorted union u (prefix sums over u)."""
    if not len(u_start) or not len(k_start):
        return np.zeros(len(k_start))
    cum = np.concatenate([[0.0], np.cumsum(u_end - u_start)])

    def covered(t: np.ndarray) -> np.ndarray:  # union length in (-inf, t]
        i = np.searchsorted(u_start, t, side="right")  # unions starting at or before t
        full = cum[np.maximum(i - 1, 0)]
        last = np.where(i > 0, np.clip(t - u_start[np.maximum(i - 1, 0)], 0.0,
                                       (u_end - u_start)[np.maximum(i - 1, 0)]), 0.0)
        return np.where(i > 0, full + last, 0.0)

    return np.maximum(covered(k_end) - covered(k_start), 0.0)


def gpu_summary(trace: TraceData, ev: pd.DataFrame, *, steps: int, step_time_us: float) -> dict[str, Any]:
    """summary.json keys for a GPU run (empty for a CPU run): kernel_family_time_share,
    kernel_families_cover_share, unattributed_time_share, graph_replay (when a graph replayed kernels),
    streams, comm_compute_overlap_share, idle_gaps, gpu_only (when the trace has no CPU ops)."""
    k = trace.kernels
    if not len(k) or "family" not in k.columns:
        return {}
    dur = k["dur"].to_numpy(dtype=float)
    total = float(dur.sum())
    fam = k["family"].to_numpy(dtype=object)
    index = {f: i for i, f in enumerate(FAMILY_NAMES)}
    fam_code = np.fromiter((index[f] for f in fam.tolist()), dtype=np.int64, count=len(fam))
    by_family = np.bincount(fam_code, weights=dur, minlength=len(FAMILY_NAMES))
    shares = {f: float(by_family[i]) / total if total > 0 else 0.0 for i, f in enumerate(FAMILY_NAMES)}
    lost = (k["op"].to_numpy() < 0) & ~k["kernel_row"].to_numpy(dtype=bool)
    out: dict[str, Any] = {
        "kernel_family_time_share": shares,
        "kernel_families_cover_share": 1.0 - shares[OTHER] if total > 0 else 0.0,
        "unattributed_time_share": float(dur[lost].sum()) / total if total > 0 else 0.0,
    }
    graph = k["graph_launch"].to_numpy() >= 0
    if graph.any():
        replayed = k[graph]
        out["graph_replay"] = {
            "launches": int(replayed["graph_launch"].nunique()),
            "kernels": int(graph.sum()),
            "kernel_time_share": float(dur[graph].sum()) / total if total > 0 else 0.0,
            "launchers": [x for x in dict.fromkeys(replayed["launcher"].tolist()) if x][:5],
        }
    if "captured" in k.columns and k["captured"].to_numpy(dtype=bool).any():
        cap = k["captured"].to_numpy(dtype=bool)
        out.setdefault("graph_replay", {}).update(
            captured_kernels=int(cap.sum()),
            captured_time_share=float(dur[cap].sum()) / total if total > 0 else 0.0)
    start = k["ts"].to_numpy(dtype=float)
    end = start + dur
    window = steps * step_time_us
    out["streams"] = _streams(k, start, end, window)
    out["comm_compute_overlap_share"] = _comm_overlap(k, fam, start, end)
    out["idle_gaps"] = _idle_gaps(trace, ev, k, start, end)
    if trace.gpu_only:
        out["gpu_only"] = True
    return out


def _streams(k: pd.DataFrame, start: np.ndarray, end: np.ndarray, window: float) -> list[dict[str, Any]]:
    rows = []
    pairs = np.stack([k["device"].to_numpy(), k["stream"].to_numpy()], axis=1)
    uniques, codes = np.unique(pairs, axis=0, return_inverse=True)
    codes = codes.reshape(-1)
    for c, (device, stream) in enumerate(uniques.tolist()):
        sel = codes == c
        s, e = merge(start[sel], end[sel])
        busy = _length(s, e)
        rows.append({"device": int(device), "stream": int(stream), "kernels": int(sel.sum()),
                     "kernel_time_us": float((end[sel] - start[sel]).sum()), "busy_us": busy,
                     "busy_share": min(busy / window, 1.0) if window > 0 else None})
    rows.sort(key=lambda r: -r["busy_us"])
    return rows


def _comm_overlap(k: pd.DataFrame, fam: np.ndarray, start: np.ndarray, end: np.ndarray) -> float | None:
    """Share of communication kernel time during which a compute kernel (anything but communication and
    memcpy/memset) ran; None without communication kernels."""
    comm = fam == COMM_FAMILY
    if not comm.any():
        return None
    compute = ~comm & ~np.isin(k["cat"].to_numpy(dtype=object), TRANSFER_CATS)
    u_s, u_e = merge(start[compute], end[compute])
    comm_time = float((end[comm] - start[comm]).sum())
    if comm_time <= 0:
        return None
    return float(_overlap_with(start[comm], end[comm], u_s, u_e).sum()) / comm_time


def _idle_gaps(trace: TraceData, ev: pd.DataFrame, k: pd.DataFrame, start: np.ndarray,
               end: np.ndarray) -> list[dict[str, Any]]:
    """The TOP_GAPS longest stretches with no kernel on any stream, inside the profiled steps (between
    the first and last kernel when the trace has no step annotations)."""
    u_s, u_e = merge(start, end)
    gap_s, gap_e = u_e[:-1], u_s[1:]
    if len(trace.steps):  # a step that starts (or ends) with the GPU idle: that idle time counts too
        st = trace.steps["ts"].to_numpy(dtype=float)
        se = st + trace.steps["dur"].to_numpy(dtype=float)
        lead_s, lead_e, tail_s, tail_e = [], [], [], []
        for a, b in zip(st.tolist(), se.tolist(), strict=True):
            inside = np.flatnonzero((u_e > a) & (u_s < b))
            if not len(inside):
                lead_s.append(a)
                lead_e.append(b)
                continue
            lead_s.append(a)
            lead_e.append(max(a, float(u_s[inside[0]])))
            tail_s.append(min(b, float(u_e[inside[-1]])))
            tail_e.append(b)
        gap_s = np.concatenate([gap_s, lead_s, tail_s])
        gap_e = np.concatenate([gap_e, lead_e, tail_e])
        keep = np.zeros(len(gap_s), dtype=bool)
        for a, b in zip(st.tolist(), se.tolist(), strict=True):
            keep |= (gap_s >= a) & (gap_e <= b)
        gap_s, gap_e = gap_s[keep], gap_e[keep]
    length = gap_e - gap_s
    order = [i for i in np.argsort(-length, kind="stable").tolist() if length[i] >= MIN_GAP_US][:TOP_GAPS]
    if not order:
        return []
    origin = float(trace.steps["ts"].min()) if len(trace.steps) else float(start.min())
    by_end = np.argsort(end, kind="stable")
    by_start = np.argsort(start, kind="stable")
    names = k["name"].tolist()
    cpu = _CpuTimeline(trace, ev)
    out = []
    for i in order:
        a, b = float(gap_s[i]), float(gap_e[i])
        before = np.searchsorted(end[by_end], a, side="right") - 1
        after = np.searchsorted(start[by_start], b, side="left")
        op, where = cpu.during((a + b) / 2)
        out.append({"start_us": a - origin, "duration_us": b - a,
                    "kernel_before": names[by_end[before]] if before >= 0 else "",
                    "kernel_after": names[by_start[after]] if after < len(by_start) else "",
                    "cpu_op": op, "cpu_source_location": where})
    return out


class _CpuTimeline:
    """What ran on the CPU at a given time: the innermost op event holding it on a thread that launches
    GPU work (reported as its op row when it has one), else the innermost annotation holding it."""

    def __init__(self, trace: TraceData, ev: pd.DataFrame) -> None:
        self.ts = ev["ts"].to_numpy()
        self.end = ev["end"].to_numpy() if len(ev) else self.ts
        self.depth = ev["depth"].to_numpy() if len(ev) else self.ts
        live = np.ones(len(ev), dtype=bool)
        if "captured" in ev.columns:  # copies of a graph capture's ops did not run then
            live &= ~ev["captured"].to_numpy(dtype=bool)
        if len(ev) and len(trace.launches):
            launching = set(zip(trace.launches["pid"].tolist(), trace.launches["tid"].tolist(), strict=True))
            live &= np.fromiter(((p, t) in launching for p, t in zip(ev["pid"].tolist(), ev["tid"].tolist(),
                                                                      strict=True)), dtype=bool, count=len(ev))
        self.live = live
        self.ann = trace.annotations
        self.row_anc = ev["row_anc"].to_numpy() if len(ev) else self.ts
        self.names = ev["name"].to_numpy(dtype=object) if len(ev) else self.ts
        self.where = ev["source_location"].to_numpy(dtype=object) if len(ev) else self.ts

    def during(self, t: float) -> tuple[str, str]:
        idx = np.flatnonzero(self.live & (self.ts <= t) & (self.end >= t))
        if len(idx):
            i = int(idx[np.argmax(self.depth[idx])])
            row = int(self.row_anc[i])
            j = row if row >= 0 else i
            return str(self.names[j]), str(self.where[j])
        ann = self.ann
        if len(ann):
            a_ts = ann["ts"].to_numpy()
            holds = np.flatnonzero((a_ts <= t) & (a_ts + ann["dur"].to_numpy() >= t))
            if len(holds):
                return str(ann["name"].iat[int(holds[np.argmax(a_ts[holds])])]), ""
        return "", ""
