"""recompile (compiled models, from the TORCH_TRACE log): a compiled function compiled again because a guard
on its inputs failed: a Python value it reads changed (an int argument, a module's int attribute), an
input's shape, dtype or device changed, or the global state (grad mode, autocast) differs. Each
recompilation costs a full compile; past torch._dynamo.config.recompile_limit (8 by default) compilations
of one function dynamo stops compiling it and runs it eager (uncompiled) for new inputs.

One finding per compiled frame with recompilations: how many, the guards that failed (dynamo's
recompile_reason: the guard expression and the user's line it came from), and whether the frame hit the
limit. Located at the guard's user line (its `User stack trace`), else where the function starts.

Saving: none in step time. The message gives the compile time the recompilations took (their frames'
compile times, backward graphs included), which is compile time, paid outside the profiled steps
(or inside them when a frame recompiles there). Severity: high when the frame hit the limit (it runs
eager from then on), medium from MANY recompilations, else low.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator

from opscope import units
from opscope.findings.base import Context, Finding, rule
from opscope.findings.compiled import frame_names, frame_start, frames_in_text, printable, user_location
from opscope.trace.torch_trace import CompileMetrics

MANY = 2
DEFAULT_LIMIT = 8
_GUARD_RE = re.compile(r"^\s*\d+/\d+:\s*(?P<guard>.*?)(?:\s{2,}#.*)?$")
_HINT_RE = re.compile(r"\(HINT: (?P<hint>[^)]*)\)")
LIMIT_MARKS = ("recompile limit exceeded", "recompile_limit")

ADVICE = {
    "shape": ("an input's shape changed: mark the dimension dynamic before the first call "
              "(torch._dynamo.mark_dynamic(x, dim)) or compile with dynamic=True, or pad / bucket inputs to a few "
              "fixed sizes."),
    "tensor": ("an input came with another dtype, device or requires_grad: every combination compiles its own "
               "graph; keep them the same from call to call."),
    "global": ("the global state differs between calls (grad mode, autocast, default dtype): call the compiled "
               "function under one setting, or compile one function per setting."),
    "module-int": ("an int attribute of an nn.Module changes between calls, and dynamo treats those as constants: "
                   "keep the changing value out of the module (pass it as a tensor) or set "
                   "torch._dynamo.config.allow_unspec_int_on_nn_module = True."),
    "value": ("a Python value the code reads changed (an int, float, bool, string or object): pass a changing "
              "number as a tensor, or let ints be dynamic (torch.compile(dynamic=True)); if it only ever takes a few "
              "values, mark it static and accept one graph per value (the recompiles stop once each is compiled)."),
}


def failed_guard(reason: str) -> str:
    """The failed guard of dynamo's recompile_reason (`0/0: n == 1   # source  # file:line in f`)."""
    line = reason.splitlines()[0] if reason else ""
    m = _GUARD_RE.match(line)
    return printable(m.group("guard") if m else line, 200)


def _kind(reason: str) -> str:
    low = reason.lower()
    if "size mismatch" in low or "stride mismatch" in low or ".size()" in low or ".stride()" in low:
        return "shape"
    if any(k in low for k in ("dtype mismatch", "device mismatch", "requires_grad mismatch", "dispatch key set")):
        return "tensor"
    if "global_state" in low or "grad_mode" in low or "global state" in low:
        return "global"
    if "integer attributes of the nn.module" in low:
        return "module-int"
    return "value"


def _hit_limit(m: CompileMetrics) -> bool:
    text = f"{m.fail_type} {m.fail_reason}".lower()
    return any(k in text for k in LIMIT_MARKS)


@rule("recompile")
def recompile(ctx: Context) -> Iterator[Finding]:
    log = ctx.compile_log
    if log is None:
        return
    frames: dict[str, list[CompileMetrics]] = defaultdict(list)
    for m in log.metrics:
        frames[m.frame_index].append(m)
    backward: dict[str, float] = defaultdict(float)
    for b in log.backward_metrics:
        backward[b.compile_id] += b.duration_s or 0.0
    named = frame_names(log.metrics)
    for frame, records in frames.items():
        again = [m for m in records if m.attempt > 0 and m.recompile_reason]
        if not again:
            continue
        hit = [m for m in again if _hit_limit(m)]
        compiled = [m for m in again if not m.fail_type]
        first = named.get(frame)
        limit = next((m.recompile_limit for m in records if m.recompile_limit is not None), None)
        seconds = sum((m.entire_frame_compile_time_s or m.duration_s or 0.0) + backward[m.compile_id] for m in compiled)
        guards: dict[str, str] = {}
        for m in again:
            guards.setdefault(failed_guard(m.recompile_reason), m.recompile_reason)
        kinds = list(dict.fromkeys(_kind(r) for r in guards.values()))
        loc = next((user_location(frames_in_text(r)) for r in guards.values() if user_location(frames_in_text(r))),
                   "") or (frame_start(first) if first is not None else "")
        name = printable(first.co_name, 200) if first is not None else f"frame {frame}"
        failed = "; ".join(f"`{g}`" for g in list(guards)[:3]) + (f" and {len(guards) - 3} more" if len(guards) > 3 else "")
        setting = "torch._dynamo.config.recompile_limit"
        limit_text = (f"{setting} (default {DEFAULT_LIMIT})" if limit is None else f"{setting} ({limit})"
                      if limit == DEFAULT_LIMIT else f"{setting} ({limit} here; default {DEFAULT_LIMIT})")
        times = sum(1 for m in records if not m.fail_type)
        message = (f"torch.compile compiled {name} {times} time{'s' if times != 1 else ''} "
                   f"({len(compiled)} recompilation{'s' if len(compiled) != 1 else ''}) because guards on its inputs "
                   f"failed: {failed}. The recompilations took {units.duration(seconds * 1e6)} of compile time "
                   f"(not step time).")
        if hit:
            message += (f" It hit {limit_text}: dynamo stopped compiling it, and calls with new inputs run eager "
                        f"(uncompiled) from then on.")
        else:
            message += (f" Past {limit_text} compilations of one function, dynamo stops compiling it and runs it "
                        f"eager.")
        torch_hints = list(dict.fromkeys(printable(h.group("hint"), 300) for r in guards.values()
                                         for h in _HINT_RE.finditer(r)))
        suggestion = " ".join(f"{k[0].upper()}{k[1:]}" for k in (ADVICE[kind] for kind in kinds))
        if torch_hints:
            suggestion += f" torch's hint: {' '.join(torch_hints)}"
        suggestion += " TORCH_LOGS=recompiles prints each recompilation's failed guard as it happens."
        severity = "high" if hit else "medium" if len(compiled) >= MANY else "low"
        yield Finding(rule="recompile", severity=severity, op=name, source_location=loc, message=message,
                      suggestion=suggestion, est_savings_us=None)
