"""The per-rank view of a merged run (ranks.csv and summary.json "distributed"), as plain data shared by
the console and the HTML report: one row per rank with the straggler marked, the straggler line and the
collectives line. Strings from the run are cleaned (render.text) here."""

from __future__ import annotations

from typing import Any

from opscope import units
from opscope.render.report_data import text
from opscope.render.text import clean
from opscope.run.model import Run
from opscope.table import nrows, records
from opscope.units import number as num

# (header, ranks.csv column, format)
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("rank", "rank", "int"), ("step", "step_time_us", "us"), ("compute", "compute_time_us", "us"),
    ("collectives", "collective_time_us", "us"), ("idle", "idle_time_us", "us"), ("op time", "op_time_us", "us"),
    ("comm overlap", "comm_compute_overlap_share", "pct"),
)
STRAGGLER_MARK = "◀ straggler"


def _fmt(value: Any, kind: str) -> str:
    v = num(value)
    if v is None:
        return "—"
    return str(int(v)) if kind == "int" else units.time_cell(v) if kind == "us" else units.percent(v, 100)


def rank_rows(run: Run) -> tuple[list[str], list[tuple[list[str], bool]]]:
    """(headers, [(cells, is the straggler)]), times per step; the overlap column only when some rank has
    it (GPU runs with communication kernels)."""
    ranks = run.ranks
    if ranks is None or not nrows(ranks):
        return [], []
    shown = [c for c in COLUMNS if c[1] in ranks
             and (c[2] != "pct" or any(num(v) is not None for v in ranks[c[1]]))]
    rows = []
    for rec in records(ranks):
        cells = [_fmt(rec.get(col), kind) for _, col, kind in shown]
        rows.append((cells, num(rec.get("straggler")) == 1))
    return [h for h, _, _ in shown], rows


def distributed_of(run: Run) -> dict[str, Any]:
    d = run.summary.get("distributed")
    return d if isinstance(d, dict) else {}


def straggler_line(run: Run) -> str:
    """'straggler: rank 1, compute 5.2 ms per step, +12% over the median rank (4.6 ms); compute spread
    across ranks 15%, step time 3.3-3.4 ms (spread 2%)'."""
    d = distributed_of(run)
    rank = d.get("straggler_rank")
    if rank is None:
        return ""
    excess, spread = num(d.get("straggler_excess_share")), num(d.get("compute_spread_share"))
    line = f"straggler: rank {clean(rank)}, compute {units.time_cell(d.get('straggler_compute_time_us'))} per step"
    if excess is not None:
        line += (f", {'+' if excess >= 0 else '−'}{abs(excess) * 100:.0f}% over the median rank "
                 f"({units.time_cell(d.get('compute_time_us_median'))})")
        if d.get("straggler_beyond_noise") is False:
            line += ": the slowest, but within noise (no straggler finding)"
    if spread is not None:
        line += f"; compute spread across ranks {spread * 100:.0f}%"
    lo, hi, step_spread = num(d.get("step_time_us_min")), num(d.get("step_time_us_max")), num(d.get("step_time_spread_share"))
    if lo is not None and hi is not None:
        line += f", step time {units.time_cell(lo)} to {units.time_cell(hi)}"
        if step_spread is not None:
            line += f" (spread {step_spread * 100:.0f}%)"
    return line


def collectives_line(run: Run, limit: int = 4) -> str:
    """'collectives per step (mean rank): gloo:all_reduce 2.3 ms (34% of the step), c10d::allreduce_ ...'"""
    d = distributed_of(run)
    items = [c for c in d.get("collectives") or [] if isinstance(c, dict)]
    if not items:
        return "collectives: none recorded"
    parts = []
    for c in items[:limit]:
        share = num(c.get("share"))
        parts.append(f"{clean(text(c.get('name')))} {units.time_cell(c.get('time_us_per_step'))}"
                     + (f" ({share * 100:.0f}% of the step)" if share is not None else ""))
    more = f", … {len(items) - limit} more" if len(items) > limit else ""
    return "collectives per step (mean rank): " + ", ".join(parts) + more


def header_line(run: Run) -> str:
    d = distributed_of(run)
    n, world = d.get("ranks"), d.get("world_size")
    backend = f", {clean(d['backend'])}" if d.get("backend") else ""
    of = f" of {world}" if world and n and world != n else ""
    per_rank = d.get("steps_per_rank")
    steps = f" × {per_rank} profiled step{'' if per_rank == 1 else 's'}" if isinstance(per_rank, int) else ""
    return f"Ranks ({n}{of}{steps}{backend}; times per step)"


