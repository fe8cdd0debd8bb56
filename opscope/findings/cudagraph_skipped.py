"""cudagraph-skipped (compiled models, from the TORCH_TRACE log): torch.compile(mode="reduce-overhead") asked
for CUDA graphs, and inductor compiled a graph without them, saying why: an input mutated in place, CPU
tensors or ops in the graph, dynamic shapes, an op graphs cannot capture, the C++ wrapper. Its kernels are
then launched one by one from the CPU, which is what reduce-overhead was meant to avoid.

torch 2.13 records the reason in the compile metrics (`cudagraph_skip_reason`) when inductor decides
while compiling; skips decided at run time (cudagraph trees) go only to the `torch._inductor.cudagraph_utils`
logger and a counter, not to the log, and inductor says nothing of the CPU-only graphs it skips (it only
counts them). One finding per reason, located at the line in the reason's `Found from` stack trace, else
where the compiled function starts. Saving: none estimated (the launch-bound finding estimates the GPU's
idle time between kernels); severity medium.
"""

from __future__ import annotations

from collections.abc import Iterator

from opscope.findings.base import Context, Finding, rule
from opscope.findings.compiled import first_line, frame_names, frame_start, frames_in_text, user_location

# (words in the reason, what to do), first match wins
FIXES = (
    (("mutated inputs", "input storage mutation"),
     "Do not mutate the compiled function's inputs in place (x.add_(...), an index_put_ into an input): return a new "
     "tensor, or do the in-place update outside the compiled function."),
    (("cpu device", "non gpu ops", "cpu tensors", "device(type='cpu')"),
     "Keep the graph on the GPU: move CPU inputs and constants to the device once, outside the step, and avoid "
     "CPU-side ops inside the compiled function."),
    (("symbolic shapes", "dynamic shape"),
     "CUDA graphs need fixed shapes: pad or bucket inputs to a few fixed sizes and compile with dynamic=False, or set "
     "torch._inductor.config.triton.cudagraph_skip_dynamic_graphs = False to record one graph per shape."),
    (("incompatible op", "boolean indexing", "index_put_"),
     "An op in the graph cannot run inside a CUDA graph (the reason names it): replace it (torch.where or masks for "
     "boolean indexing) or move it out of the compiled function."),
    (("cpp-wrapper", "cpp_wrapper"),
     "The C++ wrapper does not support CUDA graphs with graph partitioning: compile without cpp_wrapper for "
     "mode='reduce-overhead', or set torch._inductor.config.graph_partition = False."),
)
DEFAULT_FIX = ("Remove what the reason names from the compiled function, so that inductor can capture the graph "
               "(TORCH_LOGS=perf_hints prints each skip as it happens).")


@rule("cudagraph-skipped")
def cudagraph_skipped(ctx: Context) -> Iterator[Finding]:
    log = ctx.compile_log
    if log is None:
        return
    named = frame_names(log.metrics)
    by_id = {m.compile_id: m for m in log.metrics}
    groups: dict[tuple[str, str], list[str]] = {}
    for m in [*log.metrics, *log.backward_metrics]:
        if not m.cudagraph_skip_reason:
            continue
        frame = by_id.get(m.compile_id) or named.get(m.frame_index)
        loc = user_location(frames_in_text(m.cudagraph_skip_reason)) or (frame_start(frame) if frame else "")
        ids = groups.setdefault((first_line(m.cudagraph_skip_reason), loc), [])
        if m.compile_id not in ids:
            ids.append(m.compile_id)
    for (reason, loc), ids in groups.items():
        low = reason.lower()
        fix = next((text for words, text in FIXES if any(w in low for w in words)), DEFAULT_FIX)
        frame = by_id.get(ids[0]) or named.get(ids[0].split("/")[0])
        name = frame.co_name if frame is not None else ""
        message = (f"mode='reduce-overhead' asked for CUDA graphs, but inductor compiled graph {', '.join(ids)}"
                   f"{' of ' + first_line(name, 200) if name else ''} without them: \"{reason}\". Its kernels are "
                   f"launched one by one from the CPU, as without reduce-overhead (see the launch-bound finding "
                   f"for the GPU's idle time).")
        yield Finding(rule="cudagraph-skipped", severity="medium", op=first_line(name, 200),
                      source_location=loc, message=message, suggestion=fix, est_savings_us=None)
