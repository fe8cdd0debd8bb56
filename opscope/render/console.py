"""Rich console rendering of a run. Reads a Run only; never re-profiles."""

from __future__ import annotations

import json
import math
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from opscope.run import Run

BOUND_STYLE = {"compute": "bold green", "memory": "bold cyan", "overhead": "bold yellow", "unknown": "dim"}
SEVERITY_STYLE = {"high": "bold red", "medium": "yellow", "low": "dim"}


def _num(v: Any) -> float | None:
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def si(value: Any, unit: str = "", base: float = 1000.0) -> str:
    v = _num(value)
    if v is None:
        return "—"
    prefixes = ["", "k", "M", "G", "T", "P"] if base == 1000.0 else ["", "Ki", "Mi", "Gi", "Ti", "Pi"]
    i = 0
    while abs(v) >= base and i < len(prefixes) - 1:
        v /= base
        i += 1
    text = f"{v:.0f}" if (i == 0 and float(v).is_integer()) else f"{v:.3g}"
    return f"{text} {prefixes[i]}{unit}".strip()


def fmt_us(value: Any) -> str:
    v = _num(value)
    if v is None:
        return "—"
    if v >= 1e6:
        return f"{v / 1e6:.2f} s"
    if v >= 1e3:
        return f"{v / 1e3:.2f} ms"
    return f"{v:.1f} µs"


def fmt_pct(value: Any, scale: float = 1.0) -> str:
    v = _num(value)
    return "—" if v is None else f"{v * scale:.1f}%"


def binding_pct(row: dict[str, Any]) -> Any:
    """% of the roof that binds this op: FLOP/s for compute-bound, bandwidth otherwise."""
    if row.get("bound") == "compute":
        return row.get("pct_peak_flops")
    pb, pf = _num(row.get("pct_peak_bandwidth")), _num(row.get("pct_peak_flops"))
    if row.get("bound") == "memory":
        return pb
    vals = [v for v in (pb, pf) if v is not None]
    return max(vals) if vals else None


def summary_panel(run: Run) -> Panel:
    m, s = run.meta, run.summary
    dev = m.get("device", {})
    lines = Text()
    lines.append(f"{m.get('target', '')}", style="bold")
    lines.append(f"  ({m.get('source')}, {m.get('mode')}, {m.get('dtype') or 'mixed'})\n")
    lines.append(f"device  {dev.get('type')}: {dev.get('name')}\n")
    peaks = m.get("peaks", {})
    bw = peaks.get("memory_bandwidth_gbps")
    flops = peaks.get("flops_gflops", {})
    ceil = ", ".join(f"{k} {si(v * 1e9, 'FLOP/s')}" for k, v in flops.items())
    origin = peaks.get("origin", {})
    lines.append(f"peaks   {si((bw or float('nan')) * 1e9, 'B/s')} ({origin.get('memory_bandwidth', '?')}); "
                 f"{ceil or 'unknown'} ({origin.get('flops', '?')})\n")
    steps = s.get("steps", 1)
    lines.append(f"steps   {steps} × {fmt_us(s.get('step_time_us'))}   op time {fmt_us(s.get('total_time_us'))}   "
                 f"cost model covers {fmt_pct(s.get('ops_covered_time_share'), 100)} of it\n")
    shares = s.get("bound_time_share", {})
    lines.append("bound   ")
    for b in ("compute", "memory", "overhead", "unknown"):
        lines.append(f"{b} {fmt_pct(shares.get(b), 100)}  ", style=BOUND_STYLE[b])
    if s.get("device_busy_share") is not None:
        busy = s["device_busy_share"]
        lines.append(f"\nGPU busy {fmt_pct(busy, 100)} of the step", style="bold red" if busy < 0.5 else "")
    return Panel(lines, title="opscope", title_align="left", box=box.ROUNDED)


# (header, justify, minimum console width to show it). Narrow terminals keep the essentials.
_COLUMNS = [
    ("#", "right", 0), ("op", "left", 0), ("calls", "right", 125), ("time", "right", 0), ("share", "right", 90),
    ("FLOP/call", "right", 160), ("bytes/call", "right", 160), ("FLOP/B", "right", 140), ("FLOP/s", "right", 115),
    ("B/s", "right", 115), ("% peak", "right", 0), ("bound", "left", 0), ("source", "left", 0),
]


def ops_table(run: Run, top: int = 15, width: int = 160) -> Table:
    gpu = "kernels" in run.ops.columns
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left",
                  title=f"Top {top} ops by {'GPU kernel' if gpu else 'CPU self'} time")
    shown = [(h, j) for h, j, min_width in _COLUMNS if width >= min_width]
    head = run.ops.head(top)
    sources = [short_source(str(x or ""), full=width >= 150) for x in head["source_location"].fillna("")]
    source_width = min(max((len(x) for x in sources), default=6), 48)
    for header, justify in shown:
        if header == "op":
            table.add_column(header, overflow="fold", ratio=3, min_width=18)
        elif header == "source":
            table.add_column(header, no_wrap=True, overflow="ellipsis", min_width=max(source_width, 6))
        else:
            table.add_column(header, justify=justify, no_wrap=True)
    for i, row in enumerate(head.to_dict("records"), 1):
        ai = _num(row.get("arithmetic_intensity"))
        bound = row.get("bound") or "unknown"
        gflops, gbps = _num(row.get("achieved_gflops")), _num(row.get("achieved_gbps"))
        cells = {
            "#": str(i),
            "op": _short_op(row, with_shapes=width >= 130),
            "calls": str(int(row["calls"])),
            "time": fmt_us(row["time_us_total"]),
            "share": fmt_pct(row["time_share"], 100),
            "FLOP/call": si(row.get("flops_per_call")),
            "bytes/call": si(row.get("bytes_per_call"), "B", 1024.0),
            "FLOP/B": "—" if ai is None else f"{ai:.3g}",
            "FLOP/s": si(gflops * 1e9 if gflops is not None else None),
            "B/s": si(gbps * 1e9 if gbps is not None else None),
            "% peak": fmt_pct(binding_pct(row)),
            "bound": Text(bound, style=BOUND_STYLE.get(bound, "")),
            "source": short_source(str(row.get("source_location") or ""), full=width >= 150),
        }
        table.add_row(*(cells[h] for h, _ in shown))
    return table


# Display-only abbreviations for op names too long for a table cell.
_ABBREVIATIONS = (("_scaled_dot_product_", "sdpa_"), ("_efficient_attention", "_eff_attn"))


def short_source(location: str, full: bool) -> str:
    """'pkg/models/x/modeling_x.py:250' -> 'modeling_x.py:250' on narrow terminals."""
    if full or "/" not in location:
        return location
    return location.rsplit("/", 1)[1]


def _short_op(row: dict[str, Any], with_shapes: bool = True) -> str:
    op = str(row.get("op", ""))
    name = op.split("::", 1)[1] if op.startswith("aten::") else op
    for long, short in _ABBREVIATIONS:
        name = name.replace(long, short)
    dims = row.get("input_dims") or ""
    if with_shapes and dims and dims != "[]":
        try:
            parsed = json.loads(dims)
        except ValueError:
            return name
        shapes = " ".join("[" + ",".join(map(str, d)) + "]" for d in parsed if d and not isinstance(d[0], list))
        if len(shapes) > 40:
            shapes = shapes[:39] + "…"
        return f"{name} {shapes}" if shapes else name
    return name


def first_sentence(text: str) -> str:
    """The first sentence of a suggestion (the console's summary; findings.json has all of it)."""
    for end in (". ", "; "):
        i = text.find(end)
        if 0 < i < 240:
            return text[: i + 1]
    return text if len(text) <= 240 else text[:239] + "…"


def findings_list(run: Run, top: int = 5, full: bool = False) -> Group | Text:
    """Findings as compact entries: severity, rule, line and saving; the message; the suggestion."""
    if not run.findings:
        return Text("No findings.", style="green")
    shown = run.findings[:top]
    title = Text(f"Findings ({len(run.findings)}; top {len(shown)} by estimated saving)", style="bold")
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True, width=6)
    grid.add_column(ratio=1)
    steps = max(int(run.summary.get("steps") or 1), 1)
    for f in shown:
        saving = f.get("est_savings_us")
        saves = f"saves ~{fmt_us(saving / steps)} per step" if saving is not None else "saving unknown"
        head = Text()
        head.append(f"{f['rule']}  ", style="bold")
        head.append(f"{f.get('source_location') or f.get('op', '')}  ", style="cyan")
        head.append(saves, style="dim")
        body = Text(f["message"] + "\n")
        body.append("→ " + (f["suggestion"] if full else first_sentence(f["suggestion"])), style="green")
        grid.add_row(Text(f["severity"], style=SEVERITY_STYLE.get(f["severity"], "")), head)
        grid.add_row("", body)
    return Group(title, grid)


CEILING_SLACK = 1.05  # timing noise aside, nothing runs faster than the machine's peak


def ceiling_warnings(run: Run) -> list[str]:
    """Ops beating the FLOP/s ceiling mean the ceilings are too low; ops beating the DRAM bandwidth
    ceiling usually had their data in cache."""
    out = []
    for col, what in (("pct_peak_flops", "flops"), ("pct_peak_bandwidth", "bandwidth")):
        if col not in run.ops.columns:
            continue
        values = run.ops[col].astype(float)
        if not values.notna().any() or values.max() <= 100 * CEILING_SLACK:
            continue
        worst = run.ops.loc[values.idxmax()]
        if what == "flops":
            origin = run.meta.get("peaks", {}).get("origin", {}).get("flops")
            hint = ("rerun `opscope calibrate` on an idle machine" if origin == "measured"
                    else "check --peak-flops")
            out.append(f"{worst['op']} ran at {values.max():.0f}% of its FLOP/s ceiling: the ceilings are too low "
                       f"for this run (measured while the machine was busy?); {hint}")
        else:
            n = int((values > 100 * CEILING_SLACK).sum())
            out.append(f"{n} op row(s) moved data faster than the memory-bandwidth ceiling (up to {values.max():.0f}%, "
                       f"{worst['op']}): their data was most likely in cache")
    return out


def render_run(run: Run, console: Console, top: int = 15, findings: int = 5, full: bool = False) -> None:
    console.print(Group(summary_panel(run), ops_table(run, top, console.width), findings_list(run, findings, full)))
    for warning in ceiling_warnings(run):
        console.print(Text("note: ", style="bold yellow") + Text(warning))
    if run.path is not None:
        console.print(f"run directory: [bold]{run.path}[/bold]")
