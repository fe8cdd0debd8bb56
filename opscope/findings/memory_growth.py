"""memory-growth: allocated memory rises step over step because something allocated every step is never
freed (a tensor appended to a Python list, a cache keyed by step, a loss kept with its autograd graph).

Evidence, from the memory events (profile's untimed memory pass, or a trace recorded with
profile_memory) over at least MIN_STEPS steps: the allocated memory at the end of each step rises by at
least MIN_GROWTH_BYTES per step (median over consecutive steps), and the same op row (op, line, module)
made allocations in each step but the last that were still alive when the recording ended (what the
last step allocated may still be freed by the next one; the first step may fill a cache once, so it is
not required when there are more than MIN_STEPS steps). The finding names the row leaving the most
bytes per step.
"""

from __future__ import annotations

from collections.abc import Iterator

from opscope import units
from opscope.findings.base import Context, Finding, rule
from opscope.findings.common import short

_Row = tuple[str, str | None, str | None]  # a retained allocation's op row: (op, source line, module)

MIN_STEPS = 3
MIN_GROWTH_BYTES = 1024
HIGH_SHARE_OF_PEAK = 0.01  # growth per step >= 1 % of the peak: high (it doubles the peak in 100 steps)

SUGGESTION = ("Something keeps a reference to a tensor made every step: a list or dict that grows (store "
              "`t.item()` or `t.detach().cpu()` of what you log, or keep only the last N), a tensor kept with "
              "its autograd graph (a loss summed across steps without `.item()` / `.detach()`), or a cache "
              "that is never cleared. Free it, or bound it.")


@rule("memory-growth")
def memory_growth(ctx: Context) -> Iterator[Finding]:
    memory = ctx.memory
    if memory is None or memory.steps < MIN_STEPS:
        return
    per_step = memory.summary.get("per_step", [])
    steps = [p["step"] for p in per_step]
    ends = [p["end_allocated_bytes"] for p in per_step]
    growth = memory.summary.get("growth_bytes_per_step")
    if growth is None or growth < MIN_GROWTH_BYTES:
        return
    required = set(steps[1:-1]) if len(steps) > MIN_STEPS else set(steps[:-1])
    leaks: dict[_Row, dict[int, float]] = {}  # (op, line, module) -> step -> bytes left allocated
    counts: dict[_Row, dict[int, int]] = {}
    for r in memory.retained:
        if r["op"] is None or r["step"] == steps[-1]:
            continue
        key = (r["op"], r["source_location"], r["module"])
        leaks.setdefault(key, {})[r["step"]] = r["bytes"]
        counts.setdefault(key, {})[r["step"]] = r["tensors"]
    kept = {k: v for k, v in leaks.items() if required <= set(v) and len(v) >= 2}
    if not kept:
        return
    ranked = sorted(kept.items(), key=lambda kv: -sum(kv[1].values()) / len(kv[1]))
    (op, where, module), by_step = ranked[0]
    per_step_bytes = sum(by_step.values()) / len(by_step)
    tensors = sum(counts[ranked[0][0]].values()) / len(by_step)
    others = "; ".join(f"{units.nbytes(sum(v.values()) / len(v))} per step from {short(k[0])} at {k[1] or 'an unknown line'}"
                       for k, v in ranked[1:4])
    peak = memory.summary.get("peak_allocated_bytes") or 0.0
    in_module = f" (module {module})" if module else (" (the model's own forward)" if module == "" else "")
    message = (f"allocated memory grows by {units.nbytes(growth)} per step: at the end of steps {steps[0]}-{steps[-1]} "
               f"of the {memory.summary.get('source', 'recording')} it was "
               f"{', '.join(units.nbytes(e) for e in ends)}. {short(op)} at {where or 'an unknown line'}{in_module} "
               f"allocates {units.nbytes(per_step_bytes)} per step ({tensors:g} tensor{'' if tensors == 1 else 's'}) "
               "that is never freed"
               + (f"; also {others}" if others else "") + ". Memory grows until the process runs out of it.")
    yield Finding(rule="memory-growth", severity="high" if peak and growth >= HIGH_SHARE_OF_PEAK * peak else "medium",
                  op=op, source_location=where or "", message=message, suggestion=SUGGESTION, est_savings_us=None)
