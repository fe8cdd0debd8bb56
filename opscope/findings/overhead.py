"""overhead: a large share of op time goes to overhead-bound ops: views, and ops whose work would take
under 1 µs at the machine's peaks. What sets their time depends on the device:

- CPU: per-op dispatch (Python, the dispatcher, output allocation) dominates the op's self time;
- GPU: the time is kernel time, and a kernel that small is latency-bound: fixed per-kernel costs (getting
  the kernel onto the SMs, the ramp-up while too few thread blocks fill them, the tail) dominate it, not
  its FLOPs or bytes (BERT-small's [141, 512] x [512, 512] addmm on an H100: 5.8 µs per kernel, 0.24 µs
  of work at the peaks). The CPU's own launch cost is not in kernel time at all: it shows as the GPU's
  idle time between kernels, which the launch-bound rule reports.

Fires when overhead-bound ops of the user's code take at least MIN_SHARE (25 %) of the run's op time and
at least MIN_US_PER_STEP (20 µs) per step. One finding for the run, located at the source line with the
most overhead-bound time; the message gives that share, the ops per step (on GPUs the kernels per step
and their mean time against their mean roofline time), the largest op's time per call against its
roofline time, and the lines and ops that contribute most. Ops of a per-parameter optimizer step are
left to the optimizer-loop finding.

Saving: an upper bound, the overhead-bound ops' time minus their roofline time at the peaks. On a CPU,
what fusion / bigger batches would save of per-op dispatch; on a GPU, what fusing the kernels into fewer
ones or giving each more work (bigger batches) would save of the kernels' own time. CUDA graphs do not
shorten kernels; they remove the idle gaps between them, which launch-bound estimates from the GPU's
idle time, so the two savings never count the same microseconds. A model that already runs compiled is
pointed at what splits or escapes its graphs instead of at torch.compile.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from opscope import units
from opscope.findings.base import Context, Finding, rule
from opscope.findings.common import ideal_row_us, per_step, severity, share, short
from opscope.findings.compiled import compiled_run
from opscope.findings.optimizer_loop import loop_events
from opscope.findings.tree import events_by_ops_row, ops_rows, user_mask
from opscope.machine.noise import noise_caveat
from opscope.sources import HARNESS
from opscope.table import pairwise_sum

MIN_SHARE = 0.25
MIN_US_PER_STEP = 20.0
TOP = 3

GPU_SUGGESTION = ("Fewer, bigger kernels: torch.compile fuses chains of small element-wise / norm kernels into one, "
                  "and more work per kernel (bigger batches, batched ops instead of Python loops over small "
                  "tensors) spreads each kernel's fixed latency over more data. CUDA graphs "
                  "(torch.compile(mode='reduce-overhead')) remove the CPU launch gaps between kernels (see "
                  "launch-bound), not the kernels' own latency.")
CPU_SUGGESTION = ("Cut per-op cost: torch.compile fuses small ops and removes view/dispatch overhead; give each op "
                  "more work (bigger batches, vectorize Python-level loops over small tensors).")

# A model that already runs compiled: what splits or escapes its graphs, not "compile it".
COMPILED_GPU_SUGGESTION = ("Fewer, bigger kernels: the model already runs compiled, so look at what splits its graphs "
                           "(graph-break findings) and at the ops inductor leaves to ATen (compile-fallback findings); "
                           "more work per kernel (bigger batches, batched ops instead of Python loops over small tensors) "
                           "spreads each kernel's fixed latency over more data. CUDA graphs (mode='reduce-overhead') "
                           "remove the CPU launch gaps between kernels (see launch-bound), not the kernels' own latency.")
COMPILED_CPU_SUGGESTION = ("Cut per-op cost: the model already runs compiled, so bring the ops that still run one by one "
                           "into its graphs (graph-break findings: what splits them; compile-fallback findings: ops "
                           "inductor leaves to ATen); give each op more work (bigger batches, vectorize Python-level "
                           "loops over small tensors).")

NO_LINE = "(no source line)"


@rule("overhead")
def overhead(ctx: Context) -> Iterator[Finding]:
    ops = ctx.ops
    in_loop = loop_events(ctx)
    loop_rows = {r for r, evs in events_by_ops_row(ctx).items() if all(i in in_loop for i in evs)} if in_loop else set()
    picked = [r for r, (bound, loc) in enumerate(zip(ops["bound"], ops["source_location"], strict=True))
              if bound == "overhead" and loc != HARNESS and r not in loop_rows]
    times = [ops["time_us_total"][r] for r in picked]
    time = pairwise_sum(times)
    if share(time, ctx) < MIN_SHARE or per_step(time, ctx) < MIN_US_PER_STEP:
        return
    saving = ideal_total = 0.0
    by_line: dict[str, float] = defaultdict(float)
    by_op: dict[str, float] = defaultdict(float)
    rows = [ops_rows(ctx)[r] for r in picked]
    for row in rows:
        ideal = int(row["calls"]) * (ideal_row_us(row, ctx) or 0.0)
        ideal_total += ideal
        saving += max(float(row["time_us_total"]) - ideal, 0.0)
        by_line[row["source_location"] or NO_LINE] += float(row["time_us_total"])
        by_op[row["op"]] += float(row["time_us_total"])
    lines = sorted(by_line.items(), key=lambda kv: -kv[1])
    top_ops = sorted(by_op.items(), key=lambda kv: -kv[1])[:TOP]
    where = ", ".join(f"{loc} ({units.duration(t)})" for loc, t in lines[:TOP])
    what = ", ".join(f"{short(op)} ({units.duration(t)})" for op, t in top_ops)
    big = rows[_argmax(times)]
    big_ideal = ideal_row_us(big, ctx)
    example = (f"{short(big['op'])} at {big['source_location'] or NO_LINE} takes {units.duration(big['time_us_per_call'])} per "
               "call" + (f" against {units.duration(big_ideal)} at the peaks" if big_ideal is not None else ""))
    if ctx.gpu:
        kernels = _kernels(ctx, picked)
        mean = f"{units.duration(time / kernels)} per kernel on average against {units.duration(ideal_total / kernels)} at the peaks" \
            if kernels else "no kernels"
        message = (f"{share(time, ctx):.0%} of GPU kernel time ({units.duration(per_step(time, ctx))} per step) is in latency-bound "
                   f"kernels: their work would take under 1 µs at the peaks, but fixed per-kernel latency (launch onto "
                   f"the SMs, ramp-up, tail) sets their time, not their FLOPs or bytes ({per_step(kernels, ctx):.0f} "
                   f"such kernels per step, {mean}; e.g. {example}). Most of it: {what}; lines: {where}. Saving "
                   f"(an upper bound): their time above the roofline, what fusing them into fewer kernels or giving "
                   f"each more work can reclaim; CUDA graphs do not shorten kernels (the GPU's idle time between "
                   f"kernels is the launch-bound finding's).")
    else:
        n_ops = per_step(float(sum(1 for row, user in zip(ctx.events["is_row"], user_mask(ctx), strict=True)
                                   if row and user)), ctx)
        message = (f"{share(time, ctx):.0%} of op time ({units.duration(per_step(time, ctx))} per step) is in overhead-bound "
                   f"ops: their work would take under 1 µs at the peaks, so per-op dispatch (Python, the dispatcher, "
                   f"allocation) sets their time ({n_ops:.0f} ops per step; e.g. {example}). Most of it: {what}; "
                   f"lines: {where}. Saving is an upper bound (all per-op cost removed).")
    message += noise_caveat(ctx.noise)
    yield Finding(rule="overhead", severity=severity(saving, ctx), op=top_ops[0][0] if top_ops else "",
                  source_location=next((loc for loc, _ in lines if loc != NO_LINE), ""), message=message,
                  suggestion=_suggestion(ctx), est_savings_us=saving)


def _suggestion(ctx: Context) -> str:
    if compiled_run(ctx):
        return COMPILED_GPU_SUGGESTION if ctx.gpu else COMPILED_CPU_SUGGESTION
    return GPU_SUGGESTION if ctx.gpu else CPU_SUGGESTION


def _kernels(ctx: Context, rows: list[int]) -> int:
    """GPU kernels launched by the user's events of these ops.csv rows (by position; views launch none)."""
    n_kernels = ctx.events["n_kernels"]
    groups = events_by_ops_row(ctx)
    return int(sum(n_kernels[i] for r in rows for i in groups.get(r, [])))


def _argmax(values: list[float]) -> int:
    """Position of the first largest value; a NaN wins, as in np.argmax."""
    best = 0
    for k, v in enumerate(values):
        if v != v:
            return k
        if v > values[best]:
            best = k
    return best
