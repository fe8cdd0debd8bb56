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
from opscope.run.model import DEFAULT_REPORTS_DIR, RANKS_FILE, RUN_FILES, Run
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
    _check_meta(path / "meta.json", meta)
    _check_summary(path / "summary.json", summary)
    _check_findings(path / "findings.json", findings)
    ops = read_ops_csv(path / "ops.csv")
    modules = read_modules_csv(path / "modules.csv")
    ranks = read_ranks_csv(path / RANKS_FILE) if (path / RANKS_FILE).is_file() else None
    return Run(meta=meta, ops=ops, findings=findings, summary=summary, path=path, modules=modules, ranks=ranks)


def _read_json(path: Path, kind: type) -> Any:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise OpscopeError(f"{path} is damaged: {_reason(exc)}") from exc
    if not isinstance(value, kind):
        raise OpscopeError(f"{path} is damaged: expected a JSON {'object' if kind is dict else 'list'}, "
                           f"got {type(value).__name__}")
    return value


def _reason(exc: BaseException) -> str:
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return text.splitlines()[0][:200]


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check(path: Path, ok: bool, what: str) -> None:
    if not ok:
        raise OpscopeError(f"{path} is damaged: {what}")


def _check_meta(path: Path, meta: dict[str, Any]) -> None:
    for key in ("target", "source"):
        _check(path, isinstance(meta.get(key, ""), str), f"{key!r} must be text")
    for key in ("mode", "dtype", "torch_version"):
        _check(path, meta.get(key) is None or isinstance(meta.get(key), str), f"{key!r} must be text or null")
    device = meta.get("device", {})
    _check(path, isinstance(device, dict) and all(isinstance(device.get(k, ""), str) for k in ("type", "name")),
           "'device' must be an object with text 'type' and 'name'")
    peaks = meta.get("peaks", {})
    _check(path, isinstance(peaks, dict), "'peaks' must be an object")
    bw = peaks.get("memory_bandwidth_gbps")
    _check(path, bw is None or (_is_num(bw) and bw > 0), "'peaks.memory_bandwidth_gbps' must be a positive number")
    flops = peaks.get("flops_gflops", {})
    _check(path, isinstance(flops, dict) and all(isinstance(k, str) and _is_num(v) and v > 0 for k, v in flops.items()),
           "'peaks.flops_gflops' must map dtype names to positive numbers")
    origin = peaks.get("origin", {})
    _check(path, isinstance(origin, dict) and all(isinstance(v, str) for v in origin.values()),
           "'peaks.origin' must map to text")
    calibration = meta.get("calibration")
    _check(path, calibration is None or (isinstance(calibration, dict) and all(
        isinstance(v, bool) for v in calibration.values())), "'calibration' must be an object of true/false")


def _check_summary(path: Path, summary: dict[str, Any]) -> None:
    steps = summary.get("steps", 1)
    _check(path, isinstance(steps, int) and not isinstance(steps, bool) and steps >= 0, "'steps' must be a whole number")
    for key in ("total_time_us", "step_time_us", "ops_covered_time_share", "step_time_us_p50",
                "step_time_us_max", "step_time_cv"):
        v = summary.get(key)
        _check(path, v is None or _is_num(v), f"{key!r} must be a number")
    noise = summary.get("noise")
    _check(path, noise is None or (
        isinstance(noise, dict) and _opt_num(noise.get("other_cpu_share"))
        and (noise.get("other_cpu_share") is None or 0 <= noise["other_cpu_share"] <= 1)
        and all(noise.get(k) is None or isinstance(noise.get(k), str) for k in ("verdict", "reason"))
        and all(_opt_num(noise.get(k)) for k in ("cores", "threads", "window_s"))),
        "'noise' must be an object with 'other_cpu_share' a share (0-1) or null and 'verdict', 'reason' text")
    busy = summary.get("device_busy_share")
    _check(path, busy is None or _is_num(busy), "'device_busy_share' must be a number")
    shares = summary.get("bound_time_share", {})
    _check(path, isinstance(shares, dict) and all(v is None or _is_num(v) for v in shares.values()),
           "'bound_time_share' must map bound classes to numbers")
    _check_gpu_summary(path, summary)


def _opt_num(v: Any) -> bool:
    return v is None or _is_num(v)


def _records(v: Any, numbers: tuple[str, ...], texts: tuple[str, ...]) -> bool:
    """A list of objects whose `numbers` keys are numbers (or null) and `texts` keys text (or null)."""
    return isinstance(v, list) and all(
        isinstance(r, dict) and all(_opt_num(r.get(k)) for k in numbers)
        and all(r.get(k) is None or isinstance(r.get(k), str) for k in texts) for r in v)


def _check_gpu_summary(path: Path, summary: dict[str, Any]) -> None:
    """The GPU timeline keys (opscope.analysis.gpu_timeline) the console reads."""
    for key in ("unattributed_time_share", "kernel_families_cover_share", "comm_compute_overlap_share"):
        _check(path, _opt_num(summary.get(key)), f"{key!r} must be a number or null")
    families = summary.get("kernel_family_time_share")
    _check(path, families is None or (isinstance(families, dict) and all(_opt_num(v) for v in families.values())),
           "'kernel_family_time_share' must map kernel families to numbers")
    graph = summary.get("graph_replay")
    launchers = graph.get("launchers") if isinstance(graph, dict) else None
    _check(path, graph is None or (
        isinstance(graph, dict)
        and all(_opt_num(graph.get(k)) for k in ("launches", "kernels", "kernel_time_share", "captured_time_share"))
        and (launchers is None or (isinstance(launchers, list) and all(isinstance(x, str) for x in launchers)))),
        "'graph_replay' must be an object of counts, shares and launcher names")
    streams = summary.get("streams")
    _check(path, streams is None or _records(streams, ("stream", "busy_us", "busy_share", "kernels"), ()),
           "'streams' must be a list of objects with numbers")
    gaps = summary.get("idle_gaps")
    _check(path, gaps is None or _records(gaps, ("start_us", "duration_us"),
                                          ("kernel_before", "kernel_after", "cpu_op", "cpu_source_location")),
           "'idle_gaps' must be a list of objects (times as numbers, names as text)")


def _check_findings(path: Path, findings: list[Any]) -> None:
    for i, f in enumerate(findings):
        _check(path, isinstance(f, dict), f"finding {i} is not an object")
        for key in ("rule", "severity", "message", "suggestion"):
            _check(path, isinstance(f.get(key), str), f"finding {i}: {key!r} must be text")
        for key in ("op", "source_location"):
            _check(path, f.get(key) is None or isinstance(f.get(key), str), f"finding {i}: {key!r} must be text")
        saving = f.get("est_savings_us")
        _check(path, saving is None or _is_num(saving), f"finding {i}: 'est_savings_us' must be a number or null")


TEXT_COLUMNS = ("op", "input_dims", "input_dtypes", "input_strides", "concrete_inputs", "source_location",
                "bound", "kernels", "family", "dtype", "ceiling", "note", "kernel_family", "launcher",
                "measured_kernels", "module", "module_class")
# The columns the renderers read as numbers; anything else in them makes the file damaged.
NUMBER_COLUMNS = ("calls", "time_us_total", "time_share", "flops_per_call", "bytes_per_call",
                  "arithmetic_intensity", "achieved_gflops", "achieved_gbps", "pct_peak_flops",
                  "pct_peak_bandwidth", "cpu_time_us_total", "time_us_per_call", "alloc_bytes_per_call",
                  "freed_bytes_per_call")
REQUIRED_COLUMNS = ("op", "calls", "time_us_total", "time_share")


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


# ranks.csv: text columns, and the columns the renderers read as numbers (README, "Run directory format").
RANKS_TEXT_COLUMNS = ("device", "run")
RANKS_NUMBER_COLUMNS = ("rank", "steps", "step_time_us", "op_time_us", "collective_time_us", "compute_time_us",
                        "idle_time_us", "comm_compute_overlap_share", "straggler")


def read_ranks_csv(path: Path) -> Table:
    """ranks.csv of a merged run, checked like ops.csv: damaged is one OpscopeError naming the file."""
    header, cells = _read_csv(path)
    _check(path, "rank" in header, "missing column 'rank'")
    table = _typed(path, header, cells, RANKS_TEXT_COLUMNS, RANKS_NUMBER_COLUMNS, empty_is_missing=False)
    _check(path, not any(r != r for r in table["rank"]), "column 'rank' must hold rank numbers")
    return table


MODULE_TEXT_COLUMNS = ("module", "module_class", "bound")
MODULE_NUMBER_COLUMNS = ("depth", "time_us_total", "time_share", "self_time_us", "flops_total", "bytes_total",
                         "findings")


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
    """(header, columns of cells) of a CSV file as opscope writes them (opscope.run.write.write_csv)."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            rows = [row for row in csv.reader(f) if row]  # blank lines are skipped, as pandas did
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise OpscopeError(f"{path} is damaged: {_reason(exc)}") from exc
    _check(path, bool(rows), "no columns to parse from file")
    header = rows[0]
    _check(path, len(set(header)) == len(header), "a column name appears twice")
    width = len(header)
    for line, row in enumerate(rows[1:], 2):
        _check(path, len(row) <= width, f"expected {width} fields in line {line}, saw {len(row)}")
    columns = [[row[i] if i < len(row) else "" for row in rows[1:]] for i in range(width)]
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
    out = []
    for row, cell in enumerate(cells, 1):
        value = NAN if cell == "" else _float(cell)
        _check(path, value is not None, f"column {name!r} holds non-numbers (row {row})")
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
