"""compile-fallback (compiled models, from the TORCH_TRACE log): an op inductor has no lowering for, left to
ATen inside a compiled graph (provenance kernels of kind "fallback": `torch.ops.aten.nonzero.default`, a
custom op). It runs as its own eager kernel between the generated ones: nothing fuses across it, and an
op whose output size depends on the data (nonzero, unique, masked_select) makes the host wait for the
device to learn that size.

Not flagged: what inductor always hands to a library, as expected: attention (SDPA's flash / efficient /
cuDNN kernels), matmuls and convolutions, linear algebra and FFTs, RNNs, collectives, random number
generation and bookkeeping ops (EXPECTED_*).

One finding per (op, user line): the line from the kernel's provenance stack traces. The message gives
the op's time where the run's ops table has rows of that op inside a compiled graph. Saving: none
estimated (a lowering's speed is not known); severity low, as for any finding without a saving.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from opscope import units
from opscope.findings.base import Context, Finding, rule
from opscope.findings.common import count_per_step
from opscope.findings.compiled import printable, user_location

# namespaces whose ops inductor leaves to their library on purpose
EXPECTED_NAMESPACES = frozenset({"_c10d_functional", "c10d_functional", "c10d", "_dtensor", "streams", "mkldnn",
                                 "onednn", "quantized", "fbgemm", "rngprims", "inductor_prims", "higher_order"})
# aten op names (overload dropped) with a library kernel inductor calls as it is
EXPECTED_OPS = frozenset({
    "mm", "bmm", "addmm", "baddbmm", "addbmm", "_addmm_activation", "_scaled_mm", "_scaled_grouped_mm",
    "_grouped_mm", "_int_mm", "_weight_int8pack_mm", "_weight_int4pack_mm", "convolution", "_convolution",
    "convolution_backward", "cudnn_convolution", "miopen_convolution", "_cudnn_rnn", "_cudnn_rnn_backward",
    "miopen_rnn", "miopen_rnn_backward", "_thnn_fused_lstm_cell", "triangular_solve", "cholesky_solve",
    "cholesky_inverse", "geqrf", "ormqr", "lu_unpack", "_amp_update_scale_", "_amp_update_scale", "resize_",
    "resize_as_", "_efficientzerotensor", "randint", "rand_like", "randn_like", "randint_like", "uniform",
    "exponential", "multinomial", "randperm", "bernoulli", "normal", "rrelu_with_noise_functional",
})
EXPECTED_WORDS = ("attention", "linalg_", "_fft_", "cudnn", "miopen", "mkldnn")
# ops whose output size depends on the data
DATA_DEPENDENT = frozenset({"nonzero", "nonzero_static", "unique", "_unique", "_unique2", "unique_dim",
                            "unique_consecutive", "unique_dim_consecutive", "masked_select", "bincount", "histc"})

DATA_DEPENDENT_SUGGESTION = ("Its output size depends on the data, which no graph can fuse: use masks (torch.where, a "
                             "multiplication) instead of selecting elements, or a fixed size (torch.nonzero_static(x, "
                             "size=N) for nonzero).")
CUSTOM_SUGGESTION = ("Inductor sees a custom op as an opaque call: write it with torch ops inductor can fuse, or as a "
                     "Triton kernel registered with torch.library.triton_op, which inductor compiles along with the "
                     "graph.")
DEFAULT_SUGGESTION = ("Inductor has no lowering for this op: replace it with ops it lowers (an equivalent made of "
                      "element-wise ops and reductions), or move it out of the hot path.")


@dataclass
class _Fallback:
    graphs: list[str] = field(default_factory=list)
    calls: int = 0


def split_op(kernel_name: str) -> tuple[str, str]:
    """'torch.ops.aten.nonzero.default' -> ('aten', 'nonzero')."""
    parts = kernel_name.split(".")
    if len(parts) >= 4 and parts[0] == "torch" and parts[1] == "ops":
        return parts[2], parts[3]
    return "", kernel_name


def expected(namespace: str, op: str) -> bool:
    if namespace in EXPECTED_NAMESPACES:
        return True
    if namespace in ("aten", "prims"):
        return op in EXPECTED_OPS or any(w in op for w in EXPECTED_WORDS)
    return False


def _time(ctx: Context, op: str) -> tuple[float, int] | None:
    """(time, calls) of the ops rows named `op` that ran inside a compiled graph; None when there are none."""
    ops = ctx.ops
    if "compiled_graph" not in ops:
        return None
    rows = [r for r, (name, graph) in enumerate(zip(ops["op"], ops["compiled_graph"], strict=True))
            if name == op and isinstance(graph, str) and graph]
    if not rows:
        return None
    return float(sum(ops["time_us_total"][r] for r in rows)), int(sum(ops["calls"][r] for r in rows))


@rule("compile-fallback")
def compile_fallback(ctx: Context) -> Iterator[Finding]:
    log = ctx.compile_log
    if log is None:
        return
    groups: dict[tuple[str, str, str], _Fallback] = {}
    for graph, kernel in log.kernels():
        if kernel.kind != "fallback":
            continue
        namespace, op = split_op(kernel.name)
        if expected(namespace, op):
            continue
        loc = next((user_location(s) for s in kernel.stacks if user_location(s)), "")
        g = groups.setdefault((namespace, op, loc), _Fallback())
        if graph.compile_id not in g.graphs:
            g.graphs.append(graph.compile_id)
        g.calls += 1
    for (namespace, op, loc), g in groups.items():
        name = printable(f"{namespace}::{op}" if namespace else op, 200)
        found = _time(ctx, name)
        timed = (f" It ran {count_per_step(found[1], ctx, 'time')} per step, {units.duration(found[0])} in all."
                 if found is not None else "")
        if op in DATA_DEPENDENT and namespace == "aten":
            why, suggestion = " Its output size depends on the data, so the host waits for the device to learn it.", \
                DATA_DEPENDENT_SUGGESTION
        elif namespace not in ("aten", "prims"):
            why, suggestion = " It is a custom op.", CUSTOM_SUGGESTION
        else:
            why, suggestion = "", DEFAULT_SUGGESTION
        message = (f"inductor left {name} to ATen in compiled graph {', '.join(g.graphs)}: it has no lowering for it, "
                   f"so it runs as its own kernel between the generated ones and nothing fuses across it.{why}{timed}")
        yield Finding(rule="compile-fallback", severity="low", op=name, source_location=loc, message=message,
                      suggestion=suggestion, est_savings_us=None)
