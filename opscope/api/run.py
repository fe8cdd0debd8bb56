"""The public Run: one profile or analysis as a Python object. Its tables are column tables (`Rows`), its
findings typed (`Finding`); it prints itself, writes its HTML report, and displays in Jupyter as that
report. It reads what the run directory holds (opscope.run) and renders through opscope.render: it never
imports torch or pandas (`to_pandas()` does, when asked)."""

from __future__ import annotations

import html
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, overload

from opscope.errors import OutputError
from opscope.run.model import Run as RunData
from opscope.table import Table, nrows, records, to_frame

if TYPE_CHECKING:
    import pandas as pd

# The height of the report in a notebook cell: the report scrolls inside it.
NOTEBOOK_HEIGHT_PX = 560


class Rows:
    """A column table (column name -> list of values, every list as long). Iterating gives one dict per
    row; `rows[i]` is row i as a dict, `rows["time_us"]` the column as a list; `to_pandas()` a DataFrame.
    Missing numbers are NaN, missing texts "" (as in the CSV files)."""

    __slots__ = ("_table",)

    def __init__(self, table: Table) -> None:
        self._table = table

    @property
    def columns(self) -> list[str]:
        return list(self._table)

    def __len__(self) -> int:
        return nrows(self._table)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        columns = list(self._table)
        for values in zip(*(self._table[c] for c in columns), strict=True):
            yield dict(zip(columns, values, strict=True))

    @overload
    def __getitem__(self, key: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, key: str) -> list[Any]: ...

    def __getitem__(self, key: int | str) -> dict[str, Any] | list[Any]:
        if isinstance(key, str):
            return list(self._table[key])
        n = len(self)
        i = key + n if key < 0 else key
        if not 0 <= i < n:
            raise IndexError(f"row {key} of a table of {n} rows")
        return {c: v[i] for c, v in self._table.items()}

    def __contains__(self, column: object) -> bool:
        return column in self._table

    def to_records(self) -> list[dict[str, Any]]:
        """Every row as a dict."""
        return records(self._table)

    def to_pandas(self) -> pd.DataFrame:
        """The table as a pandas DataFrame (imports pandas)."""
        return to_frame(self._table)

    def __repr__(self) -> str:
        shown = ", ".join(self.columns[:8]) + (", ..." if len(self._table) > 8 else "")
        return f"Rows({len(self)} rows; {shown})"


@dataclass(frozen=True)
class Finding:
    """One finding: the rule that fired, how serious, where (source line, module, op), what is wrong, what
    to do, and what fixing it saves (µs over all profiled steps, None when not estimated): `saving` the
    rule's own estimate, `critical_path_saving` what the step gains from this fix alone once overlaps are
    accounted (the what-if replay). `id` is stable across runs of the same code (opscope.whatif takes it)."""

    rule: str
    severity: str
    message: str
    suggestion: str
    op: str | None = None
    line: str | None = None
    module: str | None = None
    saving: float | None = None
    id: str = ""
    critical_path_saving: float | None = None

    @classmethod
    def from_dict(cls, entry: dict[str, Any]) -> Finding:
        """A finding from its findings.json entry."""
        return cls(rule=str(entry.get("rule", "")), severity=str(entry.get("severity", "")),
                   message=str(entry.get("message", "")), suggestion=str(entry.get("suggestion", "")),
                   op=entry.get("op"), line=entry.get("source_location"), module=entry.get("module"),
                   saving=_number(entry.get("est_savings_us")), id=str(entry.get("id") or ""),
                   critical_path_saving=_number(entry.get("critical_path_saving_us")))

    def to_dict(self) -> dict[str, Any]:
        """The finding as its findings.json entry."""
        return {"rule": self.rule, "severity": self.severity, "message": self.message,
                "suggestion": self.suggestion, "op": self.op, "source_location": self.line,
                "est_savings_us": self.saving, "module": self.module, "id": self.id,
                "critical_path_saving_us": self.critical_path_saving}


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


class Run:
    """One run: what `opscope profile` or `opscope analyze` wrote, as Python objects.

    - `summary`, `meta`: summary.json and meta.json as dicts;
    - `ops`, `modules`: ops.csv and modules.csv as `Rows` (modules None when the run has none);
    - `findings`: list of `Finding`, most important first;
    - `dir`: the run directory (None for a run not written);
    - `swap`: swap.json as a dict, for runs of `opscope.swap` (else None);
    - `warnings`: what the capture or analysis warned about (the CLI prints these on stderr);
    - `print(top=15)`, `html(path=None)`, `to_pandas(name)`; in Jupyter the run shows as its HTML report.
    """

    @classmethod
    def written(cls, data: RunData, warnings: Sequence[str] = ()) -> Run:
        """The run `data` as its directory holds it (read back, so that a Run made now and one loaded later
        hold the same values, typed as the files type them); `data` itself when it was not written."""
        if data.path is None:
            return cls(data, warnings)
        from opscope.run.read import read_run

        return cls(read_run(data.path), warnings, analyzed=data)

    def __init__(self, data: RunData, warnings: Sequence[str] = (), *, analyzed: RunData | None = None) -> None:
        self.internal = data  # the table-dict Run the renderers read
        # the analysis' own run, when this one was just made: with the events and kernels tables, which no
        # file holds
        self.analyzed = analyzed or data
        self.warnings = list(warnings)
        self._swap: dict[str, Any] | None = None
        self._swap_read = False

    @property
    def summary(self) -> dict[str, Any]:
        return self.internal.summary

    @property
    def meta(self) -> dict[str, Any]:
        return self.internal.meta

    @property
    def ops(self) -> Rows:
        return Rows(self.internal.ops)

    @property
    def modules(self) -> Rows | None:
        return None if self.internal.modules is None else Rows(self.internal.modules)

    @property
    def findings(self) -> list[Finding]:
        return [Finding.from_dict(f) for f in self.internal.findings]

    @property
    def dir(self) -> Path | None:
        return self.internal.path

    @property
    def swap(self) -> dict[str, Any] | None:
        if not self._swap_read:
            self._swap_read = True
            if self.dir is not None and (self.dir / "swap.json").is_file():
                from opscope.run.swap_results import read_swap

                self._swap = read_swap(self.dir / "swap.json")
        return self._swap

    @property
    def step_time_us(self) -> float | None:
        """Wall time per step (µs), None when the run has none."""
        value = self.summary.get("step_time_us")
        return float(value) if isinstance(value, (int, float)) else None

    def to_pandas(self, name: str = "ops") -> pd.DataFrame:
        """The table `name` (ops, modules, ranks; for a run just made also events and kernels, the trace's
        events and GPU kernels) as a pandas DataFrame (imports pandas). KeyError for a table the run does
        not have."""
        if name in ("events", "kernels"):
            return self.analyzed.to_pandas(name)
        return self.internal.to_pandas(name)

    def print(self, top: int = 15, *, findings: int = 10, file: IO[str] | None = None, width: int | None = None) -> None:
        """Prints the report (as `opscope report` does): summary, the `top` op rows, breakdowns, findings.
        On `file` (default stdout; in Jupyter, rich renders it in the cell)."""
        from rich.console import Console

        from opscope.render.console_report import render_report

        console = Console(file=file, width=width, highlight=False)
        render_report(self.internal, console, top=top, findings=findings)

    def html(self, path: str | Path | None = None, *, force: bool = False) -> Path:
        """Writes the self-contained HTML report and returns its path: report.html in the run directory
        (replaced when there), or `path`, a new file (an existing regular file only with `force`)."""
        from opscope.render.html import default_html_path, write_html

        if path is None:
            if self.dir is None:
                raise OutputError("this run has no directory: give html() a path to write the report to")
            out = default_html_path(self.dir)
            return write_html(self.internal, out, replace=out.is_file())
        out = Path(path)
        return write_html(self.internal, out, replace=force)

    def html_text(self) -> str:
        """The self-contained HTML report as text."""
        from opscope.render.html import render_html

        return render_html(self.internal)

    def _repr_html_(self) -> str:
        """Jupyter's view: the self-contained report in a sandboxed frame of fixed height (its scripts run
        in the frame only; nothing of the notebook's page is reachable from them, nor the reverse)."""
        document = self.html_text()
        return (f'<iframe sandbox="allow-scripts" srcdoc="{html.escape(document, quote=True)}" '
                f'style="width:100%;height:{NOTEBOOK_HEIGHT_PX}px;border:1px solid #ccc" '
                f'title="opscope report"></iframe>')

    def __repr__(self) -> str:
        step = self.step_time_us
        shown = f"{step / 1e3:.3g} ms/step" if step is not None else "no step time"
        where = f", dir={str(self.dir)!r}" if self.dir is not None else ""
        return (f"<opscope.Run {self.meta.get('target') or '?'}: {shown}, {len(self.ops)} op rows, "
                f"{len(self.internal.findings)} findings{where}>")
