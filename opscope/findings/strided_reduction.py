"""strided-reduction: a reduction, softmax or layer norm whose reduced dimension is not the innermost
one in memory and has a large stride, and which runs below BW_FRACTION (70 %) of the peak bandwidth.

Reduced dims come from the recorded concrete inputs (`dim` of sum/mean/amax/softmax/..., the
normalized_shape length of layer_norm); memory order from the recorded input strides. Fires when the
innermost memory dim (smallest non-zero stride among dims of size > 1) is not reduced, the smallest
stride among the reduced dims is at least MIN_STRIDE_BYTES (256 B), and the op reaches under 70 % of
peak bandwidth. Plain reductions (sum/mean/amax/...) are vectorized across the kept inner dims, so they
are only flagged when that contiguous kept run is under MIN_KEPT_RUN_BYTES (64 B); softmax over a
non-last dim takes a slow strided kernel whatever the kept run. Saving = time - calls x roofline time
at 70 % of the peaks (what a reduction over the contiguous dim typically reaches). Ops under MIN_SHARE
of the run's op time are dropped.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from opscope import units
from opscope.findings.base import Context, Finding, cached, rule
from opscope.findings.common import count_per_step, fmt_shape, ideal_row_us, severity, share
from opscope.findings.layout import concrete, tensor
from opscope.findings.tree import col, events_by_ops_row, ops_rows

MIN_STRIDE_BYTES = 256
MIN_KEPT_RUN_BYTES = 64
BW_FRACTION = 0.70
MIN_SHARE = 0.001
REDUCTION_FAMILIES = frozenset({"reduction", "softmax", "norm"})  # batch/group norm are skipped below
# Position of the `dim` argument where it is not 1.
DIM_ARG = {"aten::linalg_vector_norm": 2, "aten::norm": 2}
# Ops reducing the last len(normalized_shape) dims; the value is normalized_shape's position.
LAST_DIMS_ARG = {"aten::native_layer_norm": 1, "aten::layer_norm": 1, "aten::rms_norm": 1,
                 "aten::_fused_rms_norm": 1}

SUGGESTION = ("Reduce over the innermost dimension: lay the tensor out so the reduced dim is last and contiguous "
              "where it is produced (e.g. keep [..., L, C] and reduce dim=-1 instead of [..., C, L] over dim=1), "
              "rather than permuting right before the reduction.")


def reduced_dims(ctx: Context, i: int, name: str, family: str, ndim: int) -> list[int] | None:
    if name in LAST_DIMS_ARG:
        shape = concrete(ctx, i, LAST_DIMS_ARG[name], None)
        n = len(shape) if isinstance(shape, list) else 1
        return list(range(ndim - n, ndim))
    if family not in ("reduction", "softmax"):
        return None  # batch/group norm: fixed kernels over (N, H, W), nothing the user can reorder
    d = concrete(ctx, i, DIM_ARG.get(name, 1), None)
    if d is None or d == [] or isinstance(d, (str, bool, float)):
        return None  # a full reduction reads everything in memory order
    dims = d if isinstance(d, list) else [d]
    if not all(isinstance(x, int) for x in dims):
        return None
    return sorted({x % ndim for x in dims}) if ndim else None


def strided_reduction_info(ctx: Context, i: int) -> dict[str, Any] | None:
    """The reduced dims and their smallest stride (elements) when event i is a strided reduction."""
    name, family = col(ctx, "name")[i], col(ctx, "family")[i]
    if family not in REDUCTION_FAMILIES:
        return None
    t = tensor(ctx, i, 0)
    if t is None or not t.known_strides or t.ndim < 2:
        return None
    dims = reduced_dims(ctx, i, name, family, t.ndim)
    if not dims:
        return None
    live = [k for k in range(t.ndim) if t.shape[k] > 1 and t.stride[k] != 0]
    red = [k for k in dims if k in live]
    if not red or len(red) == len(live):
        return None
    inner = min(live, key=lambda k: abs(t.stride[k]))
    if inner in red:
        return None
    stride = min(abs(t.stride[k]) for k in red)
    if stride * t.itemsize < MIN_STRIDE_BYTES:
        return None
    if family == "reduction":
        # An "outer" reduction (sum over dim 0 of [N, D], a bias gradient) is vectorized across the kept
        # inner dims: only flag it when that contiguous kept run is short.
        run, expected = 1, 1
        for k in sorted(live, key=lambda k: abs(t.stride[k])):
            if k in red or abs(t.stride[k]) != expected:
                break
            run *= t.shape[k]
            expected *= t.shape[k]
        if run * t.itemsize >= MIN_KEPT_RUN_BYTES:
            return None
    return {"dims": red, "stride": stride, "inner": inner, "tensor": t}


def strided_rows(ctx: Context) -> dict[int, dict[str, Any]]:
    """ops.csv row -> info, for rows that are strided reductions (low-bandwidth leaves these alone)."""
    def build() -> dict[int, dict[str, Any]]:
        out = {}
        for r, evs in events_by_ops_row(ctx).items():
            info = strided_reduction_info(ctx, evs[0])
            if info is not None:
                out[r] = info
        return out
    return cached(ctx, "strided_rows", build)


@rule("strided-reduction")
def strided_reduction(ctx: Context) -> Iterator[Finding]:
    for r, info in strided_rows(ctx).items():
        row = ops_rows(ctx)[r]
        ideal = ideal_row_us(row, ctx, BW_FRACTION)
        pct = row["pct_peak_bandwidth"]
        if ideal is None or not math.isfinite(float(pct)) or pct >= BW_FRACTION * 100:
            continue
        time, calls = float(row["time_us_total"]), int(row["calls"])
        saving = time - calls * ideal
        if share(saving, ctx) < MIN_SHARE:
            continue
        t = info["tensor"]
        message = (f"{row['op']} reduces dim {info['dims']} of {fmt_shape(t)}, which is not the innermost dim in "
                   f"memory (stride {info['stride']} elements = {units.nbytes(info['stride'] * t.itemsize)}): "
                   f"{pct:.0f}% of peak bandwidth, {units.duration(time)} in all ({count_per_step(calls, ctx, 'call')} per step).")
        yield Finding(rule="strided-reduction", severity=severity(saving, ctx), op=row["op"],
                      source_location=row["source_location"], message=message, suggestion=SUGGESTION,
                      est_savings_us=saving)
