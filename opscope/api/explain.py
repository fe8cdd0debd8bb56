"""explain_op: the cost formula and the numbers behind one row of ops.csv, for people and agents asking
"why is this op slow, and how was it counted?".

The row's FLOPs and bytes are estimated again from its recorded inputs (input_dims, input_dtypes,
input_strides, concrete_inputs) by the cost function registered for its op, so the explanation shows that
function's own numbers next to the row's; where the row's numbers came from elsewhere (a composite whose
child ops do the work, a bias a child copy wrote, inductor's estimate for a compiled kernel, a kernel no op
launched) it says so."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from opscope.api.run import Run
from opscope.costmodel import REGISTRY, OpCall, UnreadableCall, estimate
from opscope.costmodel.base import BIAS_COPIED_BY_CHILD, DELEGATES_TO_ANY_CHILD
from opscope.errors import OpscopeError
from opscope.run.model import Run as TableRun
from opscope.table import nrows

_INPUT_COLUMNS = ("input_dims", "input_dtypes", "input_strides", "concrete_inputs")


def explain_op(run: Run | TableRun | str | os.PathLike[str], row: int | str) -> dict[str, Any]:
    """The row `row` of the run's ops.csv (an index in ops.csv order, or an op name: its first row, the
    one with the most time) explained: the op and its inputs, calls and time, FLOPs and bytes per call and
    in total, arithmetic intensity, the achieved rates, the ceiling that binds and the percent of it, the
    bound, the cost family, the cost function that counted it (qualified name, and its docstring's first
    paragraph as the formula) with its own estimate, and the row's note. `run`: an opscope.api Run, the
    table Run the renderers read, or a run directory. An OpscopeError for a row the run does not have."""
    loaded = table_run(run)
    ops = loaded.ops
    index = _row_index(ops, row)
    rec = {col: values[index] for col, values in ops.items()}
    calls = _number(rec.get("calls"))
    flops = _number(rec.get("flops_per_call"))
    nbytes = _number(rec.get("bytes_per_call"))
    time_total = _number(rec.get("time_us_total"))
    per_call = _number(rec.get("time_us_per_call"))
    if per_call is None and time_total is not None and calls:
        per_call = time_total / calls
    op = str(rec.get("op") or "")
    out: dict[str, Any] = {
        "row": index,
        "op": op,
        **{col: _json_text(rec.get(col)) for col in _INPUT_COLUMNS},
        "dtype": _text(rec.get("dtype")),
        "source_location": _text(rec.get("source_location")),
        "module": _text(rec.get("module")),
        "calls": int(calls) if calls is not None else None,
        "time_us_total": time_total,
        "time_us_per_call": per_call,
        "time_share": _number(rec.get("time_share")),
        "flops_per_call": flops,
        "bytes_per_call": nbytes,
        "flops_total": flops * calls if flops is not None and calls is not None else None,
        "bytes_total": nbytes * calls if nbytes is not None and calls is not None else None,
        "arithmetic_intensity": _number(rec.get("arithmetic_intensity")),
        "achieved_gflops": _number(rec.get("achieved_gflops")),
        "achieved_gbps": _number(rec.get("achieved_gbps")),
        "pct_peak_flops": _number(rec.get("pct_peak_flops")),
        "pct_peak_bandwidth": _number(rec.get("pct_peak_bandwidth")),
        "ceiling": _ceiling(rec, loaded.meta.get("peaks") or {}),
        "bound": _text(rec.get("bound")) or "unknown",
        "family": _text(rec.get("family")),
        "kernels": _text(rec.get("kernels")),
        "note": _text(rec.get("note")),
    }
    out.update(_cost_function(rec, flops, nbytes))
    return out


def table_run(run: Run | TableRun | str | os.PathLike[str], caller: str = "explain_op") -> TableRun:
    """The table Run of an opscope.api Run, a table Run, or a run directory (read); an OpscopeError naming
    `caller` for anything else."""
    if isinstance(run, (str, os.PathLike)):
        from opscope.run.read import read_run

        return read_run(Path(run))
    internal = run.internal if isinstance(run, Run) else run
    if not isinstance(internal, TableRun):
        raise OpscopeError(f"{caller} needs a run (opscope.api.Run or a run directory), not {type(run).__name__}")
    return internal


def _row_index(ops: dict[str, list[Any]], row: int | str) -> int:
    n = nrows(ops)
    if isinstance(row, bool) or not isinstance(row, (int, str)):
        raise OpscopeError(f"row must be a row index or an op name, not {row!r}")
    if isinstance(row, str) and row.strip().lstrip("-").isdigit():
        row = int(row)
    if isinstance(row, int):
        if not 0 <= row < n:
            raise OpscopeError(f"row {row} is not in ops.csv (it has {n} rows: 0 to {n - 1})")
        return row
    for i, op in enumerate(ops.get("op", [])):
        if op == row:
            return i
    raise OpscopeError(f"no row of ops.csv has the op {row!r}")


def _number(value: Any) -> float | None:
    """A cell as a number, None where empty or not a finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _json_text(value: Any) -> Any:
    """An input column (JSON text as recorded) parsed; the text itself when it is not JSON."""
    text = _text(value)
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def _ceiling(rec: dict[str, Any], peaks: dict[str, Any]) -> dict[str, Any]:
    """The roofline at this row: its FLOP/s ceiling (the `ceiling` column: which flops_gflops key), the
    memory bandwidth, the ridge point, which of the two binds at the row's intensity, the attainable rate
    there and the percent of the binding peak the row achieved."""
    key = _text(rec.get("ceiling"))
    peak_gflops = _number((peaks.get("flops_gflops") or {}).get(key)) if key else None
    peak_gbps = _number(peaks.get("memory_bandwidth_gbps"))
    intensity = _number(rec.get("arithmetic_intensity"))
    out: dict[str, Any] = {"flops_key": key or None, "peak_gflops": peak_gflops, "peak_gbps": peak_gbps,
                           "ridge_flops_per_byte": None, "binding": None, "attainable_gflops": None,
                           "pct_of_binding_peak": None}
    if peak_gflops and peak_gbps:
        ridge = peak_gflops / peak_gbps
        out["ridge_flops_per_byte"] = ridge
        if intensity is not None:
            memory = intensity <= ridge
            out["binding"] = "memory bandwidth" if memory else "FLOP/s"
            out["attainable_gflops"] = min(peak_gflops, intensity * peak_gbps)
            out["pct_of_binding_peak"] = _number(rec.get("pct_peak_bandwidth" if memory else "pct_peak_flops"))
    return out


def _qualified_name(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _formula(fn: Any) -> str:
    """The cost function's docstring's first paragraph, on one line."""
    doc = (getattr(fn, "__doc__", None) or "").strip()
    return " ".join(doc.split("\n\n")[0].split())


def _cost_function(rec: dict[str, Any], flops: float | None, nbytes: float | None) -> dict[str, Any]:
    """The cost function registered for the row's op, its estimate from the row's inputs, and where the
    row's own numbers came from ("counted_by")."""
    op = str(rec.get("op") or "")
    fn = REGISTRY.get(op)
    out: dict[str, Any] = {"cost_function": _qualified_name(fn) if fn else None,
                           "formula": _formula(fn) if fn else None, "estimate": None}
    if fn is None:
        if _text(rec.get("kernels")) and not any(_text(rec.get(c)) for c in _INPUT_COLUMNS):
            why = "a kernel row: kernels no op launched (or ran in a replayed graph), no shapes to count from"
        elif flops is not None or nbytes is not None:
            why = "not opscope's cost model: " + (_text(rec.get("note")) or "the trace's own estimate")
        else:
            why = "no cost function for this op: its FLOPs and bytes are unknown"
        out["counted_by"] = why
        return out
    try:
        call = OpCall.from_json_text(op, *(_text(rec.get(c)) for c in _INPUT_COLUMNS))
    except UnreadableCall:
        call = None
    cost = estimate(call) if call is not None else None
    if cost is None:
        out["counted_by"] = "the cost function cannot read the recorded inputs: no cost"
        return out
    out["estimate"] = {"flops_per_call": float(cost.flops), "bytes_per_call": float(cost.bytes),
                       "family": cost.family, "note": cost.note,
                       "arithmetic_intensity": cost.flops / cost.bytes if cost.bytes > 0 else None}
    same = flops is not None and nbytes is not None and math.isclose(flops, cost.flops, rel_tol=1e-9) \
        and math.isclose(nbytes, cost.bytes, rel_tol=1e-9)
    if same:
        out["counted_by"] = "the cost function, from the row's recorded inputs"
    elif _text(rec.get("family")) == "composite" or op in DELEGATES_TO_ANY_CHILD:
        out["counted_by"] = ("a composite here: child ops of the same work carry its FLOPs and bytes (counted "
                             "once, at the children)")
    elif op in BIAS_COPIED_BY_CHILD:
        alt = BIAS_COPIED_BY_CHILD[op]
        out["counted_by"] = (f"{_qualified_name(alt)}: a child aten::copy_ wrote the bias into the output and "
                             "counts that traffic itself")
        out["formula"] = _formula(alt)
    else:
        out["counted_by"] = ("elsewhere than this function from these inputs (the profile's dispatch pass recorded "
                             "other element dtypes, or the row's cost came from a compiled graph)")
    return out
