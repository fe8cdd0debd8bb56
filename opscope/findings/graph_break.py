"""graph-break (compiled models, from the TORCH_TRACE log): dynamo stopped tracing a compiled function at a
line it cannot put in a graph (a `.item()` feeding Python control flow, an unsupported call, print, ...).
The code before that line runs as one graph, the line itself in Python, and the rest as another graph
(a resume function, `torch_dynamo_resume_in_<fn>_at_<line>`): every break returns to Python between
graphs, stops fusion across it, and splits what CUDA graphs would capture.

A break is a frame compilation with a graph-break restart reason (dynamo's compile metrics) or a
`dynamo_graph_break_reason` record; restarts dynamo makes for itself (an exception type as the reason)
are not breaks. Located at the user's line: the record's `Graph break in user code at path:line` or its
traceback's innermost user frame, else the line in the resume function's name, else a `File ..., line N`
in the reason, else the start of the compiled function. One finding per (line, reason); the reason is
its first line, bounded, and the fix torch's own hints plus the usual remedies.

Saving: none estimated (what a whole graph would gain is not in the log); severity medium.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from opscope.findings.base import Context, Finding, rule
from opscope.findings.compiled import (
    first_line,
    frame_names,
    frame_start,
    frames_in_text,
    hints,
    printable,
    user_location,
)
from opscope.sources import frame_location
from opscope.trace.torch_trace import CompileMetrics, GraphBreak, TorchTraceLog

RESUME_PREFIX = "torch_dynamo_resume_in_"
_RESUME_RE = re.compile(r"^torch_dynamo_resume_in_(?P<fn>.+)_at_(?P<line>\d+)$")
# restart reasons that are dynamo's own restarts, not breaks: `str(type(exception))`
_NOT_A_BREAK = ("<class ",)
# the lines of dynamo's explanation that only say where the tracer was
_PREAMBLE = ("Encountered graph break when attempting to trace",)

SUGGESTION = ("Keep the compiled code free of what dynamo cannot trace: no `.item()` / `.tolist()` / `if tensor:` "
              "feeding Python control flow (use torch.where or masks, or torch.cond for a data-dependent "
              "branch), no print or logging of tensors, no unsupported calls.")
ITEM_SUGGESTION = ("`.item()` returns a Python number, so dynamo leaves the graph for it: keep it in the graph with "
                   "torch._dynamo.config.capture_scalar_outputs = True, and express a data-dependent branch with "
                   "torch.where or torch.cond instead of a Python `if`.")
FULLGRAPH = " Compile with fullgraph=True to make every break an error at its line, and remove them one by one."


@dataclass
class _Break:
    compile_ids: list[str] = field(default_factory=list)
    function: str = ""
    hints: list[str] = field(default_factory=list)


def _is_break(reason: str) -> bool:
    return bool(reason.strip()) and not reason.lstrip().startswith(_NOT_A_BREAK)


def _headline(text: str) -> str:
    """The reason's first line that says what broke (not where the tracer was)."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.strip().startswith(_PREAMBLE)]
    return first_line(lines[0]) if lines else first_line(text)


def _resume_line(m: CompileMetrics, metrics: list[CompileMetrics]) -> str:
    """The line in the name of the resume function dynamo made of `m`'s frame after its break."""
    for other in metrics:
        match = _RESUME_RE.match(other.co_name)
        if match and match.group("fn") == m.co_name and other.co_filename == m.co_filename:
            return frame_location(m.co_filename, int(match.group("line"))) or ""
    return ""


def _location(record: GraphBreak | None, m: CompileMetrics | None, reason: str,
              metrics: list[CompileMetrics]) -> str:
    if record is not None:
        loc = user_location(record.stack)
        if not loc and record.frame is not None:
            loc = frame_location(record.frame.path, record.frame.line) or ""
        if loc:
            return loc
    if m is not None:
        loc = _resume_line(m, metrics)
        if loc:
            return loc
    loc = user_location(frames_in_text(reason))
    if loc:
        return loc
    return frame_start(m) if m is not None else ""


def broken_frames(log: TorchTraceLog) -> list[str]:
    """Compile ids of the frame compilations that broke the graph, in log order."""
    broken = [m.compile_id for m in log.metrics if any(_is_break(r) for r in m.restart_reasons)]
    return broken + [r.compile_id for r in log.graph_breaks if r.compile_id not in broken]


@rule("graph-break")
def graph_break(ctx: Context) -> Iterator[Finding]:
    log = ctx.compile_log
    if log is None:
        return
    metrics = log.metrics
    by_id = {m.compile_id: m for m in metrics}
    named = frame_names(metrics)
    records = {r.compile_id: r for r in log.graph_breaks}
    ids = list(dict.fromkeys(broken_frames(log)))
    groups: dict[tuple[str, str], _Break] = {}
    for cid in ids:
        m = by_id.get(cid) or named.get(cid.split("/")[0])
        record = records.get(cid)
        reason = next((r for r in (m.restart_reasons if m is not None else ()) if _is_break(r)), "")
        if not reason and record is not None:
            reason = record.reason
        loc = _location(record, m, reason, metrics)
        g = groups.setdefault((loc, _headline(reason)), _Break())
        g.compile_ids.append(cid)
        g.function = g.function or (m.co_name if m is not None else "")
        g.hints = g.hints or hints(reason)
    total = len(ids)
    for (loc, headline), g in groups.items():
        where = f"{printable(g.function)} ({', '.join(g.compile_ids)})" if g.function else ", ".join(g.compile_ids)
        message = (f"torch.compile broke the graph of {where} at this line ({len(g.compile_ids)} of the run's "
                   f"{total} graph break{'s' if total != 1 else ''}): {headline or 'no reason recorded'}. The code "
                   f"before it runs as one graph, this line in Python, the rest as another graph: each break returns "
                   f"to Python between graphs and stops fusion (and CUDA-graph capture) across it.")
        if g.hints:
            suggestion = f"torch's hint: {' '.join(g.hints)} {SUGGESTION}"
        else:
            suggestion = ITEM_SUGGESTION if "item()" in headline else SUGGESTION
        suggestion += FULLGRAPH
        yield Finding(rule="graph-break", severity="medium", op=printable(g.function, 200), source_location=loc,
                      message=message, suggestion=suggestion, est_savings_us=None)
