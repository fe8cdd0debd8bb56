"""The Run: what a run directory holds (meta.json, ops.csv, findings.json, summary.json, modules.csv,
ranks.csv, trace.json.gz), and in memory the events and kernels it came from; where runs go, and how
their paths are shown."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opscope.table import Table, nrows, to_frame

if TYPE_CHECKING:
    import pandas as pd

RUN_FILES = ("meta.json", "ops.csv", "findings.json", "summary.json", "trace.json.gz")
WHATIF_FILE = "whatif.json"  # the replayed step's critical paths (opscope.analysis.whatif)
RANKS_FILE = "ranks.csv"  # merged runs of multi-process jobs only (opscope.analysis.ranks)
TORCH_TRACE_FILE = "torch_trace.log.gz"  # torch.compile's structured log (TORCH_TRACE), profiles that compiled only
TIMELINE_FILE = "timeline.json"  # the step timeline of the HTML report (opscope.analysis.timeline)
WHATIF_FILE = "whatif.json"  # the what-if replay of the step (issue 27): its critical path is drawn on the timeline
DEFAULT_REPORTS_DIR = Path("reports")
STAGING_PREFIX = ".opscope-run-"  # + pid + "-": a run being written, renamed into place when complete
# The working directory when opscope started: a model's code may change it, and paths are shown
# relative to where the user ran the command.
_START_CWD = Path.cwd()


def shown_path(path: Path) -> str:
    """`path` as the user should see it: normalised (no `work/../`), relative to the starting directory
    when inside it."""
    path = Path(os.path.normpath(path))
    if not path.is_absolute():
        return str(path)
    try:
        return str(path.relative_to(_START_CWD))
    except ValueError:
        return str(path)


@dataclass(repr=False, eq=False)
class Run:
    """One run: what the run directory holds, and in memory the events and kernels it came from. Every
    table is an opscope.table Table (column name -> list); `to_pandas(name)` gives one as a DataFrame."""

    meta: dict[str, Any]
    ops: Table
    findings: list[dict[str, Any]]
    summary: dict[str, Any]
    path: Path | None = None
    events: Table | None = None  # in-memory only; not written
    modules: Table | None = None  # modules.csv (analysis.modules); None when the run has no modules
    # A run merged from the ranks of a multi-process job (opscope.analysis.ranks): ranks.csv, one row per
    # rank; None for a one-process run.
    ranks: Table | None = None
    # in-memory only: the trace's kernels/memcpy/memset with the event that launched each ("op")
    kernels: Table | None = None
    # timeline.json (opscope.analysis.timeline): lanes of segments, bounded in size; None when the run has none
    timeline: dict[str, Any] | None = None
    # whatif.json (opscope.analysis.whatif): the critical path of the step replayed unchanged
    # ("critical_path", segments {lane, ts, dur, name} on the timeline's clock, which the report draws) and
    # with every finding's fix ("critical_path_fixed"); None when the run has none
    whatif: dict[str, Any] | None = None

    def to_pandas(self, name: str = "ops") -> pd.DataFrame:
        """The table `name` (ops, modules, ranks, events, kernels) as a pandas DataFrame (imports pandas).
        A KeyError for a table the run does not have."""
        if name not in TABLES:
            raise KeyError(name)
        table = getattr(self, name)
        if table is None:
            raise KeyError(f"this run has no {name} table")
        return to_frame(table)

    def __repr__(self) -> str:
        sizes = ", ".join(f"{name}=<{nrows(getattr(self, name))} rows>" for name in TABLES
                          if getattr(self, name) is not None)
        return f"Run(path={self.path!r}, {sizes}, findings={len(self.findings)})"


TABLES = ("ops", "modules", "ranks", "events", "kernels")


