"""Rich console rendering of a run. Reads a Run only; never re-profiles."""

from __future__ import annotations

import io
import statistics
from typing import Any

from rich import box
from rich.console import Console, Group, JustifyMethod, RenderableType
from rich.measure import Measurement
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from opscope import units
from opscope.machine.noise import remedy
from opscope.render.ranks import STRAGGLER_MARK, collectives_line, header_line, rank_rows, straggler_line
from opscope.render.report_data import (
    binding_pct,
    ceilings_line,
    fit_op,
    gap_cpu,
    has_modules,
    module_label,
    op_name,
    op_shapes,
    short_source,
)
from opscope.render.text import clean, cleaned_run
from opscope.run.model import Run
from opscope.table import nrows, records, take
from opscope.trace.kernel_names import short_kernel_name
from opscope.units import UNKNOWN

BOUND_STYLE = {"compute": "bold green", "memory": "bold cyan", "overhead": "bold yellow", "unknown": "dim"}
SEVERITY_STYLE = {"high": "bold red", "medium": "yellow", "low": "dim"}






def summary_panel(run: Run) -> Panel:
    m, s = run.meta, run.summary
    dev = m.get("device", {})
    lines = Text()
    lines.append(f"{m.get('target', '')}", style="bold")
    lines.append(f"  ({m.get('source')}, {m.get('mode')}, {m.get('dtype') or 'dtype unknown'})\n")
    named_by = dev.get("name_source")
    lines.append(f"device  {dev.get('type')}: {dev.get('name') or 'unknown'}"
                 + (f" (from {named_by})" if named_by not in (None, "deviceProperties", "none") else "") + "\n")
    lines.append(f"peaks   {ceilings_line(run)}\n")  # the HTML header's line too
    threads = threads_line(m)
    if threads:
        lines.append(threads + "\n", style="yellow")
    if (m.get("calibration") or {}).get("stable") is False:
        lines.append("        calibration unstable (the machine was busy): used for this run only, not cached\n",
                     style="yellow")
    steps = s.get("steps", 1)
    whole = " (the whole trace: no step annotations)" if s.get("step_source") == "whole trace" else ""
    lines.append(f"steps   {steps} × {units.time_cell(s.get('step_time_us'))}{whole}   op time {units.time_cell(s.get('total_time_us'))}"
                 f"   cost model covers {units.percent(s.get('ops_covered_time_share'), 100)} of it\n")
    noise = noise_line(s)
    if noise:
        lines.append(noise + "\n", style="bold yellow")
    shares = s.get("bound_time_share", {})
    lines.append("bound   ")
    for b in ("compute", "memory", "overhead", "unknown"):
        lines.append(f"{b} {units.percent(shares.get(b), 100)}  ", style=BOUND_STYLE[b])
    if s.get("device_busy_share") is not None:
        busy = s["device_busy_share"]
        lines.append(f"\nGPU busy {units.percent(busy, 100)} of the step", style="bold red" if busy < 0.5 else "")
    lines.append(gpu_lines(s))
    memory = memory_line(run)
    if memory:
        lines.append(f"\nmemory  {memory}")
    compiled = compile_line(s)
    if compiled:
        lines.append(f"\ncompile {compiled}")
    fixes = whatif_line(s)
    if fixes:
        lines.append(f"\nwhat-if {fixes}", style="bold")
    return Panel(lines, title="opscope", title_align="left", box=box.ROUNDED)


def whatif_line(summary: dict[str, Any]) -> str | None:
    """"fix these N → step X → Y" from summary.json whatif (the step replayed with every finding's fix);
    None when no fix shortens the step."""
    w = summary.get("whatif")
    if not isinstance(w, dict) or not w.get("fixes"):
        return None
    n = int(w["fixes"])
    return (f"fix {f'these {n} findings' if n != 1 else 'this finding'} → step {units.duration(w.get('recorded_step_time_us'))} "
            f"→ {units.duration(w.get('predicted_step_time_us'))} (a replay of the step; `opscope whatif RUN --all`)")


def threads_line(meta: dict[str, Any]) -> str | None:
    """The header line of a CPU profile that ran on fewer torch threads than torch's default because other
    processes kept cores busy, or on ceilings scaled from another thread count's calibration; else None."""
    chosen = meta.get("threads_chosen")
    if not isinstance(chosen, dict):
        return None
    parts = []
    threads, default = units.number(chosen.get("threads")), units.number(chosen.get("default"))
    others, cores = units.number(chosen.get("other_cores")), units.number(chosen.get("cores"))
    if chosen.get("set") not in ("default", "--threads") and threads is not None and default is not None:
        busy = f"other processes used {others:.2f} of {cores:g} cores" if others is not None and cores else "busy cores"
        parts.append(f"{threads:g} of {default:g} (chosen: {busy} before the timed steps; --threads overrides)")
    from_threads = units.number(chosen.get("calibration_threads"))
    if from_threads is not None:
        parts.append(f"peaks: the quiet calibration on {units.count(from_threads, 'thread')}, GEMM FLOP/s scaled "
                     f"(the machine was busy)")
    return "threads " + "; ".join(parts) if parts else None


def noise_line(summary: dict[str, Any]) -> str | None:
    """The header line of a noisy run: why (summary "noise" reason), how much step times varied, and
    what to do; None on quiet runs and traces."""
    noise = summary.get("noise")
    if not isinstance(noise, dict) or noise.get("verdict") != "noisy":
        return None
    text = f"noise   noisy: {noise.get('reason')}"
    cv = units.number(summary.get("step_time_cv"))
    if cv is not None:
        text += f"; step time varied {cv:.0%} (cv)"
    return f"{text}; {remedy(noise)}"


def memory_line(run: Run) -> str:
    """'peak 27.8 MiB during sum at mlp.py:15; growth +8 KiB per step' from summary.json's memory."""
    m = run.summary.get("memory")
    if not isinstance(m, dict) or units.number(m.get("peak_allocated_bytes")) is None:
        return ""
    line = f"peak {units.nbytes(m['peak_allocated_bytes'])}"
    op = m.get("peak_op")
    if isinstance(op, str) and op:
        line += f" during {op.removeprefix('aten::')}"
        if isinstance(m.get("peak_source_location"), str) and m["peak_source_location"]:
            line += f" at {m['peak_source_location']}"
    growth = units.number(m.get("growth_bytes_per_step"))
    if growth:
        line += f"; {'+' if growth > 0 else ''}{units.nbytes(growth)} per step"
    return line


def compile_line(summary: dict[str, Any]) -> str:
    """'3 graphs, 22.4 s (not in step time); 1 graph break, 2 recompilations' from summary.json's compile
    (a compiled model's TORCH_TRACE log); '' without one."""
    entries = [e for e in summary.get("compile") or [] if isinstance(e, dict)]
    if not entries:
        return ""
    compiled = [e for e in entries if not e.get("failed")]
    seconds = sum(t for t in (units.number(e.get("compile_time_s")) for e in entries) if t is not None)
    line = f"{len(compiled)} graph{'s' if len(compiled) != 1 else ''}, {seconds:.3g} s (not in step time)"
    parts = []
    breaks = sum(int(b) for b in (units.number(e.get("graph_breaks")) for e in entries) if b)
    if breaks:
        parts.append(f"{breaks} graph break{'s' if breaks != 1 else ''}")
    again = sum(1 for e in compiled if e.get("recompile"))
    if again:
        parts.append(f"{again} recompilation{'s' if again != 1 else ''}")
    failed = len(entries) - len(compiled)
    if failed:
        parts.append(f"{failed} failed")
    return line + ("; " + ", ".join(parts) if parts else "")


def gpu_lines(s: dict[str, Any]) -> Text:
    """What a GPU run's kernels were (summary keys from opscope.analysis.gpu_timeline): graph mode and
    what it means for the numbers, kernel families, streams and overlap, a GPU-only trace."""
    out = Text()
    graph = s.get("graph_replay")
    if graph:
        launchers = ", ".join(graph.get("launchers") or [])
        out.append(f"\ngraph   CUDA/HIP graph replay: {graph.get('kernels', 0)} kernels from {graph.get('launches', 0)} "
                   f"graph launch(es), {units.percent(graph.get('kernel_time_share'), 100)} of GPU time"
                   + (f", launched in {launchers}." if launchers else "."), style="bold")
        captured = graph.get("captured_time_share")
        if captured:
            out.append(f" {units.percent(captured, 100)} of GPU time is mapped back to the ops and shapes that "
                       "launched it during graph capture (--capture), with their costs.")
        else:
            out.append(" A replay trace records no per-op shapes: these kernels are rows by (launcher, kernel "
                       "family, kernel), bound unknown, outside the cost model's coverage; pass --capture "
                       "CAPTURE.json.gz (a trace of the graph's capture) to map them to ops.")
    if s.get("gpu_only"):
        out.append("\nGPU-only trace: no CPU ops recorded; rows are kernels by name and family, bound unknown.",
                   style="bold")
    families = s.get("kernel_family_time_share")
    if families:
        shown = [(f, v) for f, v in sorted(families.items(), key=lambda kv: -(kv[1] or 0)) if v and v >= 0.0005]
        out.append("\nkernels " + "  ".join(f"{f} {units.percent(v, 100)}" for f, v in shown))
        lost = s.get("unattributed_time_share")
        if lost:
            out.append(f"   unattributed {units.percent(lost, 100)}", style="yellow")
        late = s.get("backlog_kernels")
        if isinstance(late, dict) and late.get("kernels"):
            out.append(f"\n{late['kernels']} kernels ({units.percent(late.get('kernel_time_share'), 100)} of kernel "
                       f"time) were launched before the trace started: only their "
                       f"{units.time_cell(late.get('in_steps_us'))} inside the steps count", style="yellow")
    streams = s.get("streams") or []
    overlap = s.get("comm_compute_overlap_share")
    if len(streams) > 1 or overlap is not None:
        busiest = ", ".join(f"{r['stream']} busy {units.time_cell(r['busy_us'])}" for r in streams[:4])
        out.append(f"\nstreams {len(streams)} ({busiest})")
        if overlap is not None:
            out.append(f"   communication overlapped with compute {units.percent(overlap, 100)}")
    return out


MIN_GAP_NAME = 6  # an op, source or kernel name in the gaps table is not cut shorter than this
_GAP_COLUMNS: tuple[tuple[str, JustifyMethod], ...] = (
    ("idle", "right"), ("at", "right"), ("CPU in", "left"), ("source", "left"), ("after kernel", "left"))
_SOURCE = 3


def gaps_table(run: Run, width: int = 160) -> Table | None:
    """The longest idle stretches of the GPU timeline and what the CPU was doing meanwhile."""
    gaps = run.summary.get("idle_gaps") or []
    if not gaps:
        return None
    rows = [[units.time_cell(g.get("duration_us")), "+" + units.time_cell(g.get("start_us")), cpu,
             short_source(where, full=width >= 160), short_kernel_name(str(g.get("kernel_before") or "—"))]
            for g in gaps for cpu, where in [gap_cpu(g)]]

    def build(widths: list[int]) -> Table:
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left",
                      title="GPU idle gaps (no kernel on any stream)")
        for (header, justify), w in zip(_GAP_COLUMNS, widths, strict=True):
            table.add_column(header, justify=justify, no_wrap=True, overflow="ellipsis", max_width=w)
        for r in rows:
            table.add_row(*map(Text, r))
        return table

    # Fitted here, not by rich: rich squeezes a table of no-wrap columns to the terminal by cutting every
    # column, the times to nothing first. The times stay whole; the widest names give up the room.
    widths = [max(len(header), *(len(r[k]) for r in rows)) for k, (header, _) in enumerate(_GAP_COLUMNS)]
    excess = _natural_width(build(widths)) - width
    names = [k for k, (_, justify) in enumerate(_GAP_COLUMNS) if justify == "left"]
    while excess > 0:
        k = max(names, key=widths.__getitem__)
        if widths[k] <= MIN_GAP_NAME:
            break
        widths[k] -= 1
        excess -= 1
    for r in rows:  # a source line keeps its end (the line number), as in the ops table
        r[_SOURCE] = keep_end(r[_SOURCE], widths[_SOURCE])
    return build(widths)


# (header, justify, minimum console width to show it). Narrow terminals keep the essentials.
_COLUMNS: list[tuple[str, JustifyMethod, int]] = [
    ("#", "right", 0), ("op", "left", 0), ("calls", "right", 125), ("time", "right", 0), ("per call", "right", 100),
    ("share", "right", 90), ("FLOP/call", "right", 160), ("bytes/call", "right", 160), ("FLOP/B", "right", 140),
    ("FLOP/s", "right", 115), ("B/s", "right", 115), ("% peak", "right", 0), ("bound", "left", 0),
    ("source", "left", 0),
]


MAX_OP_WIDTH = 60  # wide terminals: the op cell stops growing here, the table stays readable
SHAPES_MIN_WIDTH = 130  # narrower terminals show bare op names: a shape or two alone mostly misleads
MIN_MODULE = 16  # a module cell shorter than this says too little: show one `where` column instead


def ops_table(run: Run, top: int = 15, width: int = 160) -> Table:
    """The top ops, one line per row, fitted to `width`: columns drop by priority (_COLUMNS), sources are
    full paths when they fit and file:line otherwise, and on wide terminals the op cell grows into the
    space left with its input shapes (whole shapes; " …" marks those left out). A run with module paths
    shows a `module` column beside `source` when both fit, else one `where` column: the row's module,
    or its source line when it ran outside the model."""
    ops = run.ops
    gpu = "kernels" in ops
    title = f"Top {top} ops by {'GPU kernel' if gpu else 'CPU self'} time"
    shown = [(h, j) for h, j, min_width in _COLUMNS if width >= min_width]
    rows = records(take(ops, range(min(top, nrows(ops)))))
    cells = [_cells(row) for row in rows]
    names = [op_name(row) for row in rows]
    locations = [str(row.get("source_location") or "") for row in rows]
    modules = [module_label(row) for row in rows] if has_modules(run) else None

    def build(ops: list[str], sources: list[str], mods: list[str] | None = None, where: bool = False) -> Table:
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left", title=title)
        headers = [h for h, _ in shown]
        if mods is not None:
            headers.insert(headers.index("source"), "module")
        for header in headers:
            justify: JustifyMethod = "left" if header in ("module", "source") else dict(shown)[header]
            table.add_column("where" if where and header == "source" else header, justify=justify,
                             no_wrap=True, overflow="ellipsis")
        for i, (row_cells, op, source) in enumerate(zip(cells, ops, sources, strict=True), 1):
            row_cells = {**row_cells, "#": str(i), "op": op, "source": source}
            if mods is not None:
                row_cells["module"] = mods[i - 1]
            # Text, never a str: rich would read a str cell as markup ("[link=...]" in a file name).
            table.add_row(*(c if isinstance(c, Text) else Text(c) for c in (row_cells[h] for h in headers)))
        return table

    def fits(table: Table) -> bool:
        return _natural_width(table) <= width

    mods, where = None, False
    sources = [short_source(x, full=True) for x in locations]
    if modules is not None:
        mods = modules
        if not fits(build(names, sources, mods)):
            sources = [short_source(x, full=False) for x in locations]
        all_shown = shown
        while not fits(build(names, sources, mods)):
            # shorten the modules (keeping their layer) to the room left, down to MIN_MODULE; then make room
            # by leaving out optional columns, the widest-terminal ones first: a row's module and its file:line
            # say more than its FLOP/s
            room = max(map(len, modules), default=0) + width - _natural_width(build(names, sources, modules))
            if room >= MIN_MODULE:
                mods = [short_module(m, room) for m in modules]
                break
            optional = [h for h, _, min_width in sorted(_COLUMNS, key=lambda c: -c[2]) if min_width and h in dict(shown)]
            if not optional:
                break
            shown = [(h, j) for h, j in shown if h != optional[0]]
        if not fits(build(names, sources, mods)):
            # one column: the module, or the source line of ops outside the model
            shown, mods, where = all_shown, None, True
            sources = [m or short_source(x, full=False) for m, x in zip(modules, locations, strict=True)]
    elif not fits(build(names, sources)):
        sources = [short_source(x, full=False) for x in locations]
    spare = width - _natural_width(build(names, sources, mods, where))
    if spare < 0:  # narrower than the essentials: cut sources from the left (keeping the line), then names
        sources = _cut(sources, spare, keep="end")
        names = _cut(names, width - _natural_width(build(names, sources, mods, where)), keep="start")
        return build(names, sources, mods, where)
    if width < SHAPES_MIN_WIDTH:
        return build(names, sources, mods, where)
    op_width = min(max((len(n) for n in names), default=0) + spare, MAX_OP_WIDTH)
    fitted = [fit_op(name, op_shapes(row), op_width) for name, row in zip(names, rows, strict=True)]
    return build(fitted, sources, mods, where)


def _cells(row: dict[str, Any]) -> dict[str, Any]:
    ai = units.number(row.get("arithmetic_intensity"))
    bound = row.get("bound") or "unknown"
    gflops, gbps = units.number(row.get("achieved_gflops")), units.number(row.get("achieved_gbps"))
    return {
        "calls": str(int(row["calls"])),
        "time": units.time_cell(row["time_us_total"]),
        "per call": units.time_cell(_per_call(row)),
        "share": units.percent(row["time_share"], 100),
        "FLOP/call": units.si(row.get("flops_per_call")),
        "bytes/call": units.si(row.get("bytes_per_call"), "B", 1024.0),
        "FLOP/B": UNKNOWN if ai is None else f"{ai:.3g}",
        "FLOP/s": units.si(gflops * 1e9 if gflops is not None else None),
        "B/s": units.si(gbps * 1e9 if gbps is not None else None),
        "% peak": _pct_cell(binding_pct(row)),
        "bound": Text(bound, style=BOUND_STYLE.get(bound, "")),
    }


def _pct_cell(pct: Any) -> str:
    """A % of peak; above 100 marked (ceiling_warnings says why, under the table)."""
    text = units.percent(pct)
    value = units.number(pct)
    return text + ABOVE_PEAK_MARK if value is not None and value > 100.0 else text


def _per_call(row: dict[str, Any]) -> float | None:
    per_call = units.number(row.get("time_us_per_call"))
    if per_call is None:
        time, calls = units.number(row.get("time_us_total")), units.number(row.get("calls"))
        per_call = time / calls if time is not None and calls else None
    return per_call


def short_module(path: str, limit: int) -> str:
    """A module path in at most `limit` (>= MIN_MODULE) characters: its last names, and before them
    the numbered one (the layer: `layers.3`, `BertLayer_3`) where it fits; else its end."""
    if len(path) <= limit:
        return path
    parts = path.split(".")
    numbered = next((i for i in range(len(parts) - 2, -1, -1) if any(c.isdigit() for c in parts[i])), None)
    if numbered is not None:
        anchor = parts[numbered]
        if anchor.isdigit() and numbered > 0:  # `layers.3`: the list's name says what the index counts
            anchor = f"{parts[numbered - 1]}.{anchor}"
        rest = parts[numbered + 1:]
        for k in range(len(rest)):
            text = f"…{anchor}{'.' if k == 0 else '…'}{'.'.join(rest[k:])}"
            if len(text) <= limit:
                return text
        end = limit - len(anchor) - 2
        if end >= 4:
            return f"…{anchor}…{parts[-1][-end:]}"
    return keep_end(path, limit)


def keep_end(text: str, limit: int) -> str:
    """`text` in at most `limit` characters, cut from the left ("…ock.py:28": a line number stays)."""
    return text if len(text) <= limit else "…" + text[len(text) - limit + 1:]


def _cut(texts: list[str], spare: int, keep: str, floor: int = 10) -> list[str]:
    """Shortens the longest texts by up to -spare characters (none below `floor`), marking cuts with
    "…" at the dropped end."""
    longest = max((len(t) for t in texts), default=0)
    limit = max(longest + min(spare, 0), floor)
    if keep == "end":
        return [keep_end(t, limit) for t in texts]
    return [t if len(t) <= limit else t[: limit - 1] + "…" for t in texts]


def _natural_width(table: Table) -> int:
    return Measurement.get(_MEASURE, _MEASURE.options, table).maximum


_MEASURE = Console(width=10_000, file=io.StringIO(), color_system=None)


def findings_list(run: Run, top: int = 5) -> Group | Text:
    """Findings as entries: severity, rule, line, module and saving; then the message and the whole
    suggestion, wrapped to the terminal (never cut: the fix is usually in its last sentence)."""
    if not run.findings:
        return Text("No findings.", style="green")
    shown = run.findings[:top]
    title = Text(f"Findings ({len(run.findings)}; top {len(shown)} by estimated saving)", style="bold")
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True, width=6)
    grid.add_column(ratio=1, overflow="fold")
    steps = max(int(run.summary.get("steps") or 1), 1)
    for f in shown:
        saving = f.get("est_savings_us")
        saves = f"saves ~{units.time_cell(saving / steps)} per step" if saving is not None else "saving unknown"
        head = Text()
        head.append(f"{f['rule']}  ", style="bold")
        head.append(f"{f.get('source_location') or f.get('op', '')}  ", style="cyan")
        if isinstance(f.get("module"), str) and f["module"]:
            head.append(f"{f['module']}  ", style="magenta")
        head.append(saves, style="dim")
        body = Text(f["message"] + "\n")
        body.append("→ " + f["suggestion"], style="green")
        grid.add_row(Text(f["severity"], style=SEVERITY_STYLE.get(f["severity"], "")), head)
        grid.add_row("", body)
    return Group(title, grid)


def swap_candidates(run: Run, top: int = 15) -> Group | None:
    """For each of the top ops that a bundled kernel measured faster on (summary.json `swap_candidates`,
    profile's in-context timing), the kernels with their speedup: one line per op, with the command that
    tries them. Then, apart and never as suggestions, the kernels slower here (with the number) and those
    not measured here (with why)."""
    from opscope.run.schema import candidate_verdict, kernels_for_rows

    ops = run.ops
    cands = [c for c in run.summary.get("swap_candidates") or [] if isinstance(c, dict) and isinstance(c.get("kernel"), str)]
    speed = {c["kernel"]: c.get("measured_speedup") for c in cands}
    by_row = kernels_for_rows(cands, range(min(top, nrows(ops))))
    parts: list[Any] = []
    if by_row:
        rows = dict(zip(sorted(by_row), records(take(ops, sorted(by_row))), strict=True))
        grid = Table.grid(padding=(0, 2))
        for i in sorted(by_row):
            row = rows[i]
            where = row.get("source_location")
            grid.add_row(Text(f"{i + 1:>3}  {op_name(row)}"), Text(where if isinstance(where, str) else "", style="cyan"),
                         Text("→ " + ", ".join(f"{clean(k)} {speed[k]:.2f}x" for k in by_row[i]), style="green"))
        parts += [Text("Swap candidates ", style="bold") + Text(
            "(bundled kernels measured faster than these top ops on the run's own shapes; try them: opscope swap "
            "TARGET --kernel NAME, or opscope profile --try-swaps)", style="dim"), grid]
    slower = [c for c in cands if candidate_verdict(c) == "slower here"]
    if slower:
        # one per line: a kernel and its number never wrap apart
        parts.append(Text("Slower here (not suggested):", style="bold"))
        parts.extend(Text(f"  {clean(c['kernel'])} {c['measured_speedup']:.2f}x", style="yellow", no_wrap=True,
                          overflow="ellipsis") for c in slower)
    unmeasured = [c for c in cands if candidate_verdict(c) == "not measured here"]
    if unmeasured:
        why = {clean(str(c.get("why") or "")) for c in unmeasured} - {""}
        parts.append(Text("Not measured here: ", style="bold") + Text(
            ", ".join(clean(c["kernel"]) for c in unmeasured) + (f" ({'; '.join(sorted(why))})" if why else ""),
            style="dim"))
    return Group(*parts) if parts else None


# Nothing runs faster than the machine's peak: every % of peak above 100 printed gets its reason under the
# table (ceiling_warnings), and its cell a "*" that points there.
ABOVE_PEAK_MARK = "*"


def ceiling_warnings(run: Run) -> list[str]:
    """Ops beating the FLOP/s ceiling mean the ceilings are too low; ops beating the DRAM bandwidth
    ceiling usually had their data in cache."""
    out = []
    ops = run.ops
    for col, what in (("pct_peak_flops", "flops"), ("pct_peak_bandwidth", "bandwidth")):
        if col not in ops:
            continue
        values = _floats(ops[col])
        known = [v for v in values if v == v]
        if not known or max(known) <= 100.0:
            continue
        top = max(known)
        worst = ops["op"][values.index(top)]  # the first row at the maximum
        if what == "flops":
            origin = run.meta.get("peaks", {}).get("origin", {}).get("flops")
            hint = ("rerun `opscope calibrate` on an idle machine" if origin == "measured"
                    else "check --peak-flops")
            scaled = (run.meta.get("threads_chosen") or {}).get("calibration_threads")
            if origin == "measured" and scaled is not None:
                hint = (f"they are the quiet calibration on {units.count(scaled, 'thread')}, scaled to this run's threads (the machine "
                        f"was busy); run `opscope calibrate --threads {run.meta.get('threads')}` on an idle machine")
            out.append(f"{ABOVE_PEAK_MARK}{worst} ran at {top:.0f}% of its FLOP/s ceiling: the ceilings are too low "
                       f"for this run (measured while the machine was busy?); {hint}")
        else:
            n = sum(v > 100.0 for v in known)
            out.append(f"{ABOVE_PEAK_MARK}{n} op row(s) moved data faster than the memory-bandwidth ceiling (up to {top:.0f}%, "
                       f"{worst}): their data was most likely in cache")
    return out


def _floats(values: list[Any]) -> list[float]:
    """A column's cells as floats, NaN for what is no number (as pandas.to_numeric(errors="coerce"))."""
    out = []
    for v in values:
        try:
            out.append(float(v) if v is not None else NAN)
        except (TypeError, ValueError):
            out.append(NAN)
    return out


NAN = float("nan")


def measured_notes(run: Run) -> list[str]:
    """Lines for the console under the ops table when the run has Nsight measurements (ops.csv measured_*
    and nsys_* columns, opscope.nsight.measured; summary.json "nsys")."""
    notes = []
    ops = run.ops
    if "measured_bytes_ratio" in ops:
        measured = sum(v == v for v in _floats(ops["measured_dram_bytes_per_call"]))
        ratios = [v for v in _floats(ops["measured_bytes_ratio"]) if v == v]
        line = f"Nsight Compute: {measured} op row(s) measured"
        if ratios:
            line += (f"; DRAM bytes measured / modeled: median {statistics.median(ratios):.2f}x, "
                     f"{sum(r > 2 for r in ratios)} row(s) over 2x")
        notes.append(line + " (ops.csv measured_* columns)")
    nsys = run.summary.get("nsys")
    if isinstance(nsys, dict) and nsys.get("step_time_us") is not None:
        busy = nsys.get("device_busy_share")
        notes.append(f"Nsight Systems: {nsys.get('steps')} step(s) of {nsys['step_time_us'] / 1e3:.3g} ms, GPU busy "
                     + (f"{busy * 100:.0f}%" if isinstance(busy, (int, float)) else "?")
                     + " of the step (ops.csv nsys_time_us_total, nsys_kernels.csv)")
    return notes


def render_run(run: Run, console: Console, top: int = 15, findings: int = 5) -> None:
    """Prints the run. Every string from the run is cleaned of control characters first and is printed
    as text, never as markup."""
    from opscope.render.console import ranks_group

    run = cleaned_run(run)
    gaps = gaps_table(run, console.width)
    ranks = ranks_group(run)  # merged runs of multi-process jobs
    candidates = swap_candidates(run, top)
    console.print(Group(summary_panel(run), ops_table(run, top, console.width), *([gaps] if gaps else []),
                        *([ranks] if ranks else []), *([candidates] if candidates else []),
                        findings_list(run, findings)))
    for warning in ceiling_warnings(run):
        console.print(Text("note: ", style="bold yellow") + Text(warning))
    for line in measured_notes(run):
        console.print(Text("measured: ", style="bold") + Text(line))
    if run.path is not None:
        from opscope.run.model import shown_path

        console.print(Text("run directory: ") + Text(clean(shown_path(run.path)), style="bold"))


SUMS_NOTE = ("the ops table and findings sum all ranks; their steps are rank-steps, so \"per step\" there is the "
             "mean rank's")


def ranks_group(run: Run) -> Group | None:
    """The console's per-rank table, straggler line and collectives line; None for one-process runs."""
    headers, rows = rank_rows(run)
    if not rows:
        return None
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title=header_line(run), title_justify="left")
    for h in headers:
        table.add_column(h, justify="right", no_wrap=True)
    table.add_column("", no_wrap=True)
    for cells, slow in rows:
        style = "bold red" if slow else ""
        table.add_row(*(Text(c, style=style) for c in cells), Text(STRAGGLER_MARK if slow else "", style=style))
    parts: list[RenderableType] = [table]
    line = straggler_line(run)
    if line:
        parts.append(Text(line, style="bold"))
    parts.append(Text(collectives_line(run)))
    parts.append(Text(SUMS_NOTE, style="dim"))
    return Group(*parts)
