"""whatif: the step replayed with fixes applied (`opscope whatif`): the run's trace read again, its
dependency graph replayed with the findings' fixes, op speedups and launch gaps removed
(opscope.analysis.whatif). A script can call it as `opscope.api.whatif(run_dir, op_speedups=[...])`."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opscope import units
from opscope.api.explain import table_run
from opscope.api.run import Run
from opscope.errors import OpscopeError
from opscope.run.model import TORCH_TRACE_FILE
from opscope.run.model import Run as TableRun


@dataclass
class WhatIf:
    """What the fixes do to the step. Times in µs per step; `applied` in the recommended order (the
    largest saving on top of those before it first), each {"fix", "saving_us_per_step", "saving_us" (over
    all profiled steps), "predicted_step_time_us"}; `critical_path` the replayed step's, as whatif.json's
    segments."""

    recorded_step_time_us: float
    replayed_step_time_us: float
    predicted_step_time_us: float
    steps: int
    applied: list[dict[str, Any]] = field(default_factory=list)
    critical_path: list[dict[str, Any]] = field(default_factory=list)

    def __repr__(self) -> str:
        # a line, not the critical path's hundreds of segments (they stay in .critical_path)
        fixes = ", ".join(str(a["fix"]) for a in self.applied[:3]) + (
            f", +{len(self.applied) - 3} more" if len(self.applied) > 3 else "")
        return (f"<opscope.WhatIf step {units.duration(self.recorded_step_time_us)} recorded, "
                f"{units.duration(self.predicted_step_time_us)} predicted with {len(self.applied)} "
                f"fix{'es' if len(self.applied) != 1 else ''}{f' ({fixes})' if fixes else ''}; "
                f"critical path {len(self.critical_path)} segments>")

    def to_json(self) -> dict[str, Any]:
        return {"recorded_step_time_us": self.recorded_step_time_us,
                "replayed_step_time_us": self.replayed_step_time_us,
                "predicted_step_time_us": self.predicted_step_time_us, "steps": self.steps,
                "applied": self.applied, "critical_path": self.critical_path}


def whatif(run: Run | TableRun | str | os.PathLike[str], *, findings: Sequence[str] | None = None,
           all: bool = False, op_speedups: Sequence[str] = (), remove_gaps: bool = False,
           swaps: Sequence[str] = ()) -> WhatIf:
    """The run's step replayed with fixes: `findings` (ids from findings.json), `all` (every finding's
    fix), `op_speedups` ("aten::gelu=2x", "module:encoder.layer.3=1.5x"), `remove_gaps` (the host work
    CUDA graphs would replay removed) and `swaps` (labels of swaps in the run's swap.json that passed
    verification, e.g. "bias_gelu": the rows its kernel replaces at swap's measured op-level time). `run`: a
    Run, the table Run the renderers read, or a run directory. An OpscopeError for an unknown finding id or
    swap, a malformed speedup or a run without its trace."""
    from opscope.analysis.fixes import parse_op_speedup

    speedups = [parse_op_speedup(s) for s in ([op_speedups] if isinstance(op_speedups, str) else op_speedups)]
    table = table_run(run, "whatif")
    if table.path is None:
        raise OpscopeError("this run has no directory (write it first): whatif reads its trace.json.gz")
    trace_path = table.path / "trace.json.gz"
    if not trace_path.is_file():
        raise OpscopeError(f"{table.path} has no trace.json.gz: whatif replays the run's trace")
    from opscope.analysis.trace_file import trace_events
    from opscope.analysis.whatif import what_if
    from opscope.machine.peaks import Peaks

    wanted = ["all"] if all else [str(x) for x in (findings or ())]
    torch_trace = table.path / TORCH_TRACE_FILE
    trace, ev = trace_events(trace_path, torch_trace if torch_trace.is_file() else None)
    steps = table.summary.get("step_time_us")
    out = what_if(trace, ev, [dict(f) for f in table.findings], wanted,
                  peaks=Peaks.from_json(table.meta.get("peaks") or {}),
                  recorded_step_us=float(steps) if isinstance(steps, (int, float)) else 0.0,
                  speedups=speedups, remove_gaps=remove_gaps,
                  swaps=[measured_swap(table, label) for label in ([swaps] if isinstance(swaps, str) else swaps)])
    n = max(out.steps, 1)
    applied = [{"fix": s.label, "saving_us_per_step": round(s.marginal_us / n, 3), "saving_us": round(s.marginal_us, 3),
                "predicted_step_time_us": round(s.predicted_step_us, 3)} for s in out.applied]
    return WhatIf(recorded_step_time_us=round(out.recorded_step_us, 3),
                  replayed_step_time_us=round(out.replayed_step_us, 3),
                  predicted_step_time_us=round(out.predicted_step_us, 3), steps=out.steps, applied=applied,
                  critical_path=out.critical_path)


def measured_swap(table: TableRun, label: str) -> tuple[str, list[tuple[str, ...]], float]:
    """(label, the ops.csv keys of the rows the swap's kernels replace, its measured saving over all profiled
    steps) for a swap of the run's swap.json that passed verification: per op-level site, (original - swapped
    median) x calls per step x steps."""
    from opscope.analysis.ops_table import KEY
    from opscope.run.swap_results import read_swap

    assert table.path is not None
    doc = read_swap(table.path / "swap.json") or {}
    results = {str(r.get("label")): r for r in doc.get("results", [])}
    result = results.get(label)
    if result is None:
        known = ", ".join(results) or "none (run `opscope profile --try-swaps` or `opscope swap`)"
        raise OpscopeError(f"no swap {label!r} in this run's swap.json (its swaps: {known})")
    if result.get("status") != "passed":
        raise OpscopeError(f"swap {label!r} did not pass verification ({result.get('status')}): it is no fix")
    steps = int(table.summary.get("steps") or 1)
    saving = 0.0
    for row in result.get("op_level") or []:
        orig, new = (row.get("original") or {}).get("median_ms"), (row.get("swapped") or {}).get("median_ms")
        calls = row.get("calls_per_step")
        if isinstance(orig, (int, float)) and isinstance(new, (int, float)) and isinstance(calls, (int, float)):
            saving += (orig - new) * 1e3 * calls * steps
    kernels = set(result.get("kernels") or label.split("+"))
    ops = table.ops
    keys = [tuple(str(ops[c][i]) for c in KEY) for cand in table.summary.get("swap_candidates") or []
            if cand.get("kernel") in kernels for i in cand.get("rows") or [] if 0 <= i < len(ops["op"])]
    if not keys:
        raise OpscopeError(f"swap {label!r}: the run's summary names no op rows its kernels replace "
                           "(swap_candidates)")
    return label, keys, saving

