"""Numbers and text shared by the findings rules: severity from the saving's share of op time, roofline
times, formatting. The event table's queries are in findings.tree, tensor layouts in findings.layout.
No rule lives here.
"""

from __future__ import annotations

import math
from typing import Any

from opscope import units
from opscope.findings.base import Context
from opscope.findings.layout import Tensor

# Severity from the estimated saving's share of the run's total op time (ops.csv time_us_total summed):
# >= 10 % high, >= 2 % medium, else low. A finding without an estimate is low unless a rule says more.
HIGH_SHARE = 0.10
MEDIUM_SHARE = 0.02


def severity(saving_us: float | None, ctx: Context) -> str:
    total = ctx.total_time_us
    if saving_us is None or not total or total <= 0 or not math.isfinite(saving_us):
        return "low"
    share = saving_us / total
    if share >= HIGH_SHARE:
        return "high"
    if share >= MEDIUM_SHARE:
        return "medium"
    return "low"


def share(us: float, ctx: Context) -> float:
    total = ctx.total_time_us
    return us / total if total > 0 else 0.0


def fmt_shape(t: Tensor | None) -> str:
    if t is None:
        return "?"
    text = "[" + ", ".join(map(str, t.shape)) + "]"
    if t.known_strides and not t.contiguous:
        text += " strides [" + ", ".join(map(str, t.stride)) + "]"
    return text


def short(op: str) -> str:
    return op.split("::", 1)[1] if op.startswith("aten::") else op


def base_name(op: str) -> str:
    """'aten::add_' -> 'add'; 'aten::_softmax' -> '_softmax'."""
    name = short(op)
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def per_step(x: float, ctx: Context) -> float:
    return x / max(ctx.steps, 1)


def count_per_step(n: float, ctx: Context, one: str, many: str | None = None) -> str:
    """"1 call" / "2.5 calls": a count per step with its noun (`many` defaults to `one` + "s")."""
    return units.count(per_step(n, ctx), one, many)


def ideal_memory_us(nbytes: float, ctx: Context, fraction: float = 1.0) -> float | None:
    """Time to move nbytes at `fraction` of the peak memory bandwidth (µs), None if the peak is unknown."""
    bw = ctx.peaks.memory_bandwidth_gbps
    if not bw or bw <= 0 or not math.isfinite(nbytes):
        return None
    return nbytes / (bw * fraction * 1e3)


def ideal_row_us(row: Any, ctx: Context, fraction: float = 1.0) -> float | None:
    """Per-call roofline time of an ops.csv row at `fraction` of the peaks that apply to it: the larger of
    bytes / bandwidth and FLOPs / the row's ceiling. None when bytes or the bandwidth are unknown."""
    nbytes = float(row["bytes_per_call"]) if _known(row["bytes_per_call"]) else math.nan
    mem = ideal_memory_us(nbytes, ctx, fraction)
    if mem is None:
        return None
    flops = float(row["flops_per_call"]) if _known(row["flops_per_call"]) else 0.0
    peak = ctx.peaks.flops_for(row["ceiling"]) if row.get("ceiling") else None
    comp = flops / (peak * fraction * 1e3) if peak and flops > 0 else 0.0
    return max(mem, comp)


def _known(x: Any) -> bool:
    """Not missing (None or NaN), as pandas.notna for a scalar."""
    return x is not None and x == x
