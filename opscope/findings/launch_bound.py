"""launch-bound (GPU runs): the GPU sits idle between kernels, waiting for the CPU to launch work.

Fires when the summary's device_busy_share (union of kernel time / step time) is under MAX_BUSY (0.5).
Names the ops with the most CPU time (ops.csv cpu_time_us_total, user code only) and is located at the
source line with the most CPU time. Saving: an upper bound, the GPU's idle time over the profiled steps,
steps x step_time x (1 - device_busy_share): what capturing the step in a CUDA graph (one launch for all
its kernels) would give back at most. A CUDA graph does not shorten the kernels themselves: their time is
the busy share, and what fusion or bigger batches would save of it is the overhead finding's, so the
two savings never count the same microseconds. A model that already runs compiled is not told to compile:
it is pointed at reduce-overhead's CUDA graphs and at its graph breaks.
"""

from __future__ import annotations

from collections.abc import Iterator

from opscope import units
from opscope.findings.base import Context, Finding, rule
from opscope.findings.common import severity, short
from opscope.findings.compiled import compiled_run
from opscope.sources import HARNESS
from opscope.table import group_sums, largest_first

MAX_BUSY = 0.5
TOP = 3

SUGGESTION = ("Take the CPU off the critical path: capture the step in a CUDA graph (torch.compile(mode="
              "'reduce-overhead') or torch.cuda.CUDAGraph), which launches all of its kernels at once; launch fewer "
              "kernels (torch.compile fuses small ops); remove host syncs (see host-sync findings); and use bigger "
              "batches so each launch does more work.")


# A model that already runs compiled: reduce-overhead's CUDA graphs and fewer graph breaks, not "compile it".
COMPILED_SUGGESTION = ("Take the CPU off the critical path of this compiled model: capture the step in CUDA graphs with "
                       "mode='reduce-overhead' (a cudagraph-skipped finding says why inductor did not, where it skipped "
                       "them); remove graph breaks (see graph-break findings), so that fewer, larger graphs are "
                       "launched; remove host syncs (see host-sync findings); and use bigger batches so each launch "
                       "does more work.")


GRAPH_SUGGESTION = ("The graph replay itself keeps the GPU busy; the idle time is between replays: remove host syncs "
                    "(see host-sync findings and the GPU idle gaps), overlap CPU-side scheduling with the replay, and "
                    "replay more work per launch (bigger batches, more decode steps per graph).")


@rule("launch-bound")
def launch_bound(ctx: Context) -> Iterator[Finding]:
    busy = ctx.device_busy_share
    if not ctx.gpu or busy is None or busy >= MAX_BUSY or "cpu_time_us_total" not in ctx.ops:
        return
    if (ctx.gpu_timeline or {}).get("gpu_only"):
        return  # no CPU activity recorded: nothing says what the GPU waited for
    ops = ctx.ops
    keep = [r for r, (loc, cpu) in enumerate(zip(ops["source_location"], ops["cpu_time_us_total"], strict=True))
            if loc != HARNESS and cpu > 0]
    cpu = [ops["cpu_time_us_total"][r] for r in keep]
    by_op = largest_first(group_sums([ops["op"][r] for r in keep], cpu))
    by_line = largest_first(group_sums([ops["source_location"][r] for r in keep], cpu))
    idle = ctx.steps * ctx.step_time_us * (1.0 - busy)
    kernel_time = ctx.step_time_us * busy
    heavy = ", ".join(f"{short(op)} ({units.duration(t)})" for op, t in by_op[:TOP])
    lines = ", ".join(f"{loc or '?'} ({units.duration(t)})" for loc, t in by_line[:TOP])
    message = (f"the GPU is busy only {busy:.0%} of the step ({units.duration(ctx.step_time_us)} per step): between kernels "
               f"it waits for the CPU to launch work. CPU-heaviest ops: {heavy}; lines: {lines}. Idle GPU time "
               f"{units.duration(idle)} in all ({units.duration(idle / max(ctx.steps, 1))} per step): the saving, an upper bound, "
               f"of launching the step's kernels at once from a CUDA graph. The graph does not shorten the kernels "
               f"themselves ({units.duration(kernel_time)} of kernel time per step; see the overhead finding for what "
               f"fusion saves there).")
    suggestion = COMPILED_SUGGESTION if compiled_run(ctx) else SUGGESTION
    timeline = ctx.gpu_timeline or {}
    if timeline.get("graph_replay"):
        # Already graph mode: a CUDA graph is not the fix; what keeps the GPU idle is outside the replay.
        gap = (timeline.get("idle_gaps") or [{}])[0]
        doing = (short(gap["cpu_op"]) if gap.get("cpu_op") else
                 f"Python code between ops, before {short(gap['cpu_next_op'])} at "
                 f"{gap.get('cpu_next_source_location') or '?'}" if gap.get("cpu_next_op") else "?")
        longest = (f" The longest idle gap, {units.duration(gap['duration_us'])}, is while the CPU runs {doing}."
                   if gap.get("duration_us") else "")
        message = (f"the GPU is busy only {busy:.0%} of the step ({units.duration(ctx.step_time_us)} per step) although the "
                   f"step already replays a CUDA/HIP graph: the idle time is outside the replay. CPU-heaviest ops: "
                   f"{heavy}; lines: {lines}. Idle GPU time {units.duration(idle)} in all "
                   f"({units.duration(idle / max(ctx.steps, 1))} per step): the saving, an upper bound.{longest}")
        suggestion = GRAPH_SUGGESTION
    yield Finding(rule="launch-bound", severity=severity(idle, ctx), op=str(by_op[0][0]) if by_op else "",
                  source_location=str(by_line[0][0]) if by_line else "", message=message,
                  suggestion=suggestion, est_savings_us=idle)


