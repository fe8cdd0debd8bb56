"""What a full report says, as plain data, shared by the console report and the HTML report: the
one-line verdict, the step-time line, time broken down by op family, bound class and module, kernels
per op, memory and swap results. Reads a Run (and the optional files of its directory) only; callers
pass a run already cleaned by render.text.cleaned_run, and strings read here from other files are
cleaned the same way."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from opscope.render.console import fmt_pct, fmt_us, si
from opscope.render.text import clean
from opscope.run import Run

BOUNDS = ("compute", "memory", "overhead", "unknown")


def num(value: Any) -> float | None:
    """A finite float, or None (for NaN, inf, text, bools, missing)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def text(value: Any) -> str:
    """A string cell ('' for NaN or missing)."""
    return value if isinstance(value, str) else ""


def steps_of(run: Run) -> int:
    steps = run.summary.get("steps")
    return steps if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0 else 1


def short_location(location: str) -> str:
    """'pkg/models/x/modeling_x.py:250' -> 'modeling_x.py:250'."""
    return location.rsplit("/", 1)[-1]


def verdict_line(run: Run) -> str:
    """E.g. '62% of op time is memory-bound; top finding: implicit copy at model.py:41 (saves ~1.1 ms per
    step)'."""
    shares = run.summary.get("bound_time_share")
    parts = []
    if isinstance(shares, dict):
        known = [(num(shares.get(b)), b) for b in BOUNDS if num(shares.get(b)) is not None]
        if known:
            share, bound = max(known)
            parts.append(f"{share * 100:.0f}% of op time is {bound}-bound")
    busy = num(run.summary.get("device_busy_share"))
    if busy is not None and busy < 0.5:
        parts.append(f"the GPU is busy {busy * 100:.0f}% of the step")
    if run.findings:
        top = run.findings[0]
        where = text(top.get("source_location")) or text(top.get("op"))
        saving = num(top.get("est_savings_us"))
        finding = f"top finding: {text(top.get('rule')).replace('-', ' ')}"
        finding += f" at {short_location(where)}" if where else ""
        if saving is not None:
            finding += f" (saves ~{fmt_us(saving / steps_of(run))} per step)"
        parts.append(finding)
    else:
        parts.append("no findings")
    return "; ".join(parts)


def step_line(run: Run) -> str:
    """'5 steps × 4.81 ms', with the spread and noise verdict (step_spread) when the run measured them."""
    steps = steps_of(run)
    line = f"{steps} step{'' if steps == 1 else 's'} × {fmt_us(run.summary.get('step_time_us'))}"
    spread = step_spread(run)
    return f"{line} ({spread})" if spread else line


def step_spread(run: Run) -> str:
    """The step time's spread and the run's noise verdict ('median 4.7 ms, max 5.2 ms, CV 3.1%; noise:
    quiet'), or '' when the run did not measure them."""
    s = run.summary
    spread = [f"{label} {fmt(s[key])}" for key, label, fmt in
              (("step_time_us_p50", "median", fmt_us), ("step_time_us_max", "max", fmt_us),
               ("step_time_cv", "CV", lambda v: fmt_pct(v, 100))) if num(s.get(key)) is not None]
    line = ", ".join(spread)
    noise = s.get("noise")
    if isinstance(noise, dict) and isinstance(noise.get("verdict"), str):
        line += ("; " if line else "") + f"noise: {noise['verdict']}"
        other = num(noise.get("other_cpu_share"))
        if other is not None:
            line += f", other processes used {other * 100:.0f}% of the CPU"
    return line


def ceilings_line(run: Run) -> str:
    peaks = run.meta.get("peaks") or {}
    origin = peaks.get("origin") or {}
    bw = num(peaks.get("memory_bandwidth_gbps"))
    flops = peaks.get("flops_gflops") or {}
    parts = ", ".join(f"{k} {si(v * 1e9, 'FLOP/s')}" for k, v in flops.items() if num(v) is not None)
    return (f"{si(bw * 1e9, 'B/s') if bw is not None else 'unknown'} ({origin.get('memory_bandwidth', '?')}); "
            f"{parts or 'FLOP/s unknown'} ({origin.get('flops', '?')})")


@dataclass
class Share:
    name: str
    time_us: float  # over all profiled steps, as time_us_total
    share: float


def breakdown(run: Run, column: str) -> list[Share]:
    """Op time summed by the values of `column` (family, bound, module), largest first; values with no
    time left out."""
    ops = run.ops
    if column not in ops.columns or "time_us_total" not in ops.columns:
        return []
    keys = ops[column].map(lambda v: text(v) or "(none)")
    times = pd.to_numeric(ops["time_us_total"], errors="coerce").fillna(0.0)
    sums = times.groupby(keys).sum().sort_values(ascending=False)
    total = float(times.sum())
    return [Share(str(k), float(v), float(v) / total if total > 0 else 0.0) for k, v in sums.items() if v > 0]


def has_modules(run: Run) -> bool:
    return "module" in run.ops.columns and any(text(v) for v in run.ops["module"])


@dataclass
class ModuleNode:
    path: str  # qualified name, e.g. "transformer.h.3.attn"; "" is the model itself
    time_us: float  # inclusive, over all profiled steps


def module_tree(run: Run) -> list[ModuleNode]:
    """Inclusive time per module: from modules.csv when the run directory has one, else summed up from
    the ops' `module` column (every op's time counts for its module and each enclosing one). Empty when
    the run has no module information."""
    nodes = _modules_csv(run)
    if nodes:
        return nodes
    if not has_modules(run):
        return []
    inclusive: dict[str, float] = {}
    for module, t in zip(run.ops["module"], run.ops["time_us_total"], strict=True):
        path, t = text(module), num(t) or 0.0
        if not path:
            continue
        parts = path.split(".")
        for depth in range(1, len(parts) + 1):
            key = ".".join(parts[:depth])
            inclusive[key] = inclusive.get(key, 0.0) + t
    return [ModuleNode(p, t) for p, t in sorted(inclusive.items(), key=lambda kv: -kv[1])]


_MODULE_NAME_COLUMNS = ("module", "qualified_name", "name")
_MODULE_TIME_COLUMNS = ("time_us_total", "inclusive_time_us", "time_us")


def _modules_csv(run: Run) -> list[ModuleNode]:
    """modules.csv (the inclusive module tree), read leniently: a file this renderer cannot read is
    left out of the report, never an error."""
    path = Path(run.path) / "modules.csv" if run.path is not None else None
    if path is None or not path.is_file():
        return []
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, UnicodeDecodeError, ValueError, pd.errors.ParserError, pd.errors.EmptyDataError):
        return []
    name = next((c for c in _MODULE_NAME_COLUMNS if c in df.columns), None)
    time = next((c for c in _MODULE_TIME_COLUMNS if c in df.columns), None)
    if name is None or time is None:
        return []
    nodes = [ModuleNode(clean(n), num(t) or 0.0) for n, t in zip(df[name], df[time], strict=True)]
    return sorted(nodes, key=lambda n: -n.time_us)


def kernels_by_op(run: Run, top: int) -> list[tuple[int, dict[str, Any], list[str]]]:
    """(row index, row, kernel names) for the `top` heaviest GPU op rows that launched kernels."""
    if "kernels" not in run.ops.columns:
        return []
    out = []
    for i, row in enumerate(run.ops.to_dict("records")):
        names = [k for k in text(row.get("kernels")).split(";") if k]
        if names:
            out.append((i, row, names))
        if len(out) >= top:
            break
    return out


def memory_items(run: Run) -> list[tuple[str, str]]:
    """Memory facts of the run (the peak and the op at the peak), as (label, value) pairs: the
    summary's `memory` object, and its top-level keys about memory."""
    items: list[tuple[str, Any]] = []
    memory = run.summary.get("memory")
    if isinstance(memory, dict):
        items.extend(memory.items())
    items.extend((k, v) for k, v in run.summary.items() if "memory" in k and k != "memory")
    return [(clean(k).replace("_", " "), _format_value(k, v)) for k, v in items if v is not None]


def _format_value(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)) and num(value) is not None:
        if key.endswith("bytes") or key.endswith("_b"):
            return si(value, "B", 1024.0)
        if key.endswith("_us"):
            return fmt_us(value)
        if key.endswith("share"):
            return fmt_pct(value, 100)
        return f"{value:,}" if isinstance(value, int) else f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return clean(json.dumps(value, ensure_ascii=False, default=str))
    return clean(value)


def swap_table(run: Run) -> tuple[list[str], list[list[str]]] | None:
    """swap.json's results as (columns, rows of text), or None when the run has none. Accepts a list of
    objects or an object holding one (under "results" or "swaps")."""
    path = Path(run.path) / "swap.json" if run.path is not None else None
    if path is None or not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    if isinstance(doc, dict):
        doc = next((doc[k] for k in ("results", "swaps") if isinstance(doc.get(k), list)), [doc])
    if not isinstance(doc, list):
        return None
    records = [r for r in doc if isinstance(r, dict)]
    if not records:
        return None
    columns: list[str] = []
    for r in records:
        columns.extend(k for k in r if k not in columns)
    rows = [[_format_value(c, r.get(c)) if r.get(c) is not None else "" for c in columns] for r in records]
    return [clean(c) for c in columns], rows


def measured_point(row: dict[str, Any]) -> tuple[float, float, bool] | None:
    """(arithmetic intensity, FLOP/s, FLOPs were measured) of an op row's Nsight Compute measurement, for
    the roofline: FLOPs over measured DRAM bytes and measured time. The FLOPs are the measured CUDA-core
    ones, or the modeled ones when the kernels ran on tensor cores (whose work the SASS counts leave
    out) or counted none. None without a measurement."""
    nbytes, us = num(row.get("measured_dram_bytes_per_call")), num(row.get("measured_time_us_per_call"))
    if not nbytes or not us or nbytes <= 0 or us <= 0:
        return None
    measured, tensor = num(row.get("measured_flops_per_call")), num(row.get("measured_tensor_inst_per_call"))
    if measured and measured > 0 and not (tensor and tensor > 0):
        flops, from_counts = measured, True
    else:
        flops, from_counts = num(row.get("flops_per_call")), False
    if not flops or flops <= 0:
        return None
    return flops / nbytes, flops / (us * 1e-6), from_counts


def measured_text(row: dict[str, Any]) -> str:
    """One line with what Nsight measured for an op row ('' when nothing was)."""
    parts = []
    nbytes = num(row.get("measured_dram_bytes_per_call"))
    if nbytes is not None:
        ratio = num(row.get("measured_bytes_ratio"))
        parts.append(f"DRAM {si(nbytes, 'B', 1024.0)} per call" + (f" ({ratio:.2f}x modeled)" if ratio else ""))
        flops, fratio = num(row.get("measured_flops_per_call")), num(row.get("measured_flops_ratio"))
        if flops is not None:
            parts.append(f"{si(flops)}FLOP CUDA-core" + (f" ({fratio:.2f}x modeled)" if fratio else ""))
        tensor = num(row.get("measured_tensor_inst_per_call"))
        if tensor:
            parts.append(f"{si(tensor)} tensor-core instructions")
        parts.append(f"{fmt_us(row.get('measured_time_us_per_call'))} per call")
        for key, label in (("measured_dram_pct_peak", "DRAM"), ("measured_sm_pct_peak", "SM")):
            if num(row.get(key)) is not None:
                parts.append(f"{label} {fmt_pct(row.get(key))} of peak")
        parts = ["Nsight Compute: " + ", ".join(parts)]
    if num(row.get("nsys_time_us_total")) is not None:
        parts.append(f"Nsight Systems: {fmt_us(row.get('nsys_time_us_total'))} of kernel time")
    return "; ".join(parts)
