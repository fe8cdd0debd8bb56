"""The HTML report's step timeline: timeline.json (opscope.analysis.timeline) as a plotly figure. One row
per lane (CPU threads, then GPU streams), one horizontal bar per segment (merged segments in grey), the
findings' ops as a magenta stripe inside their bars, the critical path of whatif.json as a red line along
the top of its lanes, and the memory curve in a subplot under it on the same time axis. Zoom and pan
act on time only.

An edited timeline.json that still follows the format (lists of other lengths, indices out of range)
draws what it can. Text: every name goes through plot_text (cleaned, HTML-escaped: plotly renders a subset of HTML in
labels). Size: timeline.json is bounded; the critical path, which a what-if replay may give at any
length, is merged here to at most CRITICAL_BINS segments per lane.
"""

from __future__ import annotations

import re
from typing import Any

from opscope import units
from opscope.render.text import plot_text
from opscope.run.model import Run
from opscope.units import number as num

COLORS = {"cpu": "#1f77b4", "gpu": "#2e9a3e", "copy": "#d9741a", "merged": "#9aa3b2"}
FINDING_COLOR = "#c2185b"
CRITICAL_COLOR = "#e4002b"
MEMORY_COLOR = "#7b4fc9"
CRITICAL_BINS = 2000
LANE_PX = 30
_COPY = re.compile(r"^(Memcpy|Memset|memcpy|memset)")


def lane_label(lane_id: str) -> str:
    kind, _, rest = lane_id.partition(":")
    if kind == "cpu":
        return f"CPU thread {rest}"
    device, _, stream = rest.partition(":")
    return f"GPU {device} stream {stream}" if kind == "gpu" else lane_id


def timeline_figure(run: Run) -> tuple[dict[str, Any], str] | None:
    """(plotly figure, caption) of the run's timeline; None when the run has none."""
    tl = run.timeline
    if not isinstance(tl, dict) or not tl.get("lanes"):
        return None
    lanes = tl["lanes"]
    names = tl.get("names") or []
    finding_ids = tl.get("findings") or []
    rules = [f.get("rule") for f in run.findings]
    index = {lane["id"]: k for k, lane in enumerate(lanes)}
    groups: dict[str, dict[str, list[Any]]] = {}
    marked: dict[str, list[Any]] = {"x": [], "base": [], "y": [], "customdata": [], "hovertext": []}
    for k, lane in enumerate(lanes):
        for ts, dur, busy, n, name_i, row, finding in zip(lane["ts"], lane["dur"], lane["busy"], lane["n"],
                                                          lane["name"], lane["row"], lane["finding"], strict=False):
            name = names[name_i] if 0 <= name_i < len(names) else "?"
            kind = "merged" if n > 1 else "copy" if lane["kind"] == "gpu" and _COPY.match(name) else lane["kind"]
            hover = _hover(name, ts, dur, busy, n, row, lane)
            if finding >= 0:
                fid = finding_ids[finding] if finding < len(finding_ids) else str(finding + 1)
                rule = rules[finding] if finding < len(rules) else ""
                hover += f"<br>finding {plot_text(fid)}: {plot_text(rule)}"
                for key, value in (("x", dur), ("base", ts), ("y", k), ("customdata", row), ("hovertext", hover)):
                    marked[key].append(value)
            g = groups.setdefault(kind, {"x": [], "base": [], "y": [], "customdata": [], "hovertext": []})
            for key, value in (("x", dur), ("base", ts), ("y", k), ("customdata", row), ("hovertext", hover)):
                g[key].append(value)
    legend = {"cpu": "CPU op", "gpu": "GPU kernel", "copy": "GPU copy / fill", "merged": "merged (below a pixel)"}
    traces: list[dict[str, Any]] = []
    for kind in ("cpu", "gpu", "copy", "merged"):
        if kind in groups:
            traces.append({"type": "bar", "orientation": "h", "name": legend[kind], "uid": f"timeline-{kind}",
                           **groups[kind], "width": 0.7, "hoverinfo": "text", "marker": {"color": COLORS[kind]}})
    if marked["x"]:
        traces.append({"type": "bar", "orientation": "h", "name": "a finding's op", "uid": "timeline-findings",
                       **marked, "width": 0.3, "hoverinfo": "text", "marker": {"color": FINDING_COLOR}})
    critical = critical_trace(run, index, float(num(tl.get("span_us")) or 0.0))
    if critical is not None:
        traces.append(critical)
    memory = _memory_trace(tl.get("memory"))
    if memory is not None:
        traces.append(memory)
    height = 110 + LANE_PX * len(lanes) + (170 if memory else 0)
    plot_share = 1.0 if memory is None else (LANE_PX * len(lanes) + 60) / (height - 50)
    layout: dict[str, Any] = {
        "height": height, "margin": {"l": 150, "r": 20, "t": 40, "b": 40}, "barmode": "overlay",
        "hovermode": "closest", "dragmode": "zoom", "bargap": 0, "legend": {"orientation": "h", "y": 1.0,
                                                                           "yanchor": "bottom"},
        "xaxis": {"title": {"text": f"µs since the {plot_text(tl.get('origin') or 'first event')}"},
                  "zeroline": False, "range": [0, float(num(tl.get("span_us")) or 1.0)]},
        "yaxis": {"tickvals": list(range(len(lanes))), "ticktext": [plot_text(lane_label(x["id"])) for x in lanes],
                  "autorange": "reversed", "fixedrange": True, "domain": [1.0 - plot_share, 1.0] if memory else [0, 1]},
        "shapes": [{"type": "line", "xref": "x", "yref": "paper", "x0": s[0], "x1": s[0], "y0": 0, "y1": 1,
                    "line": {"color": "#8a8f99", "width": 1, "dash": "dot"}} for s in (tl.get("steps") or [])[1:] if s],
        "font": {"size": 12},
    }
    if memory is not None:
        layout["yaxis2"] = {"domain": [0, max(1.0 - plot_share - 0.06, 0.05)], "fixedrange": True,
                            "title": {"text": "allocated"}, "tickformat": "~s", "ticksuffix": "B"}
        layout["xaxis"]["anchor"] = "y2"  # the time axis under the memory curve, shared by both
    return {"data": traces, "layout": layout}, _caption(run, tl, critical is not None, memory is not None)


def _hover(name: str, ts: float, dur: float, busy: float, n: int, row: int, lane: dict[str, Any]) -> str:
    where = f"{plot_text(lane_label(lane['id']))}, at {units.time_cell(ts)}"
    if n > 1:
        what = "ops" if lane["kind"] == "cpu" else "kernels"
        head = (f"<b>{n} {what} merged</b> (each under {units.time_cell(lane.get('bin_us'))})<br>"
                f"{units.time_cell(busy)} busy in {units.time_cell(dur)}; the longest: {plot_text(name)}")
    else:
        head = f"<b>{plot_text(name)}</b><br>{units.time_cell(dur)}"
    link = f"<br>op row #{row + 1} (click to select it)" if row >= 0 else ""
    return f"{head}<br>{where}{link}"


def critical_trace(run: Run, lanes: dict[str, int], span: float) -> dict[str, Any] | None:
    """The critical path of whatif.json as a red line along the top of each of its lanes; None without
    one. Segments on the same lane closer than span / CRITICAL_BINS are drawn as one."""
    path = run.whatif.get("critical_path") if isinstance(run.whatif, dict) else None
    if not isinstance(path, list):
        return None
    by_lane: dict[int, list[tuple[float, float, str]]] = {}
    for seg in path:
        if not isinstance(seg, dict) or seg.get("lane") not in lanes:
            continue
        ts, dur = num(seg.get("ts")), num(seg.get("dur"))
        if ts is None or dur is None or dur < 0:
            continue
        by_lane.setdefault(lanes[seg["lane"]], []).append((ts, ts + dur, str(seg.get("name") or "")))
    if not by_lane:
        return None
    gap = span / CRITICAL_BINS if span > 0 else 0.0
    x: list[float | None] = []
    y: list[float | None] = []
    hover: list[str] = []
    for k, segs in sorted(by_lane.items()):
        segs.sort()
        merged: list[list[Any]] = []  # [start, end, the longest segment's name, count, its length]
        for s, e, name in segs:
            if merged and s - merged[-1][1] <= gap:
                last = merged[-1]
                last[1] = max(last[1], e)
                last[3] += 1
                if e - s > last[4]:
                    last[2], last[4] = name, e - s
            else:
                merged.append([s, e, name, 1, e - s])
        for s, e, name, n, _ in merged:
            label = (f"<b>critical path</b><br>{plot_text(name)}" if n == 1 else
                     f"<b>critical path</b><br>{n} segments, the longest {plot_text(name)}")
            label += f"<br>{units.time_cell(s)} to {units.time_cell(e)}"
            x += [s, e, None]
            y += [k - 0.42, k - 0.42, None]
            hover += [label, label, ""]
    return {"type": "scatter", "mode": "lines", "name": "critical path (what-if)", "uid": "timeline-critical",
            "x": x, "y": y, "hovertext": hover, "hoverinfo": "text", "connectgaps": False,
            "line": {"color": CRITICAL_COLOR, "width": 4}}


def _memory_trace(memory: Any) -> dict[str, Any] | None:
    if not isinstance(memory, dict) or not memory.get("ts"):
        return None
    device = plot_text(memory.get("device") or "device")
    hover = [f"{units.si(b, 'B')} allocated ({device}) at {units.time_cell(t)}" for t, b in zip(memory["ts"], memory["bytes"],
                                                                                       strict=False)]
    return {"type": "scatter", "mode": "lines", "name": f"memory allocated ({device})", "uid": "timeline-memory",
            "x": memory["ts"], "y": memory["bytes"], "yaxis": "y2", "hovertext": hover, "hoverinfo": "text",
            "line": {"color": MEMORY_COLOR, "width": 1.5, "shape": "hv"}}


def _caption(run: Run, tl: dict[str, Any], critical: bool, memory: bool) -> str:
    lanes = tl["lanes"]
    events = sum(int(lane.get("events") or 0) for lane in lanes)
    shown = sum(len(lane["ts"]) for lane in lanes)
    parts = [f"{len(lanes)} lanes, {events} ops and kernels drawn as {shown} bars"
             + (" (shorter ones merged: grey)" if shown < events else "") + "."]
    if tl.get("lanes_dropped"):
        parts.append(f"{tl['lanes_dropped']} less busy lanes are left out.")
    parts.append("Drag to zoom into time, double-click to zoom out; click a bar to select its op row.")
    parts.append("Magenta: a finding's op." if any(f >= 0 for lane in lanes for f in lane["finding"]) else
                 "No finding's op is on the timeline.")
    if critical:
        parts.append("Red line: the critical path of the what-if replay (whatif.json).")
    elif run.whatif is not None:
        parts.append("No critical path: whatif.json has none on these lanes.")
    else:
        parts.append("No critical path: this run has no what-if replay (whatif.json).")
    if memory:
        m = tl["memory"]
        parts.append("Under it: memory allocated" + (" (from profile's memory pass, its steps laid over these)"
                                                     if m.get("source") == "memory pass" else "") + ".")
    return " ".join(parts)
