"""dtype-slow-path: bfloat16 / float16 convolutions or matmuls that run far slower than the same work in
float32 would on this machine. A CPU without native bf16/fp16 matrix instructions (AVX2 only: no AMX, no
AVX512-BF16) takes slow paths for them: on AVX2, ATen's `_slow_conv2d_forward` instead of oneDNN. A
convolution net with `--dtype bfloat16` ran several times slower per step than in float32 there.

Candidates: the outermost ops of the user's code (what a line called: aten::conv2d, aten::linear,
aten::convolution_backward, aten::mm, ...) whose subtree does convolution or matmul work (cost-model
family conv/matmul) in a SLOW_DTYPES dtype, grouped by their ops.csv row; the largest MAX_PROBED groups
of at least MIN_SHARE of the run's op time are examined. An op's time is its whole subtree's (CPU: its
wall time; GPU: its kernels' time).

- profile (Context.dtype_probe set): the probe replays the op with its floating-point tensors in float32
  on the profiled device (same shapes, strides and arguments, warm, a few calls, capped in total; see
  opscope.capture.dtype_probe), and, when the op took under OWN_REPLAY_MAX_US per call, also as recorded,
  so that both are timed alike (a profiled call can be slower than a warm loop's for reasons that have
  nothing to do with the dtype); slower ops keep their profiled time. Slow when the op's time per call is
  at least MIN_SLOWDOWN (2x) the float32 time. Saving, measured: the measured fraction
  (1 - t_float32 / t) of the op's profiled time, capped at calls x (t - t_float32).
- analyze (no probe): the float32 time is estimated as the op's float32 roofline time, its FLOPs at the
  float32 peak or its bytes at twice their 16-bit size at the peak bandwidth, whichever is longer. Slow
  when the op takes at least MIN_SLOWDOWN_ESTIMATED (50x) that, and that roofline time is at least
  MIN_IDEAL_US (5 µs) per call, so that per-op latency cannot explain the gap. Saving, estimated: calls x
  (time per call - roofline time), an upper bound (float32 does not reach its peak either).

One finding per reduced-precision dtype, at the line of the op with the largest saving; the message
names up to TOP ops with their slowdowns.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from opscope import units
from opscope.costmodel.base import DTYPE_NAMES, OpCall, parse_scalar
from opscope.findings.base import Context, Finding, rule
from opscope.findings.common import count_per_step, fmt_shape, per_step, severity, share, short
from opscope.findings.layout import tensor
from opscope.findings.tree import col, names, ops_row_of_events, subtree_sum, user_mask

SLOW_DTYPES = ("bfloat16", "float16")
WORK_FAMILIES = frozenset({"conv", "matmul"})
MIN_SLOWDOWN = 2.0  # measured: the reduced-precision op takes at least this many times the float32 time
# estimated: ... this many times its float32 roofline time; leaves room for kernels that reach only a few % of
# the peak (a bf16 first layer with 3 input channels on a bf16-capable CPU took 12x its float32 roofline).
MIN_SLOWDOWN_ESTIMATED = 50.0
MIN_IDEAL_US = 5.0  # estimated: only ops whose float32 roofline time per call is at least this
MIN_SHARE = 0.01  # of the run's op time: smaller ops are not examined
MAX_PROBED = 8
OWN_REPLAY_MAX_US = 20_000.0  # profile: ops quicker than this per call are replayed in their own dtype too
TOP = 3

CPU_INSTRUCTIONS = {"bfloat16": "AMX or AVX512-BF16", "float16": "AMX-FP16 or AVX512-FP16"}
CPU_SUGGESTION = ("Run this model in float32 on this machine (drop --dtype {dtype} / autocast to {dtype}): its CPU "
                  "has no fast {dtype} matrix path, so convolutions and matmuls fall back to slow kernels. "
                  "{dtype} pays off on CPUs with {instructions}.")
GPU_SUGGESTION = ("Run these ops in float32 on this GPU (with TF32: torch.set_float32_matmul_precision('high')), "
                  "or use a GPU whose tensor cores support {dtype}.")


@dataclass
class _Group:
    event: int  # first event of the group (the outermost op the user's line called)
    op: str
    location: str
    dtype: str
    calls: int = 0
    time: float = 0.0
    flops: float = 0.0
    bytes: float = 0.0


def _groups(ctx: Context) -> list[_Group]:
    """Outermost user ops with reduced-precision conv/matmul work beneath, grouped by ops.csv row, largest
    first."""
    nm, fam, dts = names(ctx), col(ctx, "family"), col(ctx, "dtype")
    rp, locs, mask = col(ctx, "row_parent"), col(ctx, "source_location"), user_mask(ctx)
    rows = ops_row_of_events(ctx)
    times, flops, nbytes = subtree_sum(ctx, "time_us"), subtree_sum(ctx, "flops"), subtree_sum(ctx, "bytes")
    outer: dict[int, str] = {}
    for i, (f, dt) in enumerate(zip(fam, dts, strict=True)):
        if f in WORK_FAMILIES and DTYPE_NAMES.get(dt, dt) in SLOW_DTYPES and mask[i]:
            a = i
            while rp[a] >= 0:
                a = rp[a]
            outer.setdefault(a, DTYPE_NAMES.get(dt, dt))
    groups: dict[int, _Group] = {}
    for a, dtype in sorted(outer.items()):
        if rows[a] < 0:
            continue
        g = groups.setdefault(int(rows[a]), _Group(event=a, op=nm[a], location=locs[a], dtype=dtype))
        g.calls += 1
        g.time += float(times[a])
        g.flops += float(flops[a])
        g.bytes += float(nbytes[a])
    return sorted(groups.values(), key=lambda g: -g.time)


def replay_spec(ctx: Context, i: int) -> dict[str, Any] | None:
    """Event i's call as the dtype probe takes it (see findings.base.DtypeProbe), or None when the trace
    lacks something the replay needs (a TensorList, a scalar without its recorded value)."""
    call = OpCall.from_json_text(names(ctx)[i], col(ctx, "input_dims")[i], col(ctx, "input_dtypes")[i],
                                 col(ctx, "input_strides")[i], col(ctx, "concrete_inputs")[i])
    args: list[dict[str, Any]] = []
    for k in range(call.nargs):
        t = call.tensor(k)
        dtype = call.dtypes[k] if k < len(call.dtypes) else ""
        if t is not None:
            args.append({"shape": list(t.shape), "stride": list(t.stride), "dtype": t.dtype})
        elif isinstance(dtype, list) or (isinstance(call.dims[k], list) and call.dims[k]):
            return None  # a TensorList
        elif dtype in ("None", ""):
            args.append({"value": parse_scalar(call.concrete[k] if k < len(call.concrete) else "")})
        else:
            value = parse_scalar(call.concrete[k] if k < len(call.concrete) else "")
            if value is None:
                return None
            args.append({"value": value})
    return {"op": names(ctx)[i], "args": args}


def _timings(ctx: Context, g: _Group) -> tuple[float, float] | None:
    """(µs per call in the op's own dtype, in float32) to compare: with the probe, both replayed alike
    (the own dtype only when the op is quicker than OWN_REPLAY_MAX_US, else its profiled time); without,
    the profiled time against the float32 roofline time."""
    t = g.time / g.calls
    if ctx.dtype_probe is not None:
        spec = replay_spec(ctx, g.event)
        measured = ctx.dtype_probe({**spec, "own": t <= OWN_REPLAY_MAX_US}) if spec is not None else None
        if measured is None:
            return None
        own, t32 = measured
        return (own if own is not None else t), t32
    peak, bw = ctx.peaks.flops_for("float32"), ctx.peaks.memory_bandwidth_gbps
    if not peak or not bw:
        return None
    return t, max(g.flops / g.calls / (peak * 1e3), 2 * g.bytes / g.calls / (bw * 1e3))


@rule("dtype-slow-path")
def dtype_slow_path(ctx: Context) -> Iterator[Finding]:
    slow: dict[str, list[tuple[_Group, float, float, float]]] = {}
    measured = ctx.dtype_probe is not None
    for g in [g for g in _groups(ctx) if share(g.time, ctx) >= MIN_SHARE][:MAX_PROBED]:
        timed = _timings(ctx, g)
        if timed is None or not all(math.isfinite(x) and x > 0 for x in timed):
            continue
        t, t32 = timed
        if measured and t < MIN_SLOWDOWN * t32:
            continue
        if not measured and (t32 < MIN_IDEAL_US or t < MIN_SLOWDOWN_ESTIMATED * t32):
            continue
        # the measured fraction of the profiled time, capped by the measured difference per call
        saving = min(g.time * (1 - t32 / t), g.calls * (t - t32))
        slow.setdefault(g.dtype, []).append((g, t, t32, saving))
    for dtype, items in slow.items():
        items.sort(key=lambda it: -it[3])
        saving = sum(it[3] for it in items)
        time = sum(it[0].time for it in items)
        against = "in float32 (measured: the same calls replayed on this device)" if measured else \
            "at their float32 roofline time (estimated from the float32 peak, not measured)"
        listed = "; ".join(f"{short(g.op)} {fmt_shape(tensor(ctx, g.event, 0))} at {g.location or '?'} takes "
                           f"{units.duration(t)} per call against {units.duration(t32)} ({t / t32:.0f}x)" for g, t, t32, _ in items[:TOP])
        message = (f"{dtype} convolutions/matmuls run far slower on this machine than {against}: {listed}. "
                   f"{count_per_step(sum(g.calls for g, *_ in items), ctx, 'such call')} per step take "
                   f"{units.duration(per_step(time, ctx))} per step ({share(time, ctx):.0%} of op time).{_peaks_note(ctx, dtype)}"
                   + ("" if measured else " The saving is estimated (an upper bound)."))
        template = GPU_SUGGESTION if ctx.gpu else CPU_SUGGESTION
        best = items[0][0]
        yield Finding(rule="dtype-slow-path", severity=severity(saving, ctx), op=best.op,
                      source_location=best.location, message=message,
                      suggestion=template.format(dtype=dtype, instructions=CPU_INSTRUCTIONS.get(dtype, "")),
                      est_savings_us=saving)


def _peaks_note(ctx: Context, dtype: str) -> str:
    """The calibrated GEMM peaks, when they show the same: the reduced-precision one below float32."""
    low, f32 = ctx.peaks.flops_gflops.get(dtype), ctx.peaks.flops_gflops.get("float32")
    if not low or not f32 or low >= f32:
        return ""
    origin = ctx.peaks.origin.get("flops", "unknown")
    return (f" The {dtype} GEMM peak ({units.gflops(low)}, {origin}) is below the float32 one "
            f"({units.gflops(f32)}) on this machine.")
