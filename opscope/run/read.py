"""Reading a run directory back: every file checked for what the renderers rely on; anything damaged
or of the wrong shape is one OpscopeError naming the file and what is wrong."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path
from typing import Any

from opscope.errors import OpscopeError
from opscope.run import schema
from opscope.run.cells import as_written
from opscope.run.model import DEFAULT_REPORTS_DIR, RANKS_FILE, RUN_FILES, TIMELINE_FILE, WHATIF_FILE, Run
from opscope.table import NAN, Table


def find_latest_run(base: Path = DEFAULT_REPORTS_DIR) -> Path:
    try:
        runs = [p for p in base.glob("*") if p.is_dir() and not p.name.startswith(".") and (p / "summary.json").exists()]
        if not runs:
            raise OpscopeError(f"no runs under {base}/; run `opscope profile` or `opscope analyze` first")
        return max(runs, key=lambda p: (p / "summary.json").stat().st_mtime)
    except OSError as exc:
        raise OpscopeError(f"cannot read {base}/: {exc.strerror or exc}") from exc


def read_run(path: Path) -> Run:
    """Reads a run directory back, checking what the renderers rely on; anything damaged or of the wrong
    shape is one OpscopeError naming the file and what is wrong."""
    if not path.exists():
        raise OpscopeError(f"no such run directory: {path}")
    if not path.is_dir():
        raise OpscopeError(f"{path} is not a directory")
    missing = [f for f in RUN_FILES[:4] if not (path / f).is_file()]
    if missing:
        raise OpscopeError(f"{path} is not an opscope run directory (missing {', '.join(missing)})")
    meta = _read_json(path / "meta.json", dict)
    summary = _read_json(path / "summary.json", dict)
    findings = _read_json(path / "findings.json", list)
    ops = read_ops_csv(path / "ops.csv")
    modules = read_modules_csv(path / "modules.csv")
    ranks = read_ranks_csv(path / RANKS_FILE) if (path / RANKS_FILE).is_file() else None
    timeline = _read_json(path / TIMELINE_FILE, dict) if (path / TIMELINE_FILE).is_file() else None
    whatif = _read_json(path / WHATIF_FILE, dict) if (path / WHATIF_FILE).is_file() else None
    return Run(meta=meta, ops=ops, findings=findings, summary=summary, path=path, modules=modules, ranks=ranks,
               timeline=timeline, whatif=whatif)


def _read_json(path: Path, kind: type) -> Any:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise OpscopeError(f"{path} is damaged: {_reason(exc)}") from exc
    if not isinstance(value, kind):
        raise OpscopeError(f"{path} is damaged: expected a JSON {'object' if kind is dict else 'list'}, "
                           f"got {type(value).__name__}")
    try:
        schema.check(path.name, value)
    except schema.FormatError as exc:
        raise OpscopeError(f"{path} is damaged: {exc}") from None
    return value


def _reason(exc: BaseException) -> str:
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return text.splitlines()[0][:200]


def _damaged(path: Path, what: str) -> OpscopeError:
    return OpscopeError(f"{path} is damaged: {what}")


def _check(path: Path, ok: bool, what: str) -> None:
    if not ok:
        raise _damaged(path, what)


TEXT_COLUMNS = schema.names(schema.OPS_COLUMNS, "text")
# The columns the renderers read as numbers; anything else in them makes the file damaged.
NUMBER_COLUMNS = schema.names(schema.OPS_COLUMNS, "number")
REQUIRED_COLUMNS = schema.OPS_REQUIRED


def read_ops_csv(path: Path) -> Table:
    """ops.csv as a table: text columns as text ("" for none), the number columns as floats (NaN for
    none), any other column typed by its values as pandas would (ints, floats, true/false, else text).
    Anything damaged is one OpscopeError naming the file."""
    header, cells = _read_csv(path)
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    _check(path, not missing, f"missing column(s) {', '.join(missing)}")
    table = _typed(path, header, cells, TEXT_COLUMNS, NUMBER_COLUMNS)
    calls = table["calls"]
    _check(path, all(abs(c) < math.inf and c >= 0 for c in calls), "column 'calls' must hold counts")
    return table


# ranks.csv: text columns, and the columns the renderers read as numbers (opscope.run.schema, docs/reference/run-format.md).
RANKS_TEXT_COLUMNS = schema.names(schema.RANKS_COLUMNS, "text")
RANKS_NUMBER_COLUMNS = schema.names(schema.RANKS_COLUMNS, "number")


def read_ranks_csv(path: Path) -> Table:
    """ranks.csv of a merged run, checked like ops.csv: damaged is one OpscopeError naming the file."""
    header, cells = _read_csv(path)
    _check(path, "rank" in header, "missing column 'rank'")
    table = _typed(path, header, cells, RANKS_TEXT_COLUMNS, RANKS_NUMBER_COLUMNS, empty_is_missing=False)
    _check(path, not any(r != r for r in table["rank"]), "column 'rank' must hold rank numbers")
    return table


MODULE_TEXT_COLUMNS = schema.names(schema.MODULES_COLUMNS, "text")
MODULE_NUMBER_COLUMNS = schema.names(schema.MODULES_COLUMNS, "number")


def read_modules_csv(path: Path) -> Table | None:
    """modules.csv (analysis.modules.COLUMNS), or None when the run has none. It is derived from ops.csv
    and findings.json, so a damaged one is left out (the report shows everything else), not an error."""
    if not path.is_file():
        return None
    try:
        header, cells = _read_csv(path)
        if any(c not in header for c in MODULE_TEXT_COLUMNS + MODULE_NUMBER_COLUMNS):
            return None
        return _typed(path, header, cells, MODULE_TEXT_COLUMNS, MODULE_NUMBER_COLUMNS)
    except OpscopeError:
        return None


def _read_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    """(header, columns of cells) of a CSV file as opscope writes them (opscope.run.write.write_csv), the
    quote in front of a text cell taken off again (opscope.run.cells)."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            rows = [row for row in csv.reader(f) if row]  # blank lines are skipped, as pandas did
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise OpscopeError(f"{path} is damaged: {_reason(exc)}") from exc
    _check(path, bool(rows), "no columns to parse from file")
    header = rows[0]
    _check(path, len(set(header)) == len(header), "a column name appears twice")
    width = len(header)
    for line, row in enumerate(rows[1:], 2):  # a short row is a file cut short (or edited): not padded
        _check(path, len(row) == width, f"expected {width} fields in line {line}, saw {len(row)}")
    columns = [[as_written(row[i]) for row in rows[1:]] for i in range(width)]
    return header, columns


_INT = re.compile(r"[+-]?\d+")
_TRUE, _FALSE = ("True", "TRUE", "true"), ("False", "FALSE", "false")


def _typed(path: Path, header: list[str], columns: list[list[str]], texts: tuple[str, ...],
           numbers: tuple[str, ...], empty_is_missing: bool = True) -> Table:
    """The columns typed: `texts` as text, `numbers` as floats (a non-number makes the file damaged),
    the others by their values. An empty cell is a missing value (NaN) outside the text columns (with
    `empty_is_missing`) and in the number columns."""
    table: Table = {}
    for name, cells in zip(header, columns, strict=True):
        if name in texts:
            table[name] = cells
        elif name in numbers:
            table[name] = _numbers(path, name, cells)
        else:
            table[name] = _inferred(cells, empty_is_missing)
    return table


def _float(cell: str) -> float | None:
    if "_" in cell:
        return None
    try:
        return float(cell)
    except ValueError:
        return None


def _numbers(path: Path, name: str, cells: list[str]) -> list[float]:
    out: list[float] = []
    for row, cell in enumerate(cells, 1):
        value = NAN if cell == "" else _float(cell)
        if value is None:
            raise _damaged(path, f"column {name!r} holds non-numbers (row {row})")
        out.append(value)
    return out


def _inferred(cells: list[str], empty_is_missing: bool) -> list[Any]:
    """A column of no declared type, typed by its values as pandas' read_csv did: all whole numbers ->
    ints (floats when one is missing), all numbers -> floats, all true/false -> bools, else text."""
    missing = NAN if empty_is_missing else ""
    present = [c for c in cells if c != ""] if empty_is_missing else cells
    if not present:
        return [NAN] * len(cells)
    full = len(present) == len(cells)
    if all(_INT.fullmatch(c) for c in present):
        return [int(c) for c in cells] if full else [float(c) if c else NAN for c in cells]
    floats = [_float(c) for c in present]
    if all(f is not None for f in floats):
        return [_float(c) if c else NAN for c in cells]
    if all(c in _TRUE or c in _FALSE for c in present):
        return [c in _TRUE if c else NAN for c in cells]
    return [c if c else missing for c in cells]
