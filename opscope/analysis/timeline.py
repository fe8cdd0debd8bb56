"""The step timeline (timeline.json): what ran when, lane by lane, for the HTML report's Timeline section.

Lanes: one per CPU thread that ran ops (`cpu:<tid>`), with its outermost op rows (an op row no other op
row encloses: `aten::linear`, not the `aten::addmm` inside it), and one per GPU stream
(`gpu:<device>:<stream>`), with its kernels, copies and fills. Times are µs from the origin: the first
ProfilerStep annotation's start, else the trace's first event; what ended before it is left out. Each
segment names the ops.csv row it belongs to (an op row, or for a kernel the op row that launched it,
else its own kernel row; -1: none) and the finding whose op it is, if any (a CPU segment: the finding of any op row inside it).

Bounded whatever the trace's size: at most MAX_LANES lanes (the busiest) and LANE_SEGMENTS segments per
lane (TOTAL_SEGMENTS in all). Segments shorter than the lane's bin (its span over half its segment
budget: below a pixel of a plot of that many pixels) are merged with their neighbours in the same bin
into one segment that spans them, counting its members (`n`) and their summed time (`busy`), and
named after its longest member; longer ones are kept as they are. A lane whose segments still exceed
its budget (overlapping work) is redone with bins twice as wide. Names are cut to NAME_CHARS. The
memory curve (the allocated bytes of the run's device after each allocation and free) is kept as the
highest level in each of at most MEMORY_POINTS bins.

Memory of `opscope profile` comes from its untimed memory pass, a recording of its own: its times are
mapped step by step onto the timed pass's steps (linearly inside each step), so the curve shows where
in a step the memory rises and falls, not exact times.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from opscope.analysis.gpu_timeline import Windows, step_windows
from opscope.analysis.memory import MemoryProfile
from opscope.analysis.ops_table import KEY
from opscope.table import INDEX, Table, indexable, nrows, sort_order
from opscope.trace.reader import TraceData

FORMAT_VERSION = 1
MAX_LANES = 32
LANE_SEGMENTS = 3000
TOTAL_SEGMENTS = 12000
NAME_CHARS = 120
MEMORY_POINTS = 1000
MAX_STEPS = 200  # step boundaries kept (the first ones)
_EV_KEY = ("name",) + tuple(KEY[1:])  # the events' columns of an ops.csv row's key


def build_timeline(trace: TraceData, ev: Table, ops: Table, findings: list[dict[str, Any]],
                   memory: MemoryProfile | None = None) -> dict[str, Any] | None:
    """timeline.json's content (see the module docstring), or None for a trace with no op and no kernel."""
    windows = step_windows(trace)
    origin, origin_kind = _origin(trace, ev, windows)
    if origin is None:
        return None
    ev_rows = _event_rows(ev, ops)
    row_finding = _finding_rows(ops, findings)
    names: dict[str, int] = {}
    lanes = _cpu_lanes(ev, ev_rows, row_finding, origin) + _gpu_lanes(trace, ev, ops, ev_rows, row_finding, origin)
    dropped = max(len(lanes) - MAX_LANES, 0)
    if dropped:
        keep = sorted(range(len(lanes)), key=lambda i: -lanes[i]["busy_us"])[:MAX_LANES]
        lanes = [lanes[i] for i in sorted(keep)]
    budget = min(LANE_SEGMENTS, TOTAL_SEGMENTS // max(len(lanes), 1))
    out_lanes = [_aggregate(lane, budget, names) for lane in lanes]
    ends = [t + d for lane in out_lanes for t, d in zip(lane["ts"], lane["dur"], strict=True)]
    steps = [] if windows is None else [[_r(s - origin), _r(e - s)] for s, e in zip(*windows, strict=True)]
    span = max(ends + [s + d for s, d in steps], default=0.0)
    return {
        "format_version": FORMAT_VERSION,
        "origin_us": origin,
        "origin": origin_kind,
        "span_us": _r(span),
        "steps": steps[:MAX_STEPS],
        "names": list(names),
        "findings": [_finding_id(f, k) for k, f in enumerate(findings)],
        "lanes": out_lanes,
        "lanes_dropped": dropped,
        "memory": _memory_curve(memory, windows, origin, span),
    }


def _r(x: float) -> float:
    """µs to the ns the trace records: shorter JSON, no precision lost."""
    return round(float(x), 3)


def _finding_id(finding: dict[str, Any], index: int) -> str:
    fid = finding.get("id")
    return fid if isinstance(fid, str) and fid else str(index + 1)


def _origin(trace: TraceData, ev: Table, windows: Windows | None) -> tuple[float | None, str]:
    if windows is not None and windows[0]:
        return float(windows[0][0]), "first step"
    # each column's first time, not a list of every time (a float object an event)
    firsts = [t for t in (min((t for t in column if t == t), default=None) for column in (ev["ts"], trace.kernels["ts"]))
              if t is not None]
    return (float(min(firsts)), "first event") if firsts else (None, "")


# summary.json op_step_times_us: the rows (the first, by time) and steps (the first) kept, bounded in size
STEP_SAMPLE_ROWS = 40
STEP_SAMPLE_STEPS = 200


def row_step_times(trace: TraceData, ev: Table, ops: Table) -> list[dict[str, Any]]:
    """Per ops.csv row (the first STEP_SAMPLE_ROWS, which are the ones with the most time), its time in each
    profiled step (the first STEP_SAMPLE_STEPS ProfilerStep ranges): {"row", "times_us"}. A row event counts
    in the step its start lies in; none without step annotations. The samples `opscope gate` tests."""
    if not nrows(trace.steps) or "ts" not in ev:
        return []
    starts = sorted(float(t) for t in trace.steps["ts"])[:STEP_SAMPLE_STEPS]
    ends = sorted(float(t) + float(d) for t, d in zip(trace.steps["ts"], trace.steps["dur"], strict=True))
    ends = ends[:len(starts)]
    rows = _event_rows(ev, ops)
    keep = min(nrows(ops), STEP_SAMPLE_ROWS)
    times = [[0.0] * len(starts) for _ in range(keep)]
    for row, ts, t in zip(rows, ev["ts"], ev["time_us"], strict=True):
        if row < 0 or row >= keep or t != t:
            continue
        k = bisect_right(starts, float(ts)) - 1
        if k >= 0 and float(ts) < ends[k]:
            times[row][k] += float(t)
    return [{"row": i, "times_us": [round(x, 3) for x in times[i]]} for i in range(keep)]


def _event_rows(ev: Table, ops: Table) -> array[int]:
    """Per event, its ops.csv row when it is a row event (the key columns match), else -1 (a typed array: an
    int object an event, a few of them left in each small-object arena its list filled, held them all)."""
    n = nrows(ops)
    cols = [ops[c] if c in ops else [""] * n for c in KEY]
    index: dict[tuple[Any, ...], int] = {}
    for i, key in enumerate(zip(*cols, strict=True)):
        index.setdefault(key, i)
    m = nrows(ev)
    ecols = [ev[c] if c in ev else [""] * m for c in _EV_KEY]
    return array(INDEX, (index.get(key, -1) if row else -1
                         for key, row in zip(zip(*ecols, strict=True), ev["is_row"], strict=True)))


def _finding_rows(ops: Table, findings: list[dict[str, Any]]) -> dict[int, int]:
    """ops.csv row -> index of the first finding about it: the finding's op, at its source line and in its
    module when the finding names them."""
    out: dict[int, int] = {}
    n = nrows(ops)
    op, loc = ops["op"], ops["source_location"]
    module = ops["module"] if "module" in ops else [""] * n
    for k, f in enumerate(findings):
        name = f.get("op")
        if not isinstance(name, str) or not name:
            continue
        where, mod = f.get("source_location"), f.get("module")
        for i in range(n):
            if op[i] == name and (not where or loc[i] == where) and (mod is None or module[i] == mod):
                out.setdefault(i, k)
    return out


def _cpu_lanes(ev: Table, ev_rows: array[int], row_finding: dict[int, int], origin: float) -> list[dict[str, Any]]:
    # per event in typed arrays, and per lane too (_lane): a number object an event, made beside the timeline's
    # own, held the small-object arenas they filled (about 25 MiB of the 20x scaling trace)
    n = nrows(ev)
    if not n:
        return []
    is_row, row_parent = ev["is_row"], indexable(ev["row_parent"])
    captured = ev.get("captured")
    outer = array(INDEX, (i for i, r in enumerate(is_row) if r and row_parent[i] < 0 and not (captured and captured[i])))
    is_outer, mark = bytearray(n), array(INDEX, [-1]) * n
    for i in outer:
        is_outer[i] = 1
        mark[i] = row_finding.get(ev_rows[i], -1)
    # a finding about an op row inside an outermost one marks the outer one
    for j, r in enumerate(ev_rows):
        k = row_finding.get(r, -1) if r >= 0 else -1
        if k < 0 or row_parent[j] < 0:
            continue
        top = j
        while row_parent[top] >= 0:
            top = row_parent[top]
        if is_outer[top] and mark[top] < 0:
            mark[top] = k
    ev_ts, ev_dur, ev_end, names = indexable(ev["ts"]), indexable(ev["dur"]), indexable(ev["end"]), ev["name"]
    by_tid: dict[int, array[int]] = {}
    for i in outer:
        if ev_end[i] > origin and math.isfinite(ev_end[i]):
            by_tid.setdefault(int(ev["tid"][i]), array(INDEX)).append(i)
    lanes = []
    for tid, idx in by_tid.items():
        lanes.append(_lane(f"cpu:{tid}", "cpu", array("d", (ev_ts[i] for i in idx)), array("d", (ev_dur[i] for i in idx)),
                           [names[i] for i in idx], array(INDEX, (ev_rows[i] for i in idx)),
                           array(INDEX, (mark[i] for i in idx)), origin))
    return sorted(lanes, key=lambda lane: lane["first"])


def _gpu_lanes(trace: TraceData, ev: Table, ops: Table, ev_rows: array[int], row_finding: dict[int, int],
               origin: float) -> list[dict[str, Any]]:
    k = trace.kernels
    if not nrows(k):
        return []
    launcher = k["op"] if "op" in k else [-1] * nrows(k)
    row_anc = ev["row_anc"] if nrows(ev) else []
    kernel_rows = _kernel_rows(k, ops)
    by_stream: dict[tuple[int, int], array[int]] = {}
    for j, (t, d) in enumerate(zip(k["ts"], k["dur"], strict=True)):
        if t + d > origin and math.isfinite(t + d):
            by_stream.setdefault((int(k["device"][j]), int(k["stream"][j])), array(INDEX)).append(j)
    lanes = []
    for (device, stream), idx in sorted(by_stream.items()):
        rows = array(INDEX)
        for j in idx:
            op = launcher[j]
            rows.append(ev_rows[row_anc[op]] if op >= 0 and row_anc[op] >= 0 else kernel_rows.get(j, -1))
        lanes.append(_lane(f"gpu:{device}:{stream}", "gpu", array("d", (k["ts"][j] for j in idx)),
                           array("d", (k["dur"][j] for j in idx)), [k["name"][j] for j in idx], rows,
                           array(INDEX, (row_finding.get(r, -1) for r in rows)), origin))
    return lanes


def _kernel_rows(k: Table, ops: Table) -> dict[int, int]:
    """Kernel index -> its ops.csv kernel row, for the kernels no op row launched (a CUDA graph replay's):
    rows named by the kernel, its launcher and the launcher's source line (opscope.analysis.ops_table)."""
    if "kernel_row" not in k or "launcher_loc" not in k or "launcher" not in ops:
        return {}
    index: dict[tuple[str, str, str], int] = {}
    for i, key in enumerate(zip(ops["op"], ops["source_location"], ops["launcher"], strict=True)):
        index.setdefault(key, i)
    return {j: index.get((k["name"][j], k["launcher_loc"][j], k["launcher"][j]), -1)
            for j, flag in enumerate(k["kernel_row"]) if flag}


def _lane(lane_id: str, kind: str, ts: Sequence[float], dur: Sequence[float], names: Sequence[str],
          rows: Sequence[int], marks: Sequence[int], origin: float) -> dict[str, Any]:
    """A lane before aggregation: its segments in start order, clipped to start at the origin."""
    order = sort_order(len(ts), ((ts, False), (dur, True)))
    start = array("d", (max(float(ts[i]) - origin, 0.0) for i in order))
    end = array("d", (float(ts[i]) + float(dur[i]) - origin for i in order))
    return {"id": lane_id, "kind": kind, "start": start, "end": end, "names": [names[i] for i in order],
            "rows": array(INDEX, (int(rows[i]) for i in order)), "marks": array(INDEX, (int(marks[i]) for i in order)),
            "busy_us": sum(e - s for s, e in zip(start, end, strict=True)), "first": start[0] if start else 0.0}


def _aggregate(lane: dict[str, Any], budget: int, names: dict[str, int]) -> dict[str, Any]:
    """The lane's segments bounded by `budget` (see the module docstring); `names` collects the names."""
    start, end = lane["start"], lane["end"]
    span = (max(end) - min(start)) if start else 0.0
    width = span / max(budget // 2, 1)
    for _ in range(64):
        bounds = _bin_bounds(start, end, width)
        if len(bounds) // 2 <= budget:
            break
        width = width * 2 if width > 0 else 1e-3
    else:  # not reachable with finite times; kept bounded anyway
        bounds = bounds[:2 * budget]
    # the numbers in typed arrays until the end: made one by one between the loop's own objects, they held
    # the small-object arenas those filled
    ts, dur, busy = array("d"), array("d"), array("d")
    n, name_ids, row, finding = array(INDEX), array(INDEX), array(INDEX), array(INDEX)
    for g in range(0, len(bounds), 2):
        a, b = bounds[g], bounds[g + 1]
        s = start[a]
        e = max(end[a:b])
        longest = max(range(a, b), key=lambda i: end[i] - start[i])
        mark = next((m for m in lane["marks"][a:b] if m >= 0), -1)
        name = lane["names"][longest]
        name = name if len(name) <= NAME_CHARS else name[:NAME_CHARS - 1] + "…"
        ts.append(_r(s))
        dur.append(_r(e - s))
        busy.append(_r(sum(end[i] - start[i] for i in range(a, b))))
        n.append(b - a)
        name_ids.append(names.setdefault(name, len(names)))
        row.append(lane["rows"][longest])
        finding.append(mark)
    return {"id": lane["id"], "kind": lane["kind"], "events": len(start), "busy_us": _r(lane["busy_us"]),
            "bin_us": _r(width), "ts": ts.tolist(), "dur": dur.tolist(), "busy": busy.tolist(), "n": n.tolist(),
            "name": name_ids.tolist(), "row": row.tolist(), "finding": finding.tolist()}


def bins(start: Sequence[float], end: Sequence[float], width: float) -> list[tuple[int, int]]:
    """[a, b) index ranges of the segments (in start order) drawn as one: a segment at least `width` long
    alone; shorter ones together with the short ones after them that start within `width` of the
    group's first start."""
    bounds = _bin_bounds(start, end, width)
    return list(zip(bounds[0::2], bounds[1::2], strict=True))


def _bin_bounds(start: Sequence[float], end: Sequence[float], width: float) -> array[int]:
    """bins() as one array, a0, b0, a1, b1, ... (a tuple a group, a lane's first try a group a segment, filled
    small-object arenas)."""
    out = array(INDEX)
    open_at = -1  # first index of the open group of short segments
    for i, (s, e) in enumerate(zip(start, end, strict=True)):
        if e - s >= width:
            if open_at >= 0:
                out.extend((open_at, i))
                open_at = -1
            out.extend((i, i + 1))
        elif open_at < 0:
            open_at = i
        elif s >= start[open_at] + width:
            out.extend((open_at, i))
            open_at = i
    if open_at >= 0:
        out.extend((open_at, len(start)))
    return out


def _memory_curve(memory: MemoryProfile | None, windows: Windows | None, origin: float,
                  span: float) -> dict[str, Any] | None:
    """The memory curve on the timeline's clock, at most MEMORY_POINTS points (each bin's highest level);
    None without memory events, or when the memory pass's steps cannot be matched to the timed ones."""
    if memory is None or not memory.curve[0]:
        return None
    ts, level = memory.curve
    times: Iterable[float | None]
    if memory.summary.get("source") != "memory pass":  # the same recording: the same clock
        times = (t - origin for t in ts)
    else:
        if windows is None or memory.windows is None:
            return None
        times = _mapped(ts, memory.windows, windows, origin)
    # point by point, into typed arrays: a list of the points (a tuple and a float object each) filled
    # small-object arenas that the curve's own numbers then held
    width = span / MEMORY_POINTS if span > 0 else 1.0
    out_t, out_b = array("d"), array("d")
    last_bin = None
    for t, b in zip(times, level, strict=True):
        if t is None or not 0.0 <= t <= span or b != b:
            continue
        k = math.floor(t / width)
        if k != last_bin:
            out_t.append(_r(t))
            out_b.append(b)
            last_bin = k
        elif b > out_b[-1]:
            out_b[-1] = b
    if not out_t:
        return None
    return {"device": memory.summary.get("device"), "source": memory.summary.get("source"),
            "ts": out_t.tolist(), "bytes": out_b.tolist()}


def _mapped(ts: Sequence[float], src: Windows, dst: Windows, origin: float) -> Iterator[float | None]:
    """Times of the memory pass mapped into the timed pass's steps: the k-th step onto the k-th, linearly;
    a time outside every step of the memory pass (or past the timed steps) is None."""
    starts, ends = src
    for t in ts:
        k = bisect_right(starts, t) - 1
        if k < 0 or k >= len(dst[0]) or t > ends[k]:
            yield None
            continue
        s, e = starts[k], ends[k]
        s2, e2 = dst[0][k], dst[1][k]
        frac = (t - s) / (e - s) if e > s else 0.0
        yield s2 + frac * (e2 - s2) - origin
