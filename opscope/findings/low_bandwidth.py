"""low-bandwidth: memory-bound ops that move enough bytes to matter yet reach under 70 % of the peak
memory bandwidth.

Per ops.csv row (user code only): bound == memory, pct_peak_bandwidth < BW_FRACTION (70 %), and the
call moves enough bytes that latency cannot explain the shortfall: bytes_per_call / peak bandwidth >=
MIN_IDEAL_US (5 µs; e.g. 100 KB at 20 GB/s, 17 MB on an H100). Copies reported by the copy rules,
strided reductions, ops of a reported fusion run without a layout cause (the fusion finding covers
them), ops of a per-parameter optimizer step (optimizer-loop), ops a channels-last finding measured
faster in the other layout, and ops running inside another op that does work (e.g. CPU addmm filling
its output with the bias) are left alone. Without a layout probe (`analyze`), a pooling, batch norm or
upsampling op fed NCHW gets NCHW named as its possible cause (on CPUs their channels_last kernels are
often several times faster) and the channels_last suggestion instead of the generic one. The likely cause is named from the recorded strides:
a strided/transposed input, an input broadcast along its innermost dim (stride 0; not used for backward
ops, whose incoming gradients are often expanded by a sum/mean loss), or a small innermost dim (see
common.layout_cause; matmul/conv/attention take transposed operands natively and get no cause).
Saving = time - calls x bytes / (0.7 x peak bandwidth). Rows under MIN_SHARE of the op time are dropped.
On a model that already runs compiled, no suggestion names torch.compile (COMPILED_SUGGESTIONS).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from opscope import units
from opscope.findings.base import Context, Finding, rule
from opscope.findings.channels_last import LAYOUT_OPS, LAYOUT_SUGGESTION, layout_claimed_events
from opscope.findings.common import count_per_step, ideal_memory_us, severity, share
from opscope.findings.compiled import compiled_run
from opscope.findings.copies import claimed_events
from opscope.findings.fusion import fused_events
from opscope.findings.layout import CAUSE_TEXT, is_nchw, layout_cause, tensor, tensors
from opscope.findings.optimizer_loop import loop_events
from opscope.findings.strided_reduction import strided_rows
from opscope.findings.tree import col, events_by_ops_row, inside_worker, names, ops_rows
from opscope.machine.noise import noise_caveat

BW_FRACTION = 0.70
MIN_IDEAL_US = 5.0
MIN_SHARE = 0.001
STRIDE_AGNOSTIC_FAMILIES = frozenset({"matmul", "conv", "attention"})
MATMUL_SUGGESTION = ("A memory-bound matmul streams its weights for few rows (small M): batch more rows "
                     "(tokens, sequences, images) per call so each weight byte is used more often.")

SUGGESTIONS = {
    "strided": "Make the tensor contiguous where it is produced (or transpose the weights instead of the "
               "activations) so this op reads memory in order; torch.compile can also fuse the transpose into "
               "the op.",
    "broadcast": "Arrange the broadcast along an outer dim (e.g. a per-row scale as [N, 1] times [N, D], not an "
                 "expanded innermost dim), or fuse the op with its neighbours (torch.compile).",
    "small-inner": "Put the largest dimension innermost (permute once upstream) or fuse the op with its "
                   "neighbours (torch.compile) so each memory transaction carries more data.",
    None: "No layout problem is visible in the strides: the kernel itself falls short (type promotion inside "
          "the op, an unvectorized path, too little work per call to fill the device). torch.compile can "
          "generate a better kernel and fuse it with its neighbours.",
}
# The same on a model that already runs compiled: nothing about torch.compile; without a layout cause, what
# applies to a compiled graph's kernel, or to an op that ran outside the graphs.
COMPILED_SUGGESTIONS = {
    "strided": "Make the tensor contiguous where it is produced (or transpose the weights instead of the "
               "activations) so this op reads memory in order.",
    "broadcast": "Arrange the broadcast along an outer dim (e.g. a per-row scale as [N, 1] times [N, D], not an "
                 "expanded innermost dim).",
    "small-inner": "Put the largest dimension innermost (permute once upstream) so each memory transaction carries "
                   "more data.",
    "inside": "No layout problem is visible in the strides, and this runs inside a compiled graph: mode='max-autotune' "
              "lets inductor tune its kernels (block sizes, matmul choices), and more work per call (bigger batches) "
              "fills the device better.",
    "outside": "No layout problem is visible in the strides: the kernel itself falls short (type promotion inside the "
               "op, an unvectorized path, too little work per call to fill the device). The model already runs "
               "compiled, but this op ran outside its graphs: bring it into the compiled function, where inductor "
               "generates and fuses it.",
}
# On CPUs a large output is often fresh memory from the OS each call: the page faults cost bandwidth.
CPU_NO_CAUSE = (" On CPUs, large outputs freshly allocated on every call pay page faults: an in-place variant "
                "(e.g. relu_) or a caching malloc (jemalloc/tcmalloc via LD_PRELOAD) avoids them.")


def row_cause(ctx: Context, i: int) -> str | None:
    if col(ctx, "family")[i] in STRIDE_AGNOSTIC_FAMILIES:
        return None  # BLAS/cuDNN take transposed operands natively: their strides are no cause
    return layout_cause(tensors(ctx, i), allow_broadcast=col(ctx, "bwd_root")[i] < 0)


def _nchw_layout_op(ctx: Context, i: int) -> bool:
    """A pooling / batch norm / upsampling op fed NCHW, in a run without a layout probe (with one, the
    channels-last rule measured it and took it if channels_last was faster)."""
    name = names(ctx)[i]
    return (ctx.layout_probe is None and LAYOUT_OPS.get(name, "conv2d") != "conv2d"
            and is_nchw(tensor(ctx, i, 0)))


def _suggestion(ctx: Context, cause: str | None, row: dict[str, object]) -> str:
    if not compiled_run(ctx):
        return SUGGESTIONS[cause]
    if cause is not None:
        return COMPILED_SUGGESTIONS[cause]
    graph = row.get("compiled_graph")
    return COMPILED_SUGGESTIONS["inside" if isinstance(graph, str) and graph else "outside"]


@rule("low-bandwidth")
def low_bandwidth(ctx: Context) -> Iterator[Finding]:
    claimed = claimed_events(ctx)
    fused = fused_events(ctx)
    strided = strided_rows(ctx)
    reported = loop_events(ctx) | layout_claimed_events(ctx)  # by optimizer-loop and channels-last
    bw = ctx.peaks.memory_bandwidth_gbps
    for r, evs in events_by_ops_row(ctx).items():
        row = ops_rows(ctx)[r]
        if row["bound"] != "memory" or r in strided or all(i in claimed or i in reported for i in evs):
            continue
        if inside_worker(ctx, evs[0]):
            continue  # part of another op's implementation (e.g. addmm filling its output with the bias)
        pct = row["pct_peak_bandwidth"]
        nbytes = float(row["bytes_per_call"])
        ideal = ideal_memory_us(nbytes, ctx)
        if not math.isfinite(float(pct)) or pct >= BW_FRACTION * 100 or ideal is None or ideal < MIN_IDEAL_US:
            continue
        time, calls = float(row["time_us_total"]), int(row["calls"])
        saving = time - calls * ideal / BW_FRACTION
        if share(saving, ctx) < MIN_SHARE:
            continue
        cause = row_cause(ctx, evs[0])
        if cause is None and all(i in fused for i in evs):
            continue  # the fusion finding covers these ops and their time
        why = f"likely cause: {CAUSE_TEXT[cause]}" if cause else "no layout cause visible in the strides"
        suggestion = MATMUL_SUGGESTION if row["family"] in STRIDE_AGNOSTIC_FAMILIES else _suggestion(ctx, cause, row)
        if cause is None and _nchw_layout_op(ctx, evs[0]):
            why = ("possible cause: its input is NCHW, and this op's channels_last kernel is often several "
                   "times faster (`opscope profile` measures both layouts)")
            suggestion = LAYOUT_SUGGESTION
        elif cause is None and not ctx.gpu and row["family"] not in STRIDE_AGNOSTIC_FAMILIES:
            suggestion += CPU_NO_CAUSE
        message = (f"{row['op']} {row['input_dims']} moves {units.nbytes(nbytes)} per call at "
                   f"{units.gbps(row['achieved_gbps'])}, {pct:.0f}% of the peak {units.gbps(bw)} "
                   f"({count_per_step(calls, ctx, 'call')} per step, {units.duration(time)} in all); {why}.")
        message += noise_caveat(ctx.noise)
        yield Finding(rule="low-bandwidth", severity=severity(saving, ctx), op=row["op"],
                      source_location=row["source_location"], message=message, suggestion=suggestion,
                      est_savings_us=saving)
