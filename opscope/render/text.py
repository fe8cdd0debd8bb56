"""Text that came from outside opscope (a trace, a file name, an argument, the user's code) is shown as
text, never interpreted: no rich markup, no terminal control sequences. Every renderer (console now,
HTML later) passes such strings through `clean` (or a run through `cleaned_run`) before showing them."""

from __future__ import annotations

import dataclasses
import html
import re
from typing import Any

from opscope.limits import DISPLAY_TEXT_CHARS, bounded
from opscope.run.model import Run
from opscope.table import Table

# C0 controls (ESC, BEL, backspace, CR, ...), DEL and C1 controls (CSI, OSC, ... as single code
# points), plus the Unicode bidi overrides that reorder what a terminal shows.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_LINE_BREAKS = re.compile("[\t\n]")
HOVER_TEXT_MAX = 160  # characters of one shape/stride/path line in a plot's hover label


def clean(text: Any, *, keep_newlines: bool = False, limit: int | None = DISPLAY_TEXT_CHARS) -> str:
    """`text` as a printable string of at most `limit` characters (opscope.limits.bounded; None: no
    limit): control characters become U+FFFD, tabs and newlines spaces (kept with keep_newlines)."""
    s = "" if text is None else str(text)
    if limit is not None and len(s) > limit:
        s = bounded(s, limit)
    s = _CONTROL.sub("\ufffd", s)
    return s if keep_newlines else _LINE_BREAKS.sub(" ", s)


def plot_text(value: Any, limit: int = HOVER_TEXT_MAX) -> str:
    """A label for plotly, which renders <b>, <br>, <a href> ... in its text: escaped, so it shows as is."""
    s = clean(value)
    if len(s) > limit:
        s = s[: limit - 1] + "…"
    return html.escape(s, quote=True)


def _deep(value: Any, key: Any = None) -> Any:
    if isinstance(value, str):
        return clean(value, keep_newlines=True, limit=None if key in _JSON_COLUMNS else DISPLAY_TEXT_CHARS)
    if isinstance(value, dict):
        return {clean(k) if isinstance(k, str) else k: _deep(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep(v) for v in value]
    return value


def cleaned_run(run: Run) -> Run:
    """A copy of `run` whose strings (meta, summary, findings, the text cells of the ops and modules
    tables) are clean."""
    modules = run.modules
    return dataclasses.replace(run, meta=_deep(run.meta), summary=_deep(run.summary), findings=_deep(run.findings),
                         ops=_clean_table(run.ops), modules=None if modules is None else _clean_table(modules))


# ops.csv columns of JSON text, parsed again for display (shapes): cut, they would parse no more. The
# trace reader keeps none over opscope.limits.MAX_TEXT_CHARS.
_JSON_COLUMNS = frozenset({"input_dims", "input_dtypes", "input_strides", "concrete_inputs"})


def _clean_table(table: Table) -> Table:
    return {col: [clean(v, limit=None if col in _JSON_COLUMNS else DISPLAY_TEXT_CHARS) if isinstance(v, str) else v
                  for v in values]
            for col, values in table.items()}
