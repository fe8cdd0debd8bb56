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


def swap_results(run: Run) -> dict[str, Any] | None:
    """The run's swap.json (opscope.swap.result.read_swap: only well-formed results), strings cleaned;
    None when the run has none or it cannot be read (an optional file never breaks a report)."""
    from opscope.render.text import _deep
    from opscope.swap.result import read_swap

    if run.path is None:
        return None
    doc = read_swap(Path(run.path) / "swap.json")
    return _deep(doc) if doc is not None else None


def _x(ratio: Any) -> str:
    r = num(ratio)
    return f"{r:.2f}x" if r is not None else "—"


def _err(value: Any) -> str:
    v = num(value)
    return "—" if v is None else "0" if v == 0 else f"{v:.2e}"


def _ms(timing: Any) -> str:
    """'250 ms (232–260)': median (p20–p80) of a swap.json timing, in the median's unit, 3 digits."""
    if not isinstance(timing, dict):
        return "—"
    med, lo, hi = (num(timing.get(k)) for k in ("median_ms", "p20_ms", "p80_ms"))
    if med is None:
        return "—"
    unit, scale = ("s", 1e-3) if med >= 1e3 else ("ms", 1.0) if med >= 1.0 else ("µs", 1e3)

    def digits(v: float) -> str:
        v *= scale
        return f"{v:.3g}" if v < 1000 else f"{v:.0f}"

    spread = f" ({digits(lo)}–{digits(hi)})" if lo is not None and hi is not None else ""
    return f"{digits(med)} {unit}{spread}"


def _speedup(ratio: Any, original: Any, swapped: Any, suspicious: Any) -> str:
    """'1.07x', with '(noise)' when the two p20–p80 ranges overlap and '(suspicious)' above 10x."""
    out = _x(ratio)
    if out == "—":
        return out
    if suspicious is True:
        return out + " (suspicious)"
    ranges = [(num(t.get("p20_ms")), num(t.get("p80_ms"))) if isinstance(t, dict) else (None, None)
              for t in (original, swapped)]
    (a_lo, a_hi), (b_lo, b_hi) = ranges
    if None not in (a_lo, a_hi, b_lo, b_hi) and not (a_lo > b_hi or b_lo > a_hi):
        out += " (noise)"
    return out


def _share(value: Any) -> str:
    v = num(value)
    return "—" if v is None else "0" if v == 0 else f"{v * 100:.3g}%"


def _records(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def op_time_speedup(result: dict[str, Any]) -> float | None:
    """The replaced work's time per step before / after: each op-level row's median times its calls per
    step, summed."""
    before = after = 0.0
    for row in _records(result.get("op_level")):
        calls = num(row.get("calls_per_step")) or 0.0
        o, k = (row.get("original") or {}), (row.get("swapped") or {})
        if not isinstance(o, dict) or not isinstance(k, dict) or num(o.get("median_ms")) is None \
                or num(k.get("median_ms")) is None:
            continue
        before += num(o["median_ms"]) * calls
        after += num(k["median_ms"]) * calls
    return before / after if after > 0 else None


def _ways(result: dict[str, Any]) -> str:
    parts = []
    for m in _records(result.get("mechanisms")):
        sites = m.get("sites") if isinstance(m.get("sites"), list) else []
        parts.append(f"{text(m.get('description'))} ×{len(sites)}")
    return "; ".join(parts) or "—"


SWAP_COLUMNS = ["swap", "status", "replaces", "calls kernel/orig", "max abs err", "max rel err", "out of tol",
                "op speedup", "step original", "step swapped", "step speedup"]


def swap_table(run: Run) -> tuple[list[str], list[list[str]]] | None:
    """One row per swap of swap.json: status, what it replaced, calls per step that ran the kernel and
    that fell back, the largest errors, the op-level speedup (op_time_speedup), the end-to-end step
    times and speedup; None when the run has no swap results."""
    doc = swap_results(run)
    if doc is None:
        return None
    rows = []
    for r in doc["results"]:
        calls = r.get("calls") if isinstance(r.get("calls"), dict) else {}
        e2e = r.get("end_to_end") if isinstance(r.get("end_to_end"), dict) else {}
        share = r.get("out_of_tolerance")
        step = _speedup(e2e.get("speedup"), e2e.get("original"), e2e.get("swapped"), e2e.get("suspicious"))
        rows.append([text(r.get("label")), text(r.get("status")), _ways(r),
                     f"{calls.get('swapped', '—')}/{calls.get('fallback', '—')}" if calls else "—",
                     _err(r.get("max_abs_err")), _err(r.get("max_rel_err")),
                     _share(share), _x(op_time_speedup(r)),
                     _ms(e2e.get("original")), _ms(e2e.get("swapped")), step])
    return SWAP_COLUMNS, rows


def swap_notes(run: Run) -> list[tuple[str, str]]:
    """(swap, text) for each swap's message (why it failed or does not apply) and notes."""
    doc = swap_results(run)
    out = []
    for r in (doc or {}).get("results", []):
        e2e = r.get("end_to_end") if isinstance(r.get("end_to_end"), dict) else {}
        notes = [text(r.get("message"))] + [text(n) for n in (r.get("notes") if isinstance(r.get("notes"), list) else [])]
        if num(e2e.get("compile_s")) is not None:
            notes.append(f"torch.compile took {e2e['compile_s']:.1f} s (the first step, not in the timings)")
        out.extend((text(r.get("label")), n) for n in notes if n)
    return out


SWAP_OP_COLUMNS = ["swap", "site", "call", "calls/step", "original", "kernel", "speedup", "% of peak", "bound"]


def swap_op_table(run: Run) -> tuple[list[str], list[list[str]]] | None:
    """The op-level rows of every swap that has them: the original vs the kernel on a captured call."""
    doc = swap_results(run)
    rows = []
    for r in (doc or {}).get("results", []):
        for op in _records(r.get("op_level")):
            before, after = num(op.get("pct_peak_before")), num(op.get("pct_peak_after"))
            pct = f"{before:.0f}% → {after:.0f}%" if before is not None and after is not None else "—"
            rows.append([text(r.get("label")), text(op.get("site")), text(op.get("call")),
                         str(op.get("calls_per_step", "—")), _ms(op.get("original")), _ms(op.get("swapped")),
                         _speedup(op.get("speedup"), op.get("original"), op.get("swapped"), op.get("suspicious")), pct,
                         text(op.get("bound")) or "—"])
    return (SWAP_OP_COLUMNS, rows) if rows else None


SWAP_CHECK_COLUMNS = ["swap", "check", "seed", "result", "max abs err", "max rel err", "out of tol", "tensor / call",
                      "detail"]


def swap_check_table(run: Run, failed_only: bool = True) -> tuple[list[str], list[list[str]]] | None:
    """The error table of the swaps that failed verification: every comparison (outputs, gradients: their
    errors per seed) and every failed check; with failed_only=False, every check of every swap."""
    doc = swap_results(run)
    rows = []
    for r in (doc or {}).get("results", []):
        if failed_only and r.get("status") != "failed":
            continue
        v = r.get("verification") if isinstance(r.get("verification"), dict) else {}
        for c in _records(v.get("checks")):
            if failed_only and c.get("passed") is True and c.get("max_abs_err") is None:
                continue
            rows.append([text(r.get("label")), text(c.get("check")),
                         str(c["seed"]) if isinstance(c.get("seed"), int) else "",
                         "pass" if c.get("passed") is True else "FAIL", _err(c.get("max_abs_err")),
                         _err(c.get("max_rel_err")), _share(c.get("out_of_tolerance")) if c.get("out_of_tolerance") is not None else "",
                         text(c.get("worst")), text(c.get("detail"))])
    return (SWAP_CHECK_COLUMNS, rows) if rows else None


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
