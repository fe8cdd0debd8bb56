"""`opscope report --html`: one self-contained HTML file. plotly.js is embedded from the installed
`plotly` package and the page fetches nothing: a Content-Security-Policy allows only its own inline
scripts (by hash) and no network at all (connect-src, img-src, font-src: none but data:).

Text safety: every string from the run (op names, shapes, file paths, module and kernel names, messages)
is cleaned of control characters (render.text) and then
- escaped with html.escape where the page is written here;
- set with textContent by the page's script (assets/report.js), never as HTML;
- HTML-escaped in the plot labels, which plotly renders as a small HTML subset;
- and in the embedded JSON, `<`, `>`, `&`, U+2028 and U+2029 are \\u-escaped, so no `</script>` or
  `<!--` inside a name can end or change the script element that holds it.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import html
import importlib.util
import json
import math
import os
import re
import stat
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from opscope import units
from opscope.errors import OpscopeError, OutputError
from opscope.render.console import ABOVE_PEAK_MARK, SUMS_NOTE, ceiling_warnings, threads_line, whatif_line
from opscope.render.ranks import STRAGGLER_MARK, collectives_line, header_line, rank_rows, straggler_line
from opscope.render.report_data import (
    BOUNDS,
    ROOT_MODULE,
    Share,
    binding_pct,
    breakdown,
    candidate_table,
    ceilings_line,
    gap_cpu,
    has_modules,
    kernels_by_op,
    measured_point,
    measured_text,
    memory_items,
    module_label,
    module_tree,
    op_name,
    op_shapes,
    short_location,
    step_line,
    steps_of,
    swap_check_table,
    swap_notes,
    swap_op_table,
    swap_table,
    text,
    verdict_line,
)
from opscope.render.text import clean, cleaned_run, plot_text
from opscope.render.timeline import timeline_figure
from opscope.run.compare import APPEARED, FASTER, SAME, SLOWER, VANISHED, Comparison
from opscope.run.model import Run, shown_path
from opscope.run.write import json_safe
from opscope.table import nrows, records
from opscope.trace.kernel_names import short_kernel_name
from opscope.units import UNKNOWN
from opscope.units import number as num
from opscope.version import __version__

PAGE_ROWS = 200  # table rows put in the DOM at a time; more as the reader scrolls
BOUND_COLORS = {"compute": "#2e9a3e", "memory": "#1f77b4", "overhead": "#d9741a", "unknown": "#8a8f99"}
CEILING_DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
CEILING_COLORS = ("#6c757d", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")
DEFAULT_NAME = "report.html"


def esc(value: Any) -> str:
    """Text for HTML (element content and quoted attribute values)."""
    return html.escape(clean(value), quote=True)


def script_json(obj: Any) -> str:
    """JSON that is safe inside a <script> element: no `<`, `>` or `&` (so no `</script>` or `<!--`),
    no U+2028/U+2029, ASCII only (a lone surrogate from a trace cannot break the file's UTF-8), and a
    number that is not finite (an edited run, an absurd trace value) written as null."""
    doc = json.dumps(json_safe(obj), ensure_ascii=True, allow_nan=False, separators=(",", ":"))  # NaN/inf: null
    return (doc.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _asset(name: str) -> str:
    return resources.files("opscope.render").joinpath("assets").joinpath(name).read_text(encoding="utf-8")


def plotly_js() -> str:
    """The plotly.js bundle of the installed plotly package, unchanged (as text)."""
    return plotly_bundle().decode("utf-8")


def plotly_bundle() -> bytes:
    """The plotly.js bundle of the installed plotly package, unchanged, as UTF-8 bytes. Read from the file
    plotly.offline.get_plotlyjs reads (package_data/plotly.min.js) without importing plotly, whose import
    costs more than rendering a report; through plotly itself if the file is not where it used to be. It
    stays bytes into the written file: 4.8 MB decoded, hashed and encoded again cost as much as a report."""
    spec = importlib.util.find_spec("plotly")
    locations = spec.submodule_search_locations if spec is not None else None
    path = Path(locations[0], "package_data", "plotly.min.js") if locations else None
    if path is not None and path.is_file():
        js = path.read_bytes()
    else:
        from plotly.offline import get_plotlyjs

        js = get_plotlyjs().encode("utf-8")
    if _CLOSES_SCRIPT_BYTES.search(js) or b"<!--" in js:  # cannot happen with plotly's own; never embed it if so
        raise OpscopeError("the installed plotly.js cannot be embedded in a <script> element")
    return js


_CLOSES_SCRIPT = re.compile("</script", re.IGNORECASE)
_CLOSES_SCRIPT_BYTES = re.compile(b"</script", re.IGNORECASE)


# --- the roofline ------------------------------------------------------------------------------


# (row index, row, arithmetic intensity, achieved FLOP/s): an op row's place on the roofline
_Point = tuple[int, dict[str, Any], float, float]


def _point_rows(run: Run) -> list[_Point]:
    """(row index, row, arithmetic intensity, achieved FLOP/s) of every op row with a place on a log-log
    roofline: FLOPs and bytes both known and positive, time positive."""
    out = []
    for i, row in enumerate(records(run.ops)):
        ai, gflops = num(row.get("arithmetic_intensity")), num(row.get("achieved_gflops"))
        if ai is not None and gflops is not None and ai > 0 and gflops > 0:
            out.append((i, row, ai, gflops * 1e9))
    return out


def _hover(row: dict[str, Any], steps: int) -> str:
    lines = [f"<b>{plot_text(row.get('op'))}</b>"]
    if text(row.get("module")):
        lines.append(f"module: {plot_text(row.get('module'))}")
    for key, label in (("input_dims", "shapes"), ("input_strides", "strides"), ("input_dtypes", "dtypes")):
        if text(row.get(key)):
            lines.append(f"{label}: {plot_text(row.get(key))}")
    calls = num(row.get("calls")) or 0
    lines.append(f"time: {units.time_cell(row.get('time_us_total'))} ({units.percent(row.get('time_share'), 100)}), "
                 f"{calls:.0f} calls, {units.time_cell((num(row.get('time_us_total')) or 0) / steps)} per step")
    bound = text(row.get("bound")) or "unknown"
    lines.append(f"{units.percent(binding_pct(row))} of peak ({plot_text(bound)}-bound, ceiling "
                 f"{plot_text(text(row.get('ceiling')) or '?')})")
    gflops, gbps, ai = num(row.get("achieved_gflops")), num(row.get("achieved_gbps")), num(row.get("arithmetic_intensity"))
    lines.append(f"{units.si(gflops * 1e9 if gflops is not None else None, 'FLOP/s')}, "
                 f"{units.si(gbps * 1e9 if gbps is not None else None, 'B/s')}, "
                 f"{UNKNOWN if ai is None else f'{ai:.3g}'} FLOP/B")
    lines.append(f"source: {plot_text(text(row.get('source_location')) or '?')}")
    return "<br>".join(lines)


def roofline_figure(run: Run) -> tuple[dict[str, Any], dict[str, list[float]], str]:
    """(plotly figure, {row index: [x, y]} of the plotted rows, caption). One marker per op row that has
    a place on the roofline (_point_rows), one trace per bound class, marker area by time share; the
    memory-bandwidth roof and one compute roof per dtype of the run's ceilings (those no plotted row
    uses start hidden: click their legend entry)."""
    run_points = _point_rows(run)
    steps = steps_of(run)
    shares = [num(r.get("time_share")) or 0.0 for _, r, _, _ in run_points]
    top_share = max(shares, default=0.0) or 1.0
    traces: list[dict[str, Any]] = []
    points: dict[str, list[float]] = {}
    for bound in BOUNDS:
        members = [(p, s) for p, s in zip(run_points, shares, strict=True)
                   if (text(p[1].get("bound")) if text(p[1].get("bound")) in BOUNDS else "unknown") == bound]
        if not members:
            continue
        for (i, _, x, y), _ in members:
            points[str(i)] = [x, y]
        traces.append({
            "type": "scatter", "mode": "markers", "name": bound, "uid": f"ops-{bound}",
            "x": [p[2] for p, _ in members], "y": [p[3] for p, _ in members],
            "customdata": [p[0] for p, _ in members],
            "hovertext": [_hover(p[1], steps) for p, _ in members], "hoverinfo": "text",
            "marker": {"color": BOUND_COLORS[bound], "opacity": 0.8, "sizemode": "diameter",
                       "size": [round(6 + 34 * math.sqrt(max(s, 0.0) / top_share), 2) for _, s in members],
                       "line": {"width": 1, "color": "rgba(255,255,255,0.7)"}},
        })
    measured = _measured_traces(run, points, steps)
    traces[:0] = _ceiling_traces(run, run_points)
    traces += measured
    layout = {
        "height": 540, "margin": {"l": 70, "r": 20, "t": 34, "b": 50}, "hovermode": "closest",
        "xaxis": {"type": "log", "title": {"text": "arithmetic intensity (FLOP / byte)"}, "exponentformat": "SI",
                  "dtick": 1},
        "yaxis": {"type": "log", "title": {"text": "achieved FLOP/s"}, "tickformat": "~s", "dtick": 1},
        "legend": {"orientation": "h", "y": -0.15},
        "font": {"size": 12},
    }
    rows = nrows(run.ops)
    caption = (f"{len(run_points)} of {rows} op rows have FLOPs and bytes and are on the plot, one point each; "
               f"the other {rows - len(run_points)} (views, copies and other 0-FLOP ops, ops without a cost "
               "model) are in the table.")
    if measured:
        caption += (f" {len(measured[-1]['x'])} op rows also have a measured point (open diamonds: FLOPs over the "
                    "DRAM bytes and time Nsight Compute measured), joined to their modeled point.")
    return {"data": traces, "layout": layout}, points, caption


def _measured_traces(run: Run, modeled: dict[str, list[float]], steps: int) -> list[dict[str, Any]]:
    """The Nsight Compute measurement of each op row that has one (report_data.measured_point), and a
    dotted segment from its modeled point, so the two are read side by side."""
    if "measured_dram_bytes_per_call" not in run.ops:
        return []
    xs, ys, rows, hover, seg_x, seg_y = [], [], [], [], [], []
    for i, row in enumerate(records(run.ops)):
        point = measured_point(row)
        if point is None:
            continue
        x, y, counted = point
        xs.append(x)
        ys.append(y)
        rows.append(i)
        flops = "measured CUDA-core FLOPs" if counted else "modeled FLOPs (tensor-core work is not in the counters)"
        hover.append(f"<b>{plot_text(row.get('op'))}</b> measured<br>{plot_text(measured_text(row))}<br>"
                     f"x, y: {flops} over measured DRAM bytes and time<br>"
                     f"source: {plot_text(text(row.get('source_location')) or '?')}")
        if str(i) in modeled:
            seg_x += [modeled[str(i)][0], x, None]
            seg_y += [modeled[str(i)][1], y, None]
    if not xs:
        return []
    return [
        {"type": "scatter", "mode": "lines", "name": "modeled → measured", "uid": "measured-links",
         "x": seg_x, "y": seg_y, "hoverinfo": "skip", "line": {"color": "#8a8f99", "width": 1, "dash": "dot"}},
        {"type": "scatter", "mode": "markers", "name": "measured (Nsight Compute)", "uid": "measured",
         "x": xs, "y": ys, "customdata": rows, "hovertext": hover, "hoverinfo": "text",
         "marker": {"symbol": "diamond-open", "size": 11, "color": "#c2185b", "line": {"width": 2}}},
    ]


def _ceiling_traces(run: Run, run_points: list[_Point]) -> list[dict[str, Any]]:
    peaks = run.meta.get("peaks") or {}
    origin = peaks.get("origin") or {}
    bw_gbps = num(peaks.get("memory_bandwidth_gbps"))
    flops = {k: v * 1e9 for k, v in (peaks.get("flops_gflops") or {}).items() if num(v) is not None and v > 0}
    bw = bw_gbps * 1e9 if bw_gbps is not None and bw_gbps > 0 else None
    ridges = [f / bw for f in flops.values()] if bw else []
    xs = [p[2] for p in run_points] + ridges
    x0 = min(xs, default=0.1) / 4
    x1 = max(xs, default=100.0) * 4
    used = {text(p[1].get("ceiling")) for p in run_points}
    shown = {d for d in flops if d in used} or set(flops)  # dtypes whose roof starts visible
    traces: list[dict[str, Any]] = []
    # The memory roof runs to the highest ridge of the visible dtypes; a hidden dtype whose ridge lies
    # further carries the rest of the slope in its own trace.
    bw_end = max((flops[d] / bw for d in shown), default=x1) if bw else x0
    if bw:
        traces.append({
            "type": "scatter", "mode": "lines", "uid": "ceiling-memory", "hoverinfo": "name",
            "name": plot_text(f"memory {units.si(bw, 'B/s')} ({origin.get('memory_bandwidth', '?')})"),
            "x": [x0, bw_end], "y": [x0 * bw, bw_end * bw], "line": {"color": "#6c757d", "width": 2},
        })
    for k, (dtype, peak) in enumerate(sorted(flops.items(), key=lambda kv: -kv[1])):
        ridge = peak / bw if bw else x0
        xs, ys = ([bw_end, ridge, x1], [bw_end * bw, peak, peak]) if bw and ridge > bw_end else ([max(ridge, x0), x1], [peak, peak])
        label = plot_text(f"{dtype} {units.si(peak, 'FLOP/s')}")
        traces.append({
            "type": "scatter", "mode": "lines+text", "uid": f"ceiling-{k}", "name": label, "hoverinfo": "name",
            "x": xs, "y": ys, "text": [""] * (len(xs) - 1) + [label], "textposition": "top left",
            "textfont": {"size": 11}, "visible": True if dtype in shown else "legendonly",
            "line": {"color": CEILING_COLORS[k % len(CEILING_COLORS)], "width": 1.5,
                     "dash": CEILING_DASHES[k % len(CEILING_DASHES)]},
        })
    return traces


def module_figure(run: Run) -> dict[str, Any] | None:
    """A treemap of inclusive time by module (modules.csv), when the run has module paths. The model and
    the ops outside it are the two top boxes."""
    nodes = module_tree(run)
    if not nodes:
        return None
    steps = steps_of(run)
    inclusive = {n.path: n.time_us for n in nodes}
    ids, parents, values, labels, hover = [], [], [], [], []
    children: dict[str, float] = {}
    for n in nodes:
        if n.depth > 0:
            up = n.path.rpartition(".")[0]
            children[up] = children.get(up, 0.0) + n.time_us
    for n in nodes:
        parent = n.path.rpartition(".")[0] if n.depth > 0 else None
        ids.append(n.path or ROOT_MODULE)
        parents.append("" if parent is None else (parent or ROOT_MODULE))
        values.append(max(inclusive[n.path] - children.get(n.path, 0.0), 0.0))  # self time: "remainder"
        labels.append(plot_text(n.path.rpartition(".")[2] if n.depth > 0 else (n.path or ROOT_MODULE), 60))
        what = f" ({plot_text(n.module_class)})" if n.module_class else ""
        hover.append(f"<b>{plot_text(n.path or ROOT_MODULE)}</b>{what}<br>{units.time_cell(n.time_us / steps)} per step "
                     f"(inclusive), {units.percent(n.share, 100)}")
    trace = {"type": "treemap", "ids": ids, "parents": parents, "values": values, "labels": labels,
             "hovertext": hover, "hoverinfo": "text", "branchvalues": "remainder", "maxdepth": 4,
             "textinfo": "label+percent root",
             "uid": "modules"}
    return {"data": [trace], "layout": {"height": 480, "margin": {"l": 0, "r": 0, "t": 10, "b": 0}}}


# --- the ops table -----------------------------------------------------------------------------


def _columns(run: Run) -> list[dict[str, Any]]:
    """The table's columns: what fits at 1280 px. The selected row's panel has the rest (dtypes, strides,
    time per call, kernels, ...); `title` names the detail field a cell's tooltip shows in full."""
    cols = [("rank", "#", "num", None), ("op", "op", "op", "op"), ("shapes", "input shapes", "shapes mono", "input_dims"),
            ("source", "source", "src mono", "source_location")]
    if has_modules(run):
        cols.append(("module", "module", "src mono", "module"))
    cols += [("calls", "calls", "num", None), ("time", "time", "num", None), ("share", "share", "num", None),
             ("flops", "FLOP/s", "num", None), ("bw", "B/s", "num", None), ("ai", "FLOP/B", "num", None),
             ("peak", "% peak", "num", None), ("bound", "bound", "", None)]
    if "kernels" in run.ops:
        cols.append(("cpu", "CPU time", "num", None))
    return [{"key": k, "label": label, "cls": cls, "num": "num" in cls.split(), "title": title}
            for k, label, cls, title in cols]


def _table_row(i: int, row: dict[str, Any], columns: list[dict[str, Any]]) -> dict[str, Any]:
    gflops, gbps = num(row.get("achieved_gflops")), num(row.get("achieved_gbps"))
    ai, peak = num(row.get("arithmetic_intensity")), num(binding_pct(row))
    calls, total = num(row.get("calls")), num(row.get("time_us_total"))
    per_call = num(row.get("time_us_per_call"))
    if per_call is None and total is not None and calls:
        per_call = total / calls
    kernels = [k for k in text(row.get("kernels")).split(";") if k]
    gpu_row = "cpu_time_us_total" in row
    bound = text(row.get("bound")) or "unknown"
    source = text(row.get("source_location"))
    cells = {
        "rank": (str(i + 1), i), "op": (op_name(row), text(row.get("op")).lower()),
        "shapes": (" ".join(op_shapes(row)), text(row.get("input_dims"))),
        "source": (short_location(source), source.lower()),
        "module": (module_label(row), module_label(row).lower()),
        "calls": (f"{calls:.0f}" if calls is not None else UNKNOWN, calls),
        "time": (units.time_cell(total), total),
        "share": (units.percent(row.get("time_share"), 100), num(row.get("time_share"))),
        "flops": (units.si(gflops * 1e9 if gflops is not None else None), gflops),
        "bw": (units.si(gbps * 1e9 if gbps is not None else None), gbps),
        "ai": (UNKNOWN if ai is None else f"{ai:.3g}", ai),
        "peak": (units.percent(peak) + (ABOVE_PEAK_MARK if peak is not None and peak > 100.0 else ""), peak),
        "bound": (bound, bound),
        "cpu": (units.time_cell(row.get("cpu_time_us_total")), num(row.get("cpu_time_us_total"))),
    }
    detail: dict[str, str | list[str]] = {
        key: text(row.get(key)) for key in ("op", "input_dims", "input_dtypes", "input_strides", "concrete_inputs",
                                            "source_location", "module", "family", "dtype", "ceiling", "note",
                                            "compiled_graph")}
    detail.update(kernels=kernels, bound=bound, cpu_time=units.time_cell(row.get("cpu_time_us_total")) if gpu_row else "",
                  time=f"{units.time_cell(total)} ({units.percent(row.get('time_share'), 100)}), {calls or 0:.0f} calls, "
                       f"{units.time_cell(per_call)} per call",
                  flops_per_call=units.si(row.get("flops_per_call")), bytes_per_call=units.si(row.get("bytes_per_call"), "B", 1024.0),
                  measured=measured_text(row),
                  rates=f"{units.gflops(gflops)}, {units.gbps(gbps)}, {cells['peak'][0]} of peak")
    return {"c": [cells[c["key"]][0] for c in columns], "k": [cells[c["key"]][1] for c in columns],
            "b": bound, "d": detail}


DETAIL_FIELDS = [("op", "op"), ("module", "module"), ("source_location", "source"), ("input_dims", "input shapes"),
                 ("input_dtypes", "input dtypes"), ("input_strides", "input strides"),
                 ("concrete_inputs", "concrete inputs"), ("time", "time"), ("cpu_time", "CPU time"),
                 ("rates", "achieved"),
                 ("flops_per_call", "FLOPs per call"), ("bytes_per_call", "bytes per call"), ("bound", "bound"),
                 ("family", "family"), ("dtype", "dtype"), ("ceiling", "ceiling"), ("note", "note"),
                 ("compiled_graph", "compiled graph"), ("measured", "measured"), ("kernels", "kernels")]


# --- the page ----------------------------------------------------------------------------------


def _header(run: Run) -> str:
    m, s = run.meta, run.summary
    device = m.get("device") or {}
    shares = s.get("bound_time_share")
    if not isinstance(shares, dict):
        shares = {}
    bounds = " ".join(f'<span class="b-{b}">{b} {esc(units.percent(shares.get(b), 100))}</span>' for b in BOUNDS)
    facts = [
        ("run", f"{esc(m.get('source'))}, {esc(m.get('mode'))}, {esc(m.get('dtype') or 'dtype unknown')}"),
        ("device", f"{esc(device.get('type'))}: {esc(device.get('name'))}"),
        ("ceilings", esc(ceilings_line(run))),
        *((("above peak", esc(" ".join(ceiling_warnings(run)))),) if ceiling_warnings(run) else ()),
        *((("threads", esc(threads_line(m) or "")),) if threads_line(m) else ()),
        ("torch", esc(m.get("torch_version") or "not recorded")),
        ("steps", esc(step_line(run))),
        ("op time", esc(f"{units.time_cell(s.get('total_time_us'))} in all; the cost model covers "
                        f"{units.percent(s.get('ops_covered_time_share'), 100)} of it")),
        ("bound", bounds),
    ]
    busy = num(s.get("device_busy_share"))
    if busy is not None:
        facts.append(("GPU busy", f'<span class="{"bad" if busy < 0.5 else ""}">{esc(units.percent(busy, 100))} of the step</span>'))
    fixes = whatif_line(s)
    if fixes is not None:
        facts.append(("what-if", f'<span id="whatif">{esc(fixes)}</span>'))
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)
    return (f'<header><h1>opscope report</h1><p class="target mono">{esc(m.get("target"))}</p>'
            f'<p id="verdict" class="verdict">{esc(verdict_line(run))}</p><dl class="facts">{dl}</dl></header>')


def _bars(title: str, shares: list[Share], steps: int, colored: bool = False, limit: int = 12) -> str:
    items = []
    for s in shares[:limit]:
        style = f"width:{s.share * 100:.1f}%" + (f";background:var(--{s.name})" if colored and s.name in BOUNDS else "")
        items.append(f'<span>{esc(s.name)}</span><span class="track"><span class="fill" style="{style}"></span></span>'
                     f'<span class="value">{esc(units.time_cell(s.time_us / steps))} per step · {esc(units.percent(s.share, 100))}</span>')
    more = f'<p class="muted">… {len(shares) - limit} more</p>' if len(shares) > limit else ""
    return f'<div><h3>{title}</h3><div class="bars">{"".join(items)}</div>{more}</div>'


def _breakdown(run: Run, modules: bool) -> str:
    steps = steps_of(run)
    parts = [_bars("By bound class", breakdown(run, "bound"), steps, colored=True),
             _bars("By op family", breakdown(run, "family"), steps)]
    if modules:
        module_part = ('<h3>By module (inclusive; click a box to zoom)</h3><div id="module-plot" role="img" '
                       'aria-label="treemap of time by module"></div>')
    else:
        module_part = '<h3>By module</h3><p class="muted">This run has no module paths.</p>'
    return f'<section id="breakdown"><h2>Time breakdown</h2><div class="cols">{"".join(parts)}</div>{module_part}</section>'


def _timeline(timeline: tuple[dict[str, Any], str] | None) -> str:
    if timeline is None:
        return ""
    return (f'<section id="timeline"><h2>Timeline</h2><p class="caption">{esc(timeline[1])}</p>'
            '<div id="timeline-plot" role="img" aria-label="step timeline: CPU threads and GPU streams as lanes, '
            'time across"></div></section>')


def _findings(run: Run) -> str:
    if not run.findings:
        return '<section id="findings"><h2>Findings</h2><p class="good">No findings.</p></section>'
    steps = steps_of(run)
    items = []
    for k, f in enumerate(run.findings):
        sev = text(f.get("severity"))
        sev_class = sev if sev in ("high", "medium", "low") else "low"
        saving = num(f.get("est_savings_us"))
        saves = f"saves ~{units.time_cell(saving / steps)} per step" if saving is not None else "saving unknown"
        where = text(f.get("source_location"))
        button = (f'<button type="button" data-filter="{esc(where)}">show ops at this line</button>'
                  if where else "")
        items.append(
            f'<article class="finding sev-{sev_class}" id="finding-{k + 1}"><div class="head">'
            f'<span class="sev">{esc(sev)}</span><span class="rule">{esc(f.get("rule"))}</span>'
            f'<code>{esc(where or f.get("op"))}</code><span class="saving">{esc(saves)}</span>{button}</div>'
            f'<p class="message">{esc(f.get("message"))}</p><p class="suggestion">→ {esc(f.get("suggestion"))}</p>'
            f'</article>')
    return (f'<section id="findings"><h2>Findings ({len(run.findings)}, by estimated saving)</h2>'
            f'{"".join(items)}</section>')


def _gaps(run: Run) -> str:
    gaps = run.summary.get("idle_gaps") or []
    if not gaps:
        return ""
    rows = []
    for g in gaps:
        cpu, where = gap_cpu(g)
        rows.append(f'<tr><td class="num">{esc(units.time_cell(g.get("duration_us")))}</td>'
                    f'<td class="num">+{esc(units.time_cell(g.get("start_us")))}</td><td class="op">{esc(cpu)}</td>'
                    f'<td class="mono">{esc(where)}</td>{_kernel_cell(g.get("kernel_before"))}'
                    f'{_kernel_cell(g.get("kernel_after"))}</tr>')
    return ('<section id="gaps"><h2>GPU idle gaps</h2><p class="caption">The longest stretches with no kernel on '
            'any stream, from the first step, and what the CPU ran meanwhile ("before OP": Python between ops, '
            'then OP at its line).</p><div class="table-wrap"><table><thead><tr><th class="num">idle</th>'
            '<th class="num">at</th><th>CPU in</th><th>source</th><th>after kernel</th><th>before kernel</th>'
            f'</tr></thead><tbody>{"".join(rows)}</tbody></table></div></section>')


def _kernel_cell(name: Any) -> str:
    """A kernel's short name, its whole name on hover (a template's signature runs to hundreds of characters)."""
    full = str(name or "—")
    return f'<td class="mono kern" title="{esc(full)}">{esc(short_kernel_name(full))}</td>'


def _kernels(run: Run) -> str:
    rows = kernels_by_op(run, 30)
    if not rows:
        return ""
    body = "".join(
        f'<tr><td class="num">{i + 1}</td><td class="op">{esc(op_name(row))}</td>'
        f'<td class="num">{esc(units.time_cell(row.get("time_us_total")))}</td><td><ul class="kernels mono">'
        + "".join(f"<li>{esc(k)}</li>" for k in names) + "</ul></td></tr>"
        for i, row, names in rows)
    return (f'<section id="kernels"><h2>Kernels of the top {len(rows)} GPU ops</h2><div class="table-wrap">'
            f'<table><thead><tr><th class="num">#</th><th>op</th><th class="num">time</th><th>kernels</th></tr>'
            f'</thead><tbody>{body}</tbody></table></div></section>')


def _memory(run: Run) -> str:
    items = memory_items(run)
    if not items:
        return ""
    dl = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in items)
    return f'<section id="memory"><h2>Memory</h2><dl class="facts">{dl}</dl></section>'


def _plain_table(columns: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f'<td{" class=bad" if c == "FAIL" else ""}>{esc(c)}</td>' for c in r) + "</tr>"
                   for r in rows)
    return f'<div class="table-wrap"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _candidates(run: Run) -> str:
    table = candidate_table(run)
    if table is None:
        return ""
    return ('<section id="candidates"><h2>Swap candidates</h2><p class="caption">Bundled kernels that could '
            "replace ops of this run, timed against those ops on the run's own shapes (profile): only those "
            "measured faster are suggestions; those slower here or not measured here are listed apart.</p>"
            f"{_plain_table(*table)}</section>")


def _swap(run: Run) -> str:
    swap = swap_table(run)
    if swap is None:
        return ""
    parts = [_plain_table(*swap)]
    notes = swap_notes(run)
    if notes:
        parts.append('<ul class="swap-notes">' + "".join(f"<li><b>{esc(k)}</b>: {esc(n)}</li>" for k, n in notes) + "</ul>")
    ops = swap_op_table(run)
    if ops is not None:
        parts.append("<h3>Op level: the original vs the kernel on the model's own calls</h3>" + _plain_table(*ops))
    checks = swap_check_table(run)
    if checks is not None:
        parts.append("<h3>Verification of the swaps that failed (comparisons and failed checks)</h3>"
                     + _plain_table(*checks))
    return f'<section id="swap"><h2>Swap results</h2>{"".join(parts)}</section>'


VERDICT_CLASS = {FASTER: "good", VANISHED: "good", SLOWER: "bad", APPEARED: "bad", SAME: "muted"}


def _comparison(c: Comparison | None, limit: int = 40) -> str:
    if c is None:
        return ""
    facts = [("A (baseline)", esc(c.run_a or c.target_a)), ("B (this run)", esc(c.run_b or c.target_b))]
    if c.step_ratio is not None:
        facts.append(("step time", f"{esc(units.time_cell(c.step_time_a_us))} → {esc(units.time_cell(c.step_time_b_us))}, "
                                   f"{c.step_ratio:.2f}x <span class=\"{VERDICT_CLASS.get(c.step_verdict or '', '')}\">"
                                   f"{esc(c.step_verdict)}</span>"))
    ratio = f"{c.op_time_ratio:.2f}x " if c.op_time_ratio is not None else ""
    facts.append(("op time per step", f"{esc(units.time_cell(c.op_time_a_us))} → {esc(units.time_cell(c.op_time_b_us))}, {ratio}"
                                      f"<span class=\"{VERDICT_CLASS[c.op_time_verdict]}\">{esc(c.op_time_verdict)}</span>"))
    facts.append(("noise band", esc(f"±{c.band:.0%} ({c.band_reason})")))
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)
    notes = "".join(f'<p class="bad">note: {esc(n)}</p>' for n in c.notes)
    changed = [x for x in c.ops if x.verdict != SAME][:limit]
    body = "".join(
        f'<tr><td class="op">{esc(op_name({"op": x.op}))}</td><td class="shapes mono">{esc(x.input_dims)}</td>'
        f'<td class="num">{"—" if x.verdict == APPEARED else esc(units.time_cell(x.time_a_us))}</td>'
        f'<td class="num">{"—" if x.verdict == VANISHED else esc(units.time_cell(x.time_b_us))}</td>'
        f'<td class="num">{"+" if x.delta_us > 0 else "−"}{esc(units.time_cell(abs(x.delta_us)))}</td>'
        f'<td class="num">{f"{x.ratio:.2f}x" if x.ratio is not None and x.verdict != VANISHED else "—"}</td>'
        f'<td class="{VERDICT_CLASS.get(x.verdict, "")}">{esc(x.verdict)}</td>'
        f'<td class="src mono">{esc(x.source_b or x.source_a)}</td></tr>' for x in changed)
    improved, worse = len(c.by_verdict(FASTER, VANISHED)), len(c.by_verdict(SLOWER, APPEARED))
    table = (f'<h3>Changed ops: {improved} improved, {worse} worse, {len(c.by_verdict(SAME))} within noise '
             f'(top {len(changed)} by change per step)</h3><div class="table-wrap"><table id="compare-table"><thead><tr>'
             '<th>op</th><th>input shapes</th><th class="num">A/step</th><th class="num">B/step</th>'
             '<th class="num">Δ</th><th class="num">B/A</th><th>verdict</th><th>source</th></tr></thead>'
             f'<tbody>{body}</tbody></table></div>') if changed else '<p class="good">No op changed beyond the noise band.</p>'
    finding_parts = []
    for title, items, cls in (("Findings fixed", c.findings_fixed, "good"),
                              ("Findings introduced", c.findings_introduced, "bad")):
        if items:
            lis = "".join(f'<li><span class="{cls}">{esc(f.rule)}</span> <code>{esc(f.source_location or f.op)}</code> '
                          f'{esc(f.message)}</li>' for f in items)
            finding_parts.append(f"<h3>{title} ({len(items)})</h3><ul>{lis}</ul>")
    finding_parts.append(f'<p class="muted">{c.findings_kept} finding(s) in both runs.</p>')
    return (f'<section id="comparison"><h2>Comparison with the baseline</h2><dl class="facts">{dl}</dl>{notes}'
            f'{table}{"".join(finding_parts)}</section>')


def _ranks(run: Run) -> str:
    """Merged runs of multi-process jobs: the per-rank table, straggler marked (opscope.render.ranks)."""
    headers, rows = rank_rows(run)
    if not rows:
        return ""
    head = "".join(f'<th class="num">{esc(h)}</th>' for h in headers) + "<th></th>"
    body = "".join(
        f'<tr class="{"straggler bad" if slow else ""}">' + "".join(f'<td class="num">{esc(c)}</td>' for c in cells)
        + f'<td>{esc(STRAGGLER_MARK) if slow else ""}</td></tr>' for cells, slow in rows)
    line = straggler_line(run)
    return (f'<section id="ranks"><h2>{esc(header_line(run))}</h2><div class="table-wrap"><table id="ranks-table">'
            f'<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'
            + (f'<p class="verdict">{esc(line)}</p>' if line else "") + f"<p>{esc(collectives_line(run))}</p>"
            f'<p class="muted">{esc(SUMS_NOTE)}</p></section>')


def _csp(scripts: list[bytes]) -> str:
    hashes = " ".join("'sha256-" + base64.b64encode(hashlib.sha256(s).digest()).decode() + "'" for s in scripts)
    return (f"default-src 'none'; script-src {hashes}; style-src 'unsafe-inline'; img-src data: blob:; "
            "font-src data:; connect-src 'none'; form-action 'none'; base-uri 'none'")


def render_html(run: Run, comparison: Comparison | None = None) -> str:
    """The whole report as one HTML document (text)."""
    head, plotly, tail = _document(run, comparison)
    return head + plotly.decode("utf-8") + tail


def _document(run: Run, comparison: Comparison | None) -> tuple[str, bytes, str]:
    """The report as (the text before plotly.js, the plotly.js bundle, the text after it)."""
    run = cleaned_run(run)
    columns = _columns(run)
    rows = records(run.ops)
    figure, points, caption = roofline_figure(run)
    modules = module_figure(run)
    timeline = timeline_figure(run)
    data = {
        "page_rows": PAGE_ROWS, "bounds": list(BOUNDS), "columns": columns, "detail_fields": DETAIL_FIELDS,
        "rows": [_table_row(i, row, columns) for i, row in enumerate(rows)],
        "roofline": figure, "roofline_points": points, "modules": modules,
        "timeline": timeline[0] if timeline is not None else None,
    }
    app_js = _asset("report.js")
    plotly = plotly_bundle()
    if _CLOSES_SCRIPT.search(app_js) or "<!--" in app_js:
        raise AssertionError("report.js must not contain </script or <!--")
    target = clean(run.meta.get("target"))
    gaps = _gaps(run)
    nav = [("roofline", "Roofline"), ("ops", "Ops")] + ([("timeline", "Timeline")] if timeline is not None else [])
    nav += ([("gaps", "GPU idle gaps")] if gaps else []) + [("breakdown", "Breakdown"), ("findings", "Findings")]
    sections = {"ranks": _ranks(run), "kernels": _kernels(run), "memory": _memory(run),
                "candidates": _candidates(run), "swap": _swap(run),
                "comparison": _comparison(comparison)}
    nav += [(k, k.capitalize()) for k, v in sections.items() if v]
    bound_options = "".join(f'<option value="{b}">{b}</option>' for b in BOUNDS)
    footer = esc(f"opscope {run.meta.get('opscope_version') or ''} · run created {run.meta.get('created') or '?'}"
                 f" · run directory {shown_path(run.path) if run.path else '?'} · report by opscope {__version__}")
    head = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{_csp([app_js.encode("utf-8"), plotly])}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="opscope {esc(__version__)}">
<title>opscope: {esc(target)}</title>
<style>{_asset("report.css")}</style>
</head><body>
<a class="skip" href="#ops">Skip to the ops table</a>
<main>
{_header(run)}
<nav class="toc" aria-label="sections">{"".join(f'<a href="#{k}">{v}</a>' for k, v in nav)}</nav>
<noscript><p class="bad">The roofline plot and the ops table need JavaScript; the findings below do not.</p></noscript>
<section id="roofline"><h2>Roofline</h2>
<p class="caption">{esc(caption)} Marker area: share of op time; colour: bound class. Click a point to select its row.</p>
<div id="roofline-plot" role="img" aria-label="roofline: achieved FLOP/s against arithmetic intensity, one point per op row"></div>
</section>
<section id="ops"><h2>Ops ({len(rows)} rows, by {'GPU kernel' if 'kernels' in run.ops else 'CPU self'} time)</h2>
<div class="controls">
<label>filter <input type="search" id="ops-filter" placeholder="op, shape, source, module, kernel" aria-controls="ops-table"></label>
<label>bound <select id="ops-bound" aria-controls="ops-table"><option value="">all</option>{bound_options}</select></label>
<span id="ops-count" class="muted" aria-live="polite"></span>
</div>
<div class="table-wrap"><table id="ops-table"><thead><tr></tr></thead><tbody></tbody></table><div id="ops-sentinel"></div></div>
<button type="button" id="ops-more" class="more">show more rows</button>
<div id="ops-detail" class="detail" aria-live="polite" hidden></div>
</section>
{_timeline(timeline)}
{gaps}
{_breakdown(run, modules is not None)}
{_findings(run)}
{"".join(sections.values())}
<footer>{footer}</footer>
</main>
<script type="application/json" id="opscope-data">{script_json(data)}</script>
<script>{app_js}</script>
<script>"""
    return head, plotly, "</script>\n</body></html>\n"


def default_html_path(run_dir: Path) -> Path:
    return run_dir / DEFAULT_NAME


def write_html(run: Run, out: Path, comparison: Comparison | None = None, *, replace: bool = False) -> Path:
    """Renders the report and writes it to `out`, a new file; an existing regular file only with `replace`
    (a run's own report.html, or --force). Whatever else is there stays as it is: a non-regular file
    (symlink, FIFO, device, directory) or one of a run directory's own files is refused in one
    OutputError line, before anything is rendered. The report is written beside `out` and linked (new
    file) or renamed (replace) into place, so `out` is never half-written."""
    _check_report_path(out, replace)
    head, plotly, tail = _document(run, comparison)
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name[:100]}.", suffix=".tmp", dir=out.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(head.encode("utf-8", errors="replace"))
            f.write(plotly)
            f.write(tail.encode("utf-8"))
        os.chmod(tmp, 0o644)
        if replace:
            os.replace(tmp, out)
        else:
            os.link(tmp, out)  # fails if something appeared at `out` meanwhile: never clobber it
    except FileExistsError as exc:
        raise OutputError(f"{out} exists: opscope does not overwrite files (--force replaces a regular file)") \
            from exc
    except OSError as exc:
        raise OutputError(f"cannot write {out}: {exc.strerror or exc}") from exc
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return out


_RUN_MARKERS = ("meta.json", "summary.json")


def _check_report_path(out: Path, replace: bool) -> None:
    """Refuses (OutputError) every `out` write_html must not write: see write_html."""
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        st = None
    except OSError as exc:  # a name too long, a component that is a file, no permission
        raise OutputError(f"cannot write {out}: {exc.strerror or exc}") from exc
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise OutputError(f"{out} is a directory; give a file name such as {out / DEFAULT_NAME}")
        if not stat.S_ISREG(st.st_mode):
            kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            raise OutputError(f"{out} is {kind}: opscope writes a report only to a new file or over a regular one")
    if out.name != DEFAULT_NAME and not out.name.endswith(".html") and \
            all((out.parent / name).is_file() for name in _RUN_MARKERS):
        raise OutputError(f"{out} is in the run directory {out.parent}: a report there must be an .html file, "
                          "never one of the run's own files")
    if st is not None and not replace:
        raise OutputError(f"{out} exists: opscope does not overwrite files (--force replaces a regular file)")
