"""overhead: a large share of op time goes to overhead-bound ops (views, tiny ops whose work would take
under 1 µs at the machine's peaks: per-op dispatch on CPUs, kernel launch latency on GPUs).

Fires when overhead-bound ops of the user's code take at least MIN_SHARE (25 %) of the run's op time and
at least MIN_US_PER_STEP (20 µs) per step. One finding for the run, located at the source line with the
most overhead-bound time; the message gives that share, the ops per step (and kernels per step on GPUs)
and the lines and ops that contribute most. Saving: an upper bound, the overhead-bound ops' time minus
their roofline time at the peaks (what would remain if fusion / graph capture removed all per-op cost).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

import numpy as np

from opscope.findings.base import Context, Finding, rule
from opscope.findings.common import fmt_us, ideal_row_us, per_step, severity, share, short, user_mask
from opscope.noise import noise_caveat
from opscope.sources import HARNESS

MIN_SHARE = 0.25
MIN_US_PER_STEP = 20.0
TOP = 3

GPU_SUGGESTION = ("Cut per-op cost: capture the step in a CUDA graph (torch.compile(mode='reduce-overhead') or "
                  "torch.cuda.CUDAGraph), fuse small ops with torch.compile, and give each op more work (bigger "
                  "batches, fewer Python-level loops over small tensors).")
CPU_SUGGESTION = ("Cut per-op cost: torch.compile fuses small ops and removes view/dispatch overhead; give each op "
                  "more work (bigger batches, vectorize Python-level loops over small tensors).")


@rule("overhead")
def overhead(ctx: Context) -> Iterator[Finding]:
    ops = ctx.ops
    sel = ops[(ops["bound"] == "overhead") & (ops["source_location"] != HARNESS)]
    time = float(sel["time_us_total"].sum())
    if share(time, ctx) < MIN_SHARE or per_step(time, ctx) < MIN_US_PER_STEP:
        return
    saving = 0.0
    by_line: dict[str, float] = defaultdict(float)
    by_op: dict[str, float] = defaultdict(float)
    for _, row in sel.iterrows():
        ideal = ideal_row_us(row, ctx) or 0.0
        saving += max(float(row["time_us_total"]) - int(row["calls"]) * ideal, 0.0)
        by_line[row["source_location"] or "?"] += float(row["time_us_total"])
        by_op[row["op"]] += float(row["time_us_total"])
    lines = sorted(by_line.items(), key=lambda kv: -kv[1])
    top_ops = sorted(by_op.items(), key=lambda kv: -kv[1])[:TOP]
    ev = ctx.events
    mask = user_mask(ctx)
    n_ops = per_step(float(np.count_nonzero(ev["is_row"].to_numpy() & mask)), ctx)
    counts = f"{n_ops:.0f} ops per step"
    if ctx.gpu:
        counts += f", {per_step(float(ev.loc[mask, 'n_kernels'].sum()), ctx):.0f} kernels per step"
    where = ", ".join(f"{loc} ({fmt_us(t)})" for loc, t in lines[:TOP])
    what = ", ".join(f"{short(op)} ({fmt_us(t)})" for op, t in top_ops)
    message = (f"{share(time, ctx):.0%} of op time ({fmt_us(per_step(time, ctx))} per step) is in overhead-bound "
               f"ops, whose work would take under 1 µs at the peaks ({counts}). Most of it: {what}; lines: {where}. "
               f"Saving is an upper bound (all per-op cost removed).")
    message += noise_caveat(ctx.noise)
    yield Finding(rule="overhead", severity=severity(saving, ctx), op=top_ops[0][0] if top_ops else "",
                  source_location=lines[0][0] if lines else "", message=message,
                  suggestion=GPU_SUGGESTION if ctx.gpu else CPU_SUGGESTION, est_savings_us=saving)
