"""The Run: what a run directory holds (meta.json, ops.csv, findings.json, summary.json, modules.csv,
ranks.csv, trace.json.gz), and in memory the events and kernels it came from; where runs go, and how
their paths are shown."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opscope.table import Table, as_table, nrows, to_frame

if TYPE_CHECKING:
    import pandas as pd

FORMAT_VERSION = 1
RUN_FILES = ("meta.json", "ops.csv", "findings.json", "summary.json", "trace.json.gz")
RANKS_FILE = "ranks.csv"  # merged runs of multi-process jobs only (opscope.analysis.ranks)
DEFAULT_REPORTS_DIR = Path("reports")
STAGING_PREFIX = ".opscope-run-"  # + pid + "-": a run being written, renamed into place when complete
# The working directory when opscope started: a model's code may change it, and paths are shown
# relative to where the user ran the command.
_START_CWD = Path.cwd()


def shown_path(path: Path) -> str:
    """`path` as the user should see it: relative to the starting directory when inside it."""
    path = Path(path)
    if not path.is_absolute():
        return str(path)
    try:
        return str(path.relative_to(_START_CWD))
    except ValueError:
        return str(path)


class _Tabular:
    """A table of a Run (ops, modules, ranks, events, kernels), held as given: an opscope.table Table, a
    pandas DataFrame or None. Reading the attribute gives a DataFrame, built from the Table on first
    access and kept: from then on the DataFrame is the run's table (callers edit run.ops in place, e.g.
    Nsight's measured columns). `<name>_table` (Run.table) gives a Table without importing pandas while
    no DataFrame was built."""

    def __init__(self, *, required: bool = False) -> None:
        self.required = required

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        self.slot = f"_{name}"

    def __get__(self, run: Run | None, owner: type | None = None) -> Any:
        if run is None:  # the dataclass asks for the field's default
            if self.required:
                raise AttributeError(self.name)
            return None
        held = run.__dict__.get(self.slot)
        if isinstance(held, dict):
            held = run.__dict__[self.slot] = to_frame(held)
        return held

    def __set__(self, run: Run, value: Any) -> None:
        run.__dict__[self.slot] = value


@dataclass(repr=False, eq=False)
class Run:
    """One run: what the run directory holds (and, in memory, the events and kernels it came from).
    ops, modules, ranks, events and kernels may be given as Tables (the analysis) or DataFrames (a run
    read back); run.ops etc. are DataFrames (_Tabular), run.ops_table etc. Tables."""

    meta: dict[str, Any]
    ops: pd.DataFrame = _Tabular(required=True)
    findings: list[dict[str, Any]]
    summary: dict[str, Any]
    path: Path | None = None
    events: pd.DataFrame | None = _Tabular()  # in-memory only; not written
    modules: pd.DataFrame | None = _Tabular()  # modules.csv (analysis.modules); None when the run has no modules
    # A run merged from the ranks of a multi-process job (opscope.analysis.ranks): ranks.csv, one row per
    # rank; None for a one-process run.
    ranks: pd.DataFrame | None = _Tabular()
    # in-memory only: the trace's kernels/memcpy/memset with the event that launched each ("op")
    kernels: pd.DataFrame | None = _Tabular()

    def table(self, name: str) -> Table | None:
        """The table `name` (ops, modules, ranks, events, kernels) as a Table: the one given, or the
        DataFrame's current content once one was built (opscope.table.from_frame). None when absent."""
        held = self.held(name)
        return None if held is None else as_table(held)

    def held(self, name: str) -> Table | pd.DataFrame | None:
        """The table `name` as held now (a Table or a DataFrame), converting nothing."""
        if name not in TABLES:
            raise KeyError(name)
        return self.__dict__.get(f"_{name}")

    @property
    def ops_table(self) -> Table:
        return self.table("ops")

    @property
    def modules_table(self) -> Table | None:
        return self.table("modules")

    @property
    def ranks_table(self) -> Table | None:
        return self.table("ranks")

    @property
    def events_table(self) -> Table | None:
        return self.table("events")

    @property
    def kernels_table(self) -> Table | None:
        return self.table("kernels")

    def copy_with(self, **changes: Any) -> Run:
        """A shallow copy with `changes` (as dataclasses.replace, but the tables are passed as held: no
        DataFrame is built for them)."""
        fields = {"meta": self.meta, "findings": self.findings, "summary": self.summary, "path": self.path,
                  **{name: self.held(name) for name in TABLES}}
        return Run(**{**fields, **changes})

    def __repr__(self) -> str:
        sizes = ", ".join(f"{name}={_rows(self.held(name))}" for name in TABLES if self.held(name) is not None)
        return f"Run(path={self.path!r}, {sizes}, findings={len(self.findings)})"


TABLES = ("ops", "modules", "ranks", "events", "kernels")


def _rows(held: Table | pd.DataFrame) -> str:
    return f"<{nrows(held) if isinstance(held, dict) else len(held)} rows>"


