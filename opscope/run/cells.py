"""Text cells of the CSV files opscope writes, safe to open in a spreadsheet, read back exactly.

A cell that starts with `=`, `+`, `-`, `@`, a tab or a carriage return is taken as a formula by
spreadsheets (CSV injection: a kernel or op name from a trace could run as one). As OWASP advises, such a
text cell is written with a single quote in front, which a spreadsheet shows as text. So that opscope
reads its own files back unchanged, the same holds for a cell of quotes followed by such a start (`'=x` is
written `''=x`), and reading removes one leading quote from exactly those cells. Any other cell is
written and read as it is: `'x` stays `'x`, also in runs written before this rule. Numbers are written
as numbers (`-1.5` is not a formula) and are never prefixed.
"""

from __future__ import annotations

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
QUOTE = "'"


def _escaped(text: str) -> bool:
    """Whether a text, past its leading quotes, starts like a formula."""
    return text.lstrip(QUOTE).startswith(FORMULA_STARTS)


def spreadsheet_safe(text: str) -> str:
    """A text cell as written: a quote in front of one a spreadsheet would run as a formula (also behind
    leading quotes, so that reading is exact)."""
    return QUOTE + text if _escaped(text) else text


def as_written(cell: str) -> str:
    """A cell as read back: the inverse of spreadsheet_safe (one leading quote removed where it added one)."""
    return cell[1:] if cell.startswith(QUOTE) and _escaped(cell) else cell
