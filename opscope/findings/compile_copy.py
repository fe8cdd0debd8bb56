"""compile-copy (compiled models, from the TORCH_TRACE log): a kernel inductor generated (Triton or C++) that
only moves data: every post-grad node it fused is a copy, a view or a dtype conversion (clone, copy_,
_to_copy, convert_element_type, permute / transpose made contiguous, cat or constant_pad_nd of copies),
so it reads a tensor and writes it again in another layout or dtype, computing nothing. Such a kernel is
what the graph asked for (a `.contiguous()`, a `.to(dtype)`, an input an extern kernel needs dense), so
the line that asked for it is the place to fix.

One finding per kernel; the lines from its nodes' frames (the graph printer's `# File:` comments), else
its provenance stack traces. Where the run's ops table has a row for the kernel (its name, or the C++
kernel's profiler row `graph_N_cpp_...`; a row whose name is the kernel's with a `graph_N_` prefix
counts too), the saving is that row's time: an upper bound, as the consumer may then read the strided
or other-dtype tensor more slowly. Else no saving; severity low.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from opscope import units
from opscope.findings.base import Context, Finding, rule
from opscope.findings.common import count_per_step, severity
from opscope.findings.compiled import printable, user_location
from opscope.sources import frame_location
from opscope.trace.torch_trace import CompiledGraph, CompiledKernel

LAYOUT_OPS = frozenset({"aten::permute", "aten::transpose", "aten::t", "aten::clone", "aten::contiguous",
                        "aten::copy", "aten::copy_", "aten::as_strided", "aten::expand", "aten::slice",
                        "aten::select", "aten::narrow", "aten::view", "aten::_unsafe_view", "aten::reshape",
                        "aten::unsqueeze", "aten::squeeze", "aten::alias", "aten::flatten", "aten::unfold",
                        "aten::split", "aten::split_with_sizes", "aten::repeat", "aten::cat", "aten::constant_pad_nd",
                        "aten::expand_copy", "aten::permute_copy", "aten::view_copy", "getitem"})
DTYPE_OPS = frozenset({"prims::convert_element_type", "aten::_to_copy", "aten::to"})
DATA_MOVEMENT = LAYOUT_OPS | DTYPE_OPS
_GRAPH_PREFIX = re.compile(r"^graph_\d+_")

SUGGESTIONS = {
    "layout": ("The kernel rewrites a tensor in another memory layout: hand its consumer the layout it reads (matmul "
               "and attention take transposed or strided operands as they are), drop a `.contiguous()` the next op "
               "does not need, or produce the tensor in the wanted order upstream (transpose the smaller tensor, "
               "e.g. the weights)."),
    "dtype": ("The kernel converts a tensor to another dtype: keep one dtype through the model (create tensors in it, "
              "convert the weights once with model.to(dtype), or torch.autocast), so that no conversion stands on "
              "its own."),
}


def movement_kind(graph: CompiledGraph, kernel: CompiledKernel) -> str | None:
    """'layout', 'dtype' or 'layout+dtype' when every node the kernel fused moves data; None otherwise
    (or when a node is not in the graph the log printed)."""
    ops = []
    for name in kernel.nodes:
        node = graph.nodes.get(name)
        if node is None or node.op not in DATA_MOVEMENT:
            return None
        ops.append(node.op)
    if not ops:
        return None
    kinds = [k for k, found in (("layout", any(op in LAYOUT_OPS for op in ops)),
                                 ("dtype", any(op in DTYPE_OPS for op in ops))) if found]
    return "+".join(kinds)


def _lines(graph: CompiledGraph, kernel: CompiledKernel) -> list[str]:
    """The user lines the kernel's nodes came from, in node order; else from its provenance stacks."""
    out: list[str] = []
    for name in kernel.nodes:
        frame = graph.nodes[name].frame
        loc = frame_location(frame.path, frame.line) if frame is not None else None
        if loc and loc not in out:
            out.append(loc)
    for stack in kernel.stacks:
        loc = user_location(stack)
        if loc and loc not in out:
            out.append(loc)
    return out


def _row_time(ctx: Context, graph: CompiledGraph, kernel: CompiledKernel) -> tuple[float, int] | None:
    """(time, calls) of the ops rows of this kernel: named as the kernel or its profiler row, in this graph
    when the rows say which (ops.csv compiled_graph holds `## Call CompiledFxGraph <key> ##`)."""
    ops = ctx.ops
    names = {kernel.name, kernel.record_name} - {""}
    graphs = ops.get("compiled_graph") or [""] * len(ops["op"])
    rows = []
    for r, (op, where) in enumerate(zip(ops["op"], graphs, strict=True)):
        if not isinstance(op, str) or (op not in names and _GRAPH_PREFIX.sub("", op) != kernel.name):
            continue
        if graph.cache_key and isinstance(where, str) and "CompiledFxGraph" in where and graph.cache_key not in where:
            continue  # the same kernel name in another graph
        rows.append(r)
    if not rows:
        return None
    return float(sum(ops["time_us_total"][r] for r in rows)), int(sum(ops["calls"][r] for r in rows))


@rule("compile-copy")
def compile_copy(ctx: Context) -> Iterator[Finding]:
    log = ctx.compile_log
    if log is None:
        return
    for graph, kernel in log.kernels():
        if kernel.kind not in ("triton", "cpp"):
            continue
        kind = movement_kind(graph, kernel)
        if kind is None:
            continue
        lines = _lines(graph, kernel)
        nodes = ", ".join(dict.fromkeys(printable(graph.nodes[n].op.split("::")[-1], 80) for n in kernel.nodes))
        found = _row_time(ctx, graph, kernel)
        saving = found[0] if found is not None else None
        timed = (f" It ran {count_per_step(found[1], ctx, 'time')} per step, {units.duration(found[0])} in all: the saving, "
                 f"an upper bound (a consumer may then read the other layout or dtype more slowly)."
                 if found is not None else " The run has no row of its own for it, so its time is not known.")
        what = {"layout": "a copy into another memory layout", "dtype": "a dtype conversion",
                "layout+dtype": "copies into another memory layout and dtype"}[kind]
        name = printable(kernel.record_name or kernel.name, 200)
        message = (f"inductor generated {name} in compiled graph {graph.compile_id} only to move data, {what} "
                   f"({nodes}): it reads and writes the tensor and computes nothing"
                   f"{' (lines ' + ', '.join(lines) + ')' if len(lines) > 1 else ''}.{timed}")
        suggestion = " ".join(SUGGESTIONS[k] for k in kind.split("+"))
        yield Finding(rule="compile-copy", severity=severity(saving, ctx), op=name,
                      source_location=lines[0] if lines else "", message=message, suggestion=suggestion,
                      est_savings_us=saving)
