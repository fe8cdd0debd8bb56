"""`opscope report RUN` on the console: what the HTML report shows, as rich text. Every string from a
run is cleaned and printed as Text, never as markup (render.text)."""

from __future__ import annotations

import statistics

from rich import box
from rich.console import Console, Group, JustifyMethod, RenderableType
from rich.table import Table
from rich.text import Text

from opscope import units
from opscope.render.console import (
    BOUND_STYLE,
    _natural_width,
    ceiling_warnings,
    findings_list,
    gaps_table,
    keep_end,
    ops_table,
    ranks_group,
    summary_panel,
    swap_candidates,
)
from opscope.render.report_data import (
    ROOT_MODULE,
    Share,
    TreeLine,
    breakdown,
    kernels_by_op,
    memory_items,
    module_tree,
    op_name,
    op_shapes,
    short_location,
    step_spread,
    steps_of,
    swap_check_table,
    swap_notes,
    swap_op_table,
    swap_table,
    tree_lines,
    verdict_line,
)
from opscope.render.text import clean, cleaned_run
from opscope.run.compare import APPEARED, FASTER, SAME, SLOWER, VANISHED, Comparison
from opscope.run.model import Run, shown_path

VERDICT_STYLE = {FASTER: "green", VANISHED: "green", SLOWER: "red", APPEARED: "red"}


def _shares_table(title: str, shares: list[Share], steps: int, limit: int = 12,
                  styles: dict[str, str] | None = None) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title=title, title_justify="left")
    table.add_column("", no_wrap=True, overflow="ellipsis", max_width=70)
    table.add_column("per step", justify="right", no_wrap=True)
    table.add_column("share", justify="right", no_wrap=True)
    for s in shares[:limit]:
        table.add_row(Text(s.name, style=(styles or {}).get(s.name, "")), Text(units.time_cell(s.time_us / steps)),
                      Text(units.percent(s.share, 100)))
    if len(shares) > limit:
        table.add_row(Text(f"… {len(shares) - limit} more", style="dim"), Text(""), Text(""))
    return table


def breakdown_group(run: Run) -> Group:
    """Time by bound class, op family and (when the run has module paths) module."""
    steps = steps_of(run)
    side_by_side = Table.grid(padding=(0, 4))
    side_by_side.add_row(_shares_table("Time by bound class", breakdown(run, "bound"), steps, styles=BOUND_STYLE),
                         _shares_table("Time by op family", breakdown(run, "family"), steps))
    parts: list[RenderableType] = [side_by_side]
    tree = module_tree(run)
    if tree:
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title="Time by module (inclusive; `opscope report --tree` "
                      "has the whole tree)", title_justify="left")
        table.add_column("module", no_wrap=True, overflow="ellipsis", max_width=80)
        table.add_column("per step", justify="right", no_wrap=True)
        table.add_column("share", justify="right", no_wrap=True)
        for node in [n for n in tree if n.depth <= 2][:15]:
            table.add_row(Text("  " * node.depth + (node.path or ROOT_MODULE)), Text(units.time_cell(node.time_us / steps)),
                          Text(units.percent(node.share, 100)))
        parts.append(table)
    return Group(*parts)


def tree_table(run: Run, fold: bool = True, width: int = 160) -> Table | Text:
    """`opscope report --tree`: per module, inclusive time per step and share, FLOPs and bytes per step,
    the dominant bound class and the findings inside; folded repeated blocks show how many there are and
    the spread of their time (min / median / max per step)."""
    lines = tree_lines(run, fold)
    if not lines:
        return Text("This run has no module paths (profile a model, or analyze a trace recorded with "
                    "with_modules=True).", style="yellow")
    steps = steps_of(run)
    # narrow terminals drop the class (under 130 columns), then FLOPs and bytes (under 110)
    columns: list[tuple[str, JustifyMethod, int, int]] = [
        ("module", "left", 0, 0), ("class", "left", 130, 0), ("per step", "right", 0, 9), ("share", "right", 0, 6),
        ("FLOP", "right", 110, 6), ("bytes", "right", 110, 9), ("bound", "left", 0, 8), ("findings", "right", 0, 8),
        ("min / median / max", "left", 0, 0)]
    shown = [c for c in columns if width >= c[2]]

    def spread(line: TreeLine, compact: bool) -> str:
        if len(line.instances) < 2:
            return ""
        times = sorted(t / steps for t in line.instances)
        picked = (times[0], times[-1]) if compact else (times[0], statistics.median(times), times[-1])
        return (" – " if compact else " / ").join(units.time_cell(t) for t in picked)

    def build(compact: bool, module_width: int | None) -> Table:
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left",
                      title="Modules by inclusive op time" + (" (repeated blocks folded)" if fold else ""))
        for header, justify, _, least in shown:
            table.add_column("min – max" if compact and header == "min / median / max" else header,
                             justify=justify, no_wrap=True, overflow="ellipsis", min_width=least or None,
                             max_width=module_width if header == "module" else None)
        for line in lines:
            label = line.label + (f" ×{len(line.instances)}" if len(line.instances) > 1 else "")
            cells = {"module": Text("  " * line.depth + label), "class": Text(line.module_class, style="dim"),
                     "per step": Text(units.time_cell(line.time_us / steps)),
                     "share": Text(units.percent(line.share, 100)),
                     "FLOP": Text(units.si(line.flops / steps if line.flops is not None else None)),
                     "bytes": Text(units.si(line.nbytes / steps if line.nbytes is not None else None, "B", 1024.0)),
                     "bound": Text(line.bound, style=BOUND_STYLE.get(line.bound, "")),
                     "findings": Text(str(line.findings) if line.findings else ""),
                     "min / median / max": Text(spread(line, compact))}
            table.add_row(*(cells[c[0]] for c in shown))
        return table

    # Fitted here: rich would cut every column of a too-wide table, the spread's last time mid-number
    # ("57.6 µs / 58.4 µs / 5"). In turn: the spread drops its median, the class column goes, the module
    # names give up room (down to MIN_TREE_MODULE), the spread goes.
    table = build(False, None)
    for step in ("compact", "no class", "cut modules", "no spread"):
        if _natural_width(table) <= width:
            break
        if step == "no class":
            shown = [c for c in shown if c[0] != "class"]
        elif step == "no spread":
            shown = [c for c in shown if c[0] != "min / median / max"]
        table = build(True, None)
        if step in ("cut modules", "no spread"):
            module_width = max(len("  " * ln.depth + ln.label) + len(f" ×{len(ln.instances)}") for ln in lines)
            while (excess := _natural_width(table) - width) > 0 and module_width > MIN_TREE_MODULE:
                module_width = max(MIN_TREE_MODULE, module_width - excess)
                table = build(True, module_width)
    return table


MIN_TREE_MODULE = 16  # a module cell in the tree is not cut shorter than this


def render_tree(run: Run, console: Console, fold: bool = True) -> None:
    run = cleaned_run(run)
    console.print(summary_panel(run))
    console.print(tree_table(run, fold, console.width))
    if run.path is not None:
        console.print(Text("run directory: ") + Text(clean(shown_path(run.path)), style="bold"))


def kernels_group(run: Run, top: int) -> Group | None:
    rows = kernels_by_op(run, top)
    if not rows:
        return None
    grid = Table.grid(padding=(0, 1))
    grid.add_column(justify="right", no_wrap=True)
    grid.add_column(ratio=1)
    for i, row, names in rows:
        head = Text(op_name(row), style="bold") + Text(f"  {units.time_cell(row.get('time_us_total'))}", style="dim")
        grid.add_row(Text(f"{i + 1}"), head)
        for name in names[:5]:
            grid.add_row(Text(""), Text(name, overflow="ellipsis", no_wrap=True))
        if len(names) > 5:
            grid.add_row(Text(""), Text(f"… {len(names) - 5} more (ops.csv has all)", style="dim"))
    return Group(Text(f"Kernels of the top {len(rows)} ops", style="bold"), grid)


def memory_group(run: Run) -> Group | None:
    items = memory_items(run)
    if not items:
        return None
    grid = Table.grid(padding=(0, 2))
    for label, value in items:
        grid.add_row(Text(label), Text(value))
    return Group(Text("Memory", style="bold"), grid)


def _text_table(title: str, columns: list[str], rows: list[list[str]], fold: tuple[str, ...] = (),
                narrow: dict[str, int] | None = None, width: int | None = None) -> Table:
    """A table of text cells. The first column (the labels) never wraps. With `width`, a table that fits it
    whole is printed whole; else the `narrow` columns wrap past their widths."""
    def build(caps: dict[str, int]) -> Table:
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title=title, title_justify="left")
        for k, c in enumerate(columns):  # the text columns in `fold` share the room left and wrap; the others
            if c in fold:  # wrap only if they must, or past their `narrow` width (cells that read well on two lines)
                table.add_column(c, overflow="fold", ratio=1, min_width=10)
            elif k == 0:
                table.add_column(c, overflow="fold", min_width=min(LABEL_MAX, max((len(r[0]) for r in rows), default=0)))
            else:
                table.add_column(c, overflow="fold", max_width=caps.get(c))
        for r in rows:
            table.add_row(*(Text(c, style="bold red" if c == "FAIL" else "") for c in r))
        return table

    caps = narrow or {}
    if width is not None and rows:
        # whole; else only the timings ("14.2 ms (13.7–14.6)") on two lines, at their space; else every cap
        spaced = {c: w for c, w in caps.items() if c in columns and any(" (" in r[columns.index(c)] for r in rows)}
        for tried in ({}, spaced):
            table = build(tried)
            if _natural_width(table) <= width:
                return table
    return build(caps)


LABEL_MAX = 24  # a swap label longer than this may wrap


# Median (p20–p80), "1.23x (noise)" and header cells wrap at their space, so the swap labels keep their width.
_TIMING_WIDTHS = {"replaces": 16, "calls kernel/orig": 11, "max abs err": 9, "max rel err": 9, "out of tol": 9,
                  "op speedup": 9, "step original": 11, "step swapped": 11, "original": 11, "kernel": 11,
                  "step speedup": 13, "speedup": 13, "% of peak": 9}


def swap_group(run: Run, width: int | None = None) -> Group | None:
    """The swap results (swap.json): one row per swap, the op-level rows, and the verification table of
    the swaps that failed it; fitted to `width` when given."""
    swap = swap_table(run)
    if swap is None:
        return None
    parts: list[RenderableType] = [_text_table("Swap results (swap.json)", *swap, fold=("replaces",),
                                               narrow=_TIMING_WIDTHS, width=width)]
    for label, note in swap_notes(run):
        parts.append(Text(f"  {label}: ", style="bold") + Text(note))
    ops = swap_op_table(run)
    if ops is not None:
        parts.append(_text_table("Op level: the original vs the kernel on the model's own calls", *ops,
                                 fold=("site", "call"), narrow=_TIMING_WIDTHS, width=width))
    checks = swap_check_table(run)
    if checks is not None:
        parts.append(_text_table("Verification of the swaps that failed (comparisons and failed checks)", *checks,
                                 fold=("detail", "tensor / call")))
    return Group(*parts)


def _modules_table(c: Comparison, top: int) -> Table:
    """Per module, time per step in A and B and the op rows it issued itself (A → B)."""
    shown = c.modules[:top]
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left",
                  title=f"Modules (time per step, own op rows A → B; {len(shown)} of {len(c.modules)})")
    table.add_column("module", no_wrap=True, overflow="ellipsis", max_width=40)
    for header in ("A/step", "B/step", "B/A", "", "rows"):
        table.add_column(header, justify="right" if header != "" else "left", no_wrap=True)
    for m in shown:
        name = ("  " * m.depth) + (clean(m.module) or "(model)")
        if m.module_class:
            name += f" ({clean(m.module_class)})"
        table.add_row(Text(name), Text("—" if m.verdict == APPEARED else units.time_cell(m.time_a_us)),
                      Text("—" if m.verdict == VANISHED else units.time_cell(m.time_b_us)),
                      Text(f"{m.ratio:.2f}x" if m.ratio is not None and m.verdict not in (APPEARED, VANISHED) else "—"),
                      Text(m.verdict, style=VERDICT_STYLE.get(m.verdict, "")), Text(f"{m.rows_a} → {m.rows_b}"))
    return table


def comparison_group(c: Comparison, top: int = 15, width: int = 160) -> Group:
    """A comparison (B against the baseline A) as text."""
    head = Text()
    head.append("A (baseline) ", style="bold")
    head.append(clean(c.run_a or c.target_a) + "\n")
    head.append("B            ", style="bold")
    head.append(clean(c.run_b or c.target_b) + "\n")
    if c.step_ratio is not None:
        head.append(f"step time  {units.time_cell(c.step_time_a_us)} → {units.time_cell(c.step_time_b_us)}  "
                    f"{c.step_ratio:.2f}x  ")
        head.append(c.step_verdict or "", style=VERDICT_STYLE.get(c.step_verdict or "", "bold"))
        head.append("\n")
    ratio = f"{c.op_time_ratio:.2f}x  " if c.op_time_ratio is not None else ""
    head.append(f"op time    {units.time_cell(c.op_time_a_us)} → {units.time_cell(c.op_time_b_us)} per step  {ratio}")
    head.append(c.op_time_verdict, style=VERDICT_STYLE.get(c.op_time_verdict, "bold"))
    head.append(f"\nnoise band ±{c.band:.0%} ({c.band_reason})", style="dim")
    parts: list[RenderableType] = [head]
    for note in c.notes:
        parts.append(Text("note: ", style="bold yellow") + Text(clean(note)))
    changed = [x for x in c.ops if x.verdict != SAME][:top]
    if changed:
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left",
                      title=f"Changed ops ({len(c.by_verdict(FASTER, VANISHED))} improved, "
                            f"{len(c.by_verdict(SLOWER, APPEARED))} worse; top {len(changed)} by change per step)")
        # Numbers first in priority: the op and source cells give way on narrow terminals.
        with_source = width >= 120
        spare = max(width - 66, 16)  # the five number columns and every column's padding take the rest
        source_width = spare * 9 // 20
        table.add_column("op", no_wrap=True, overflow="ellipsis",
                         max_width=spare * 11 // 20 if with_source else spare)
        for header in ("A/step", "B/step", "Δ", "B/A"):
            table.add_column(header, justify="right", no_wrap=True, min_width=6 if header == "B/A" else 9)
        table.add_column("", no_wrap=True, min_width=12)
        if with_source:
            table.add_column("source", no_wrap=True, overflow="ellipsis", max_width=source_width)
        for x in changed:
            shapes = op_shapes({"input_dims": x.input_dims})
            source = x.source_b or x.source_a
            cells = [Text(" ".join([op_name({"op": x.op}), *shapes])),
                     Text("—" if x.verdict == APPEARED else units.time_cell(x.time_a_us)),
                     Text("—" if x.verdict == VANISHED else units.time_cell(x.time_b_us)), Text(f"{'+' if x.delta_us > 0 else '−'}{units.time_cell(abs(x.delta_us))}"),
                     Text(f"{x.ratio:.2f}x" if x.ratio is not None and x.verdict != VANISHED else "—"),
                     Text(x.verdict, style=VERDICT_STYLE.get(x.verdict, ""))]
            if with_source:  # cut from the left: the line number is what finds the op
                where = source if width >= 170 else short_location(source)
                cells.append(Text(keep_end(where, source_width)))
            table.add_row(*cells)
        parts.append(table)
    else:
        parts.append(Text("No op changed beyond the noise band.", style="green"))
    parts.append(Text(f"{len(c.by_verdict(SAME))} matched op group(s) within noise", style="dim"))
    if c.modules:
        parts.append(_modules_table(c, top))
    steps_note = {"Findings fixed": c.findings_fixed, "Findings introduced": c.findings_introduced}
    for title, findings in steps_note.items():
        style = "green" if title.endswith("fixed") else "red"
        if findings:
            parts.append(Text(f"{title} ({len(findings)})", style=f"bold {style}"))
            for f in findings:
                line = Text(f"  {f.severity:<6} ", style=style) + Text(f"{f.rule}  ", style="bold")
                line += Text(f"{op_name({'op': f.op})} at {f.source_location or '?'}")
                parts.append(line)
    parts.append(Text(f"{c.findings_kept} finding(s) in both runs", style="dim"))
    return Group(*parts)


def render_report(run: Run, console: Console, top: int = 15, findings: int = 10,
                  comparison: Comparison | None = None) -> None:
    """The whole report: header with the verdict, top ops, GPU idle gaps, time breakdowns, findings in full, kernels
    (GPU), memory and swap results when the run has them, and the comparison with a baseline."""
    run = cleaned_run(run)
    console.print(summary_panel(run))
    spread = step_spread(run)
    if spread:  # the panel has the step count and mean; this adds the spread and the noise verdict
        console.print(Text("step    ", style="bold") + Text(spread))
    console.print(Text("verdict ", style="bold") + Text(verdict_line(run), style="bold"))
    console.print(ops_table(run, top, console.width))
    gaps = gaps_table(run, console.width)
    if gaps is not None:
        console.print(gaps)
    ranks = ranks_group(run)
    if ranks is not None:
        console.print(ranks)
    candidates = swap_candidates(run, top)
    if candidates is not None:
        console.print(candidates)
    console.print(breakdown_group(run))
    console.print(findings_list(run, findings))
    for section in (kernels_group(run, min(top, 10)), memory_group(run), swap_group(run, console.width)):
        if section is not None:
            console.print(section)
    for warning in ceiling_warnings(run):
        console.print(Text("note: ", style="bold yellow") + Text(warning))
    if comparison is not None:
        console.print(Text("\nComparison with the baseline", style="bold"))
        console.print(comparison_group(comparison, top, console.width))
    if run.path is not None:
        console.print(Text("run directory: ") + Text(clean(shown_path(run.path)), style="bold"))
