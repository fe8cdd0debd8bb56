"""Text cells of the CSV files opscope writes, safe to open in a spreadsheet, read back exactly.

A cell that starts with `=`, `+`, `-`, `@`, a tab or a carriage return is taken as a formula by
spreadsheets (CSV injection: a kernel or op name from a trace could run as one). As OWASP advises, such a
text cell is written with a single quote in front, which a spreadsheet shows as text. So that opscope
reads its own files back unchanged, a text cell that itself starts with a quote gets one more in front,
and reading removes exactly one leading quote from every cell that has one. Numbers are written as
numbers (`-1.5` is not a formula) and are never prefixed.
"""

from __future__ import annotations

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
QUOTE = "'"
_ESCAPED_STARTS = (*FORMULA_STARTS, QUOTE)


def spreadsheet_safe(text: str) -> str:
    """A text cell as written: a quote in front of one a spreadsheet would run as a formula, or that
    starts with a quote itself."""
    return QUOTE + text if text.startswith(_ESCAPED_STARTS) else text


def as_written(cell: str) -> str:
    """A cell as read back: the inverse of spreadsheet_safe (one leading quote removed)."""
    return cell[1:] if cell.startswith(QUOTE) else cell
