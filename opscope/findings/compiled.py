"""What the rules about compiled models share: reading the TORCH_TRACE log's text (reasons torch wrote)
into bounded, printable message parts, placing them at the user's line, and telling whether a run, or
one of its events, already runs compiled (the rules that would otherwise suggest torch.compile ask).
No rule lives here."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from opscope.findings.base import Context, cached
from opscope.findings.tree import col
from opscope.limits import bounded
from opscope.sources import frame_location
from opscope.trace.torch_trace import CompileMetrics, Frame

# The most of one reason torch wrote (a graph-break explanation, a guard) a message quotes.
MAX_QUOTE_CHARS = 300

# C0 and C1 controls, DEL and the bidi overrides: a reason from a log is shown as text, never interpreted.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_SPACES = re.compile(r"\s+")
_FILE_LINE = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+)(?:, in (?P<func>\S+))?')


def printable(text: str, limit: int = MAX_QUOTE_CHARS) -> str:
    """`text` on one line: line breaks and tabs as spaces, runs of spaces as one, control characters as
    U+FFFD, at most `limit` characters (opscope.limits.bounded)."""
    one = _SPACES.sub(" ", _CONTROL.sub("\ufffd", text.replace("\t", " "))).strip()
    return bounded(one, limit)


def first_line(text: str, limit: int = MAX_QUOTE_CHARS) -> str:
    """The first non-blank line of `text`, printable."""
    for line in text.splitlines():
        if line.strip():
            return printable(line, limit)
    return ""


def hints(text: str, limit: int = MAX_QUOTE_CHARS) -> list[str]:
    """The `Hint: ...` lines torch puts in its explanations, printable, without the label."""
    return [printable(line.strip()[len("Hint:"):], limit) for line in text.splitlines()
            if line.strip().startswith("Hint:")]


def user_location(frames: Iterable[Frame]) -> str:
    """'path:line' of the innermost of `frames` (outermost first) that is the user's code (or opscope's
    harness, which run_rules leaves out); '' when none is."""
    for f in reversed(list(frames)):
        loc = frame_location(f.path, f.line)
        if loc is not None:
            return loc
    return ""


def frames_in_text(text: str) -> tuple[Frame, ...]:
    """The `File "path", line N, in f` frames of a traceback quoted in a reason, in order."""
    return tuple(Frame(m.group("path"), int(m.group("line")), m.group("func") or "")
                 for m in _FILE_LINE.finditer(text))


def frame_start(m: CompileMetrics) -> str:
    """'path:line' where the compiled frame's function starts, if it is the user's code."""
    if not m.co_filename or m.co_firstlineno <= 0:
        return ""
    return frame_location(m.co_filename, m.co_firstlineno) or ""


def frame_names(metrics: Sequence[CompileMetrics]) -> dict[str, CompileMetrics]:
    """Frame id -> the first record of it that names its code (a failed attempt's record names none)."""
    out: dict[str, CompileMetrics] = {}
    for m in metrics:
        if m.co_name and m.frame_index not in out:
            out[m.frame_index] = m
    return out


def _text(v: object) -> str:
    return v if isinstance(v, str) else ""


def compiled_run(ctx: Context) -> bool:
    """Whether the run already runs torch.compile'd code: it has a compile log, its meta says it
    compiled, or ops ran inside a compiled graph (ops.csv `compiled_graph`)."""
    def build() -> bool:
        if ctx.compile_log is not None or ctx.meta.get("compile"):
            return True
        return any(_text(g) for g in ctx.ops.get("compiled_graph", []))
    return cached(ctx, "compiled_run", build)


def in_compiled_graph(ctx: Context, events: Iterable[int]) -> bool:
    """Whether all of `events` ran inside a compiled graph (the event table's `compiled_graph`)."""
    if "compiled_graph" not in ctx.events:
        return False
    graph = col(ctx, "compiled_graph")
    evs = list(events)
    return bool(evs) and all(_text(graph[i]) for i in evs)


# What the rules that suggest torch.compile say instead on a compiled run, for code that ran outside the
# compiled graphs and for code inside them.
OUTSIDE_COMPILED = ("The model already runs compiled, but these ops ran outside its compiled graphs (eager): "
                    "bring the code that issues them into the compiled function, or remove what leaves them out "
                    "(see the graph-break findings).")
INSIDE_COMPILED = ("These ops ran inside a compiled graph, unfused: inductor called them as ATen ops (see the "
                   "compile-fallback findings for ops it has no lowering for).")
