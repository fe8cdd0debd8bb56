"""What a full report says, as plain data, shared by the console report and the HTML report: the
one-line verdict, the step-time line, time broken down by op family, bound class and module, kernels
per op, memory and swap results. Reads a Run (and the optional files of its directory) only; callers
pass a run already cleaned by render.text.cleaned_run, and strings read here from other files are
cleaned the same way."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opscope import units
from opscope.render.text import clean
from opscope.run.model import Run
from opscope.run.schema import GPU_ONLY_NOTE, GRAPH_KERNEL_NOTE, LOOSE_KERNEL_NOTE
from opscope.table import group_sums, largest_first, pairwise_sum, records
from opscope.trace.kernel_names import short_kernel_name
from opscope.units import number as num  # a finite float, or None

BOUNDS = ("compute", "memory", "overhead", "unknown")


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
        known = [(v, b) for v, b in ((num(shares.get(b)), b) for b in BOUNDS) if v is not None]
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
            finding += f" (saves ~{units.time_cell(saving / steps_of(run))} per step)"
        parts.append(finding)
    else:
        parts.append("no findings")
    return "; ".join(parts)


def step_line(run: Run) -> str:
    """'5 steps × 4.81 ms', with the spread and noise verdict (step_spread) when the run measured them."""
    steps = steps_of(run)
    line = f"{steps} step{'' if steps == 1 else 's'} × {units.time_cell(run.summary.get('step_time_us'))}"
    spread = step_spread(run)
    return f"{line} ({spread})" if spread else line


def step_spread(run: Run) -> str:
    """The step time's spread and the run's noise verdict ('median 4.7 ms, max 5.2 ms, CV 3.1%; noise:
    quiet'), or '' when the run did not measure them."""
    s = run.summary
    spread = [f"{label} {fmt(s[key])}" for key, label, fmt in
              (("step_time_us_p50", "median", units.time_cell), ("step_time_us_max", "max", units.time_cell),
               ("step_time_cv", "CV", lambda v: units.percent(v, 100))) if num(s.get(key)) is not None]
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
    parts = ", ".join(f"{k} {units.si(v * 1e9, 'FLOP/s')}" for k, v in flops.items() if num(v) is not None)
    if bw is None and not parts:  # said once, not "- (unknown); unknown (unknown)"
        return "unknown (give --peak-bw and --peak-flops for % of peak and bound)"
    return (f"{units.si(bw * 1e9, 'B/s') if bw is not None else 'bandwidth unknown'} "
            f"({origin.get('memory_bandwidth', '?')}); {parts or 'FLOP/s unknown'} ({origin.get('flops', '?')})")


@dataclass
class Share:
    name: str
    time_us: float  # over all profiled steps, as time_us_total
    share: float


def breakdown(run: Run, column: str) -> list[Share]:
    """Op time summed by the values of `column` (family, bound, module), largest first; values with no
    time left out."""
    ops = run.ops
    if column not in ops or "time_us_total" not in ops:
        return []
    keys = [text(v) or "(none)" for v in ops[column]]
    times = [num(v) or 0.0 for v in ops["time_us_total"]]
    total = pairwise_sum(times)
    return [Share(str(k), v, v / total if total > 0 else 0.0)
            for k, v in largest_first(group_sums(keys, times)) if v > 0]


@dataclass
class ModuleNode:
    path: str  # qualified name, e.g. "transformer.h.3.attn"; "" is the model itself (or OUTSIDE)
    time_us: float  # inclusive, over all profiled steps
    depth: int = 0
    module_class: str = ""
    share: float = 0.0
    flops: float | None = None
    nbytes: float | None = None
    bound: str = ""
    findings: int = 0


def module_tree(run: Run) -> list[ModuleNode]:
    """modules.csv's rows, in its (tree) order; empty when the run has no module paths."""
    if run.modules is None:
        return []
    out = []
    for r in records(run.modules):
        out.append(ModuleNode(path=clean(text(r.get("module"))), time_us=num(r.get("time_us_total")) or 0.0,
                              depth=int(num(r.get("depth")) or 0), module_class=clean(text(r.get("module_class"))),
                              share=num(r.get("time_share")) or 0.0, flops=num(r.get("flops_total")),
                              nbytes=num(r.get("bytes_total")), bound=text(r.get("bound")),
                              findings=int(num(r.get("findings")) or 0)))
    return out


@dataclass
class TreeLine:
    """One line of `opscope report --tree`: a module, or repeated sibling blocks folded into one."""

    label: str  # the last part of the name ("attn"), folded siblings as "[0-11]"; ROOT/OUTSIDE as named
    path: str  # qualified name (folded: with the [a-b] part)
    depth: int
    module_class: str
    time_us: float  # inclusive, summed over the folded instances
    share: float
    flops: float | None
    nbytes: float | None
    bound: str
    findings: int
    instances: list[float]  # inclusive time of each folded instance (one entry when not folded)


_NUMBERED = re.compile(r"^(?P<prefix>.*?)(?P<n>\d+)$")


def tree_lines(run: Run, fold: bool = True) -> list[TreeLine]:
    """The module tree as lines, depth-first; with `fold`, repeated blocks are one line: siblings of one
    class that a ModuleList / Sequential numbers (h.0 ... h.11) or, in traces, instances of one block
    class (BertLayer_0 ... BertLayer_3); and so is each module at the same relative place inside them."""
    nodes = module_tree(run)
    if not nodes:
        return []
    by_path = {n.path: n for n in nodes}
    children: dict[str, list[str]] = {}
    order = {n.path: k for k, n in enumerate(nodes)}
    for n in nodes:
        if n.depth > 0:
            up = n.path.rsplit(".", 1)[0] if "." in n.path else ""
            children.setdefault(up, []).append(n.path)
    out: list[TreeLine] = []

    def emit(label: str, shown_path: str, members: list[str], depth: int) -> None:
        group = [by_path[m] for m in members]
        bound_time: dict[str, float] = {}
        for g in group:
            bound_time[g.bound] = bound_time.get(g.bound, 0.0) + g.time_us
        flops = [g.flops for g in group if g.flops is not None]
        nbytes = [g.nbytes for g in group if g.nbytes is not None]
        out.append(TreeLine(label=label, path=shown_path, depth=depth, module_class=group[0].module_class,
                            time_us=sum(g.time_us for g in group), share=sum(g.share for g in group),
                            flops=sum(flops) if flops else None, nbytes=sum(nbytes) if nbytes else None,
                            bound=max(bound_time, key=bound_time.__getitem__) if bound_time else "",
                            findings=sum(g.findings for g in group), instances=[g.time_us for g in group]))
        # the children of every member, grouped by their last name part
        kids: dict[str, list[str]] = {}
        for m in members:
            for c in children.get(m, []):
                kids.setdefault(c.rsplit(".", 1)[-1], []).append(c)
        names = sorted(kids, key=lambda k: min(order[c] for c in kids[k]))
        groups: list[tuple[str, list[str]]] = []
        if fold:
            numbered: dict[tuple[str, str], list[str]] = {}
            index: dict[str, int] = {}  # a numbered name's number
            for name in names:
                match = _NUMBERED.match(name)
                cls = by_path[kids[name][0]].module_class
                # ModuleList / Sequential indices (h.3), or a trace's instances of a block (BertLayer_3);
                # not numbered names of distinct layers (ln_1, ln_2) nor a trace's q/k/v Linear_0..2
                if match and (name.isdigit() or (match.group("prefix") == f"{cls}_" and
                                                 any(c in children for c in kids[name]))):
                    numbered.setdefault((match.group("prefix"), cls), []).append(name)
                    index[name] = int(match.group("n"))
            folded = {n for names_ in numbered.values() if len(names_) > 1 for n in names_}
            done: set[tuple[str, str]] = set()
            for name in names:
                if name not in folded:
                    groups.append((name, kids[name]))
                    continue
                key = next(k for k, v in numbered.items() if name in v)
                if key in done:
                    continue
                done.add(key)
                numbers = sorted(index[x] for x in numbered[key])
                span = f"{numbers[0]}-{numbers[-1]}" if numbers == list(range(numbers[0], numbers[-1] + 1)) \
                    else ",".join(map(str, numbers))
                groups.append((f"{key[0]}[{span}]", [c for x in numbered[key] for c in kids[x]]))
        else:
            groups = [(name, kids[name]) for name in names]
        for name, members_ in groups:
            emit(name, f"{shown_path}.{name}" if shown_path else name, members_, depth + 1)

    for n in nodes:
        if n.depth == 0:
            emit(n.path or ROOT_MODULE, n.path, [n.path], 0)
    return out


def kernels_by_op(run: Run, top: int) -> list[tuple[int, dict[str, Any], list[str]]]:
    """(row index, row, kernel names) for the `top` heaviest GPU op rows that launched kernels."""
    if "kernels" not in run.ops:
        return []
    out = []
    for i, row in enumerate(records(run.ops)):
        names = [k for k in text(row.get("kernels")).split(";") if k]
        if names:
            out.append((i, row, names))
        if len(out) >= top:
            break
    return out


def memory_items(run: Run) -> list[tuple[str, str]]:
    """summary.json's `memory` object (docs/reference/run-format.md) as (label, value) lines: the peak,
    the op during which it was reached, what was alive then, the growth per step and each step's peak."""
    m = run.summary.get("memory")
    if not isinstance(m, dict):
        return []
    items: list[tuple[str, str]] = []
    peak = num(m.get("peak_allocated_bytes"))
    if peak is not None:
        step = m.get("peak_step")
        where = op_at(m.get("peak_op"), m.get("peak_source_location"), m.get("peak_module"))
        items.append(("peak allocated", units.si(peak, "B", 1024.0) + (f" in step {step}" if isinstance(step, int) else "")
                      + (f", during {where}" if where else "")))
    cuda = num(m.get("cuda_max_memory_allocated_bytes"))
    if cuda is not None:
        items.append(("CUDA max allocated", units.si(cuda, "B", 1024.0)))
    alive = [g for g in m.get("alive_at_peak") or [] if isinstance(g, dict)] if isinstance(m.get("alive_at_peak"), list) else []
    for k, g in enumerate(alive[:5]):
        n = num(g.get("tensors"))
        count = f" ({n:.0f} tensor{'' if n == 1 else 's'})" if n is not None else ""
        items.append(("alive at the peak" if k == 0 else "",
                      f"{units.si(g.get('bytes'), 'B', 1024.0)} from {op_at(g.get('op'), g.get('source_location'), g.get('module')) or '?'}{count}"))
    other = num(m.get("alive_at_peak_other_bytes"))
    if alive and other:
        items.append(("", f"{units.si(other, 'B', 1024.0)} allocated before the recording or outside any op"))
    growth = num(m.get("growth_bytes_per_step"))
    if growth is not None:
        items.append(("growth per step", ("+" if growth > 0 else "") + units.si(growth, "B", 1024.0)))
    per_step = [p for p in m.get("per_step") or [] if isinstance(p, dict)] if isinstance(m.get("per_step"), list) else []
    if per_step:
        items.append(("peak per step", ", ".join(units.si(p.get("peak_allocated_bytes"), "B", 1024.0) for p in per_step)))
    source, device = text(m.get("source")), text(m.get("device"))
    if source:
        items.append(("recorded by", f"{source}" + (f" on {device}" if device else "")
                      + (f", {m['steps']} steps" if isinstance(m.get("steps"), int) else "")))
    if text(m.get("note")):
        items.append(("note", text(m.get("note"))))
    return [(clean(k), clean(v)) for k, v in items]


def op_at(op: Any, location: Any, module: Any) -> str:
    """'mm at model.py:12 (module h.0.attn)' from what is known of it ('(model)': the model's own forward)."""
    parts = [text(op).removeprefix("aten::")]
    if text(location):
        parts.append(f"at {text(location)}")
    if isinstance(module, str):
        parts.append(f"(module {module})" if module else ROOT_MODULE)
    return " ".join(p for p in parts if p)


def swap_results(run: Run) -> dict[str, Any] | None:
    """The run's swap.json (opscope.run.swap_results.read_swap: only well-formed results), strings cleaned;
    None when the run has none or it cannot be read (an optional file never breaks a report)."""
    from opscope.render.text import _deep
    from opscope.run.swap_results import read_swap

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
    if a_lo is not None and a_hi is not None and b_lo is not None and b_hi is not None \
            and not (a_lo > b_hi or b_lo > a_hi):
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
        if not isinstance(o, dict) or not isinstance(k, dict):
            continue
        ms_o, ms_k = num(o.get("median_ms")), num(k.get("median_ms"))
        if ms_o is None or ms_k is None:
            continue
        before += ms_o * calls
        after += ms_k * calls
    return before / after if after > 0 else None


def _ways(result: dict[str, Any]) -> str:
    parts = []
    for m in _records(result.get("mechanisms")):
        sites = m.get("sites")
        parts.append(f"{text(m.get('description'))} ×{len(sites) if isinstance(sites, list) else 0}")
    return "; ".join(parts) or "—"


SWAP_COLUMNS = ["swap", "status", "replaces", "calls kernel/orig", "max abs err", "max rel err", "out of tol",
                "op speedup", "step original", "step swapped", "step speedup"]


CANDIDATE_COLUMNS = ["kernel", "verdict", "measured speedup", "original per step", "kernel per step", "op rows",
                     "why"]


def candidate_table(run: Run) -> tuple[list[str], list[list[str]]] | None:
    """One row per swap candidate of summary.json (profile's in-context timing): the suggestions (faster)
    first, then those slower here and those not measured here, each with its number or why; None when
    the run has none."""
    from opscope.run.schema import candidate_verdict

    cands = [c for c in run.summary.get("swap_candidates") or [] if isinstance(c, dict) and isinstance(c.get("kernel"), str)]
    if not cands:
        return None
    order = {"faster": 0, "slower here": 1, "not measured here": 2}
    rows = []
    for c in sorted(cands, key=lambda c: order[candidate_verdict(c)]):
        speed = num(c.get("measured_speedup"))
        rows.append([text(c["kernel"]), candidate_verdict(c), f"{speed:.2f}x" if speed is not None else "—",
                     _us(c.get("original_us")), _us(c.get("measured_us")),
                     ", ".join(str(r + 1) for r in c.get("rows") or [] if isinstance(r, int)), text(c.get("why")) or ""])
    return CANDIDATE_COLUMNS, rows


def _us(value: Any) -> str:
    v = num(value)
    return units.duration(v) if v is not None else "—"


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
    out: list[tuple[str, str]] = []
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
    flops: float | None
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
        parts.append(f"DRAM {units.si(nbytes, 'B', 1024.0)} per call" + (f" ({ratio:.2f}x modeled)" if ratio else ""))
        flops, fratio = num(row.get("measured_flops_per_call")), num(row.get("measured_flops_ratio"))
        if flops is not None:
            parts.append(f"{units.si(flops)}FLOP CUDA-core" + (f" ({fratio:.2f}x modeled)" if fratio else ""))
        tensor = num(row.get("measured_tensor_inst_per_call"))
        if tensor:
            parts.append(f"{units.si(tensor)} tensor-core instructions")
        parts.append(f"{units.time_cell(row.get('measured_time_us_per_call'))} per call")
        for key, label in (("measured_dram_pct_peak", "DRAM"), ("measured_sm_pct_peak", "SM")):
            if num(row.get(key)) is not None:
                parts.append(f"{label} {units.percent(row.get(key))} of peak")
        parts = ["Nsight Compute: " + ", ".join(parts)]
    if num(row.get("nsys_time_us_total")) is not None:
        parts.append(f"Nsight Systems: {units.time_cell(row.get('nsys_time_us_total'))} of kernel time")
    return "; ".join(parts)


def binding_pct(row: dict[str, Any]) -> Any:
    """% of the roof that binds this op: FLOP/s for compute-bound, bandwidth otherwise."""
    if row.get("bound") == "compute":
        return row.get("pct_peak_flops")
    pb, pf = num(row.get("pct_peak_bandwidth")), num(row.get("pct_peak_flops"))
    if row.get("bound") == "memory":
        return pb
    vals = [v for v in (pb, pf) if v is not None]
    return max(vals) if vals else None


ROOT_MODULE = "(model)"  # how the model itself (qualified name "") is shown


def has_modules(run: Run) -> bool:
    """Whether the run's rows carry module paths (ops.csv `module_class` set on some row)."""
    ops = run.ops
    return "module_class" in ops and any(isinstance(v, str) and v for v in ops["module_class"])


def module_label(row: dict[str, Any]) -> str:
    """The row's module as shown: its qualified name, ROOT_MODULE for the model itself, "" outside it."""
    module, cls = row.get("module"), row.get("module_class")
    if not isinstance(cls, str) or not cls:
        return ""
    return module if isinstance(module, str) and module else ROOT_MODULE


# Display-only abbreviations for op names too long for a table cell.
_ABBREVIATIONS = (("_scaled_dot_product_", "sdpa_"), ("_efficient_attention", "_eff_attn"),
                  ("_flash_attention", "_flash_attn"), ("_for_cpu", "_cpu"))


def short_source(location: str, full: bool) -> str:
    """'pkg/models/x/modeling_x.py:250' -> 'modeling_x.py:250' on narrow terminals."""
    if full or "/" not in location:
        return location
    return location.rsplit("/", 1)[1]


KERNEL_ROW_NOTES = (GRAPH_KERNEL_NOTE, LOOSE_KERNEL_NOTE, GPU_ONLY_NOTE)


def gap_cpu(gap: dict[str, Any]) -> tuple[str, str]:
    """What the CPU did during a GPU idle gap (summary.json idle_gaps): the op it ran, or "before OP" when
    it ran Python between ops (OP: the op it started next); and that op's source line ("" if unknown)."""
    if not gap.get("cpu_op") and gap.get("cpu_next_op"):
        return "before " + op_name({"op": gap["cpu_next_op"]}), str(gap.get("cpu_next_source_location") or "")
    return op_name({"op": gap.get("cpu_op") or "—"}), str(gap.get("cpu_source_location") or "")


def op_name(row: dict[str, Any]) -> str:
    """'aten::_scaled_dot_product_flash_attention_for_cpu' -> 'sdpa_flash_attn_cpu'; a kernel row (a
    kernel no op launched) shows its family and short kernel name."""
    op = str(row.get("op", ""))
    if row.get("note") in KERNEL_ROW_NOTES:
        family = row.get("kernel_family") or "other"
        return f"{family}: {short_kernel_name(op)}"
    name = op.split("::", 1)[1] if op.startswith("aten::") else op
    for long, short in _ABBREVIATIONS:
        name = name.replace(long, short)
    # a compiled graph's range: its 52-character cache key cut like a short git hash (ops.csv has it whole)
    return _COMPILED_GRAPH_CALL.sub(r"CompiledFxGraph \1", name)


_COMPILED_GRAPH_CALL = re.compile(r"^## Call CompiledFxGraph (\w{8})\w* ##$")


# Input dims are a list of shapes (lists of sizes), a tensor list one level deeper. json.loads recurses
# once per level (a cell of 100,000 '[' raised RecursionError), so deeper text is not parsed at all.
MAX_DIMS_DEPTH = 8


def _nested_at_most(text: str, limit: int) -> bool:
    """Whether `text` opens at most `limit` brackets at once (brackets in strings count too; a shape
    list holds no strings). One pass, no recursion."""
    depth = 0
    for ch in text:
        if ch == "[" or ch == "{":
            depth += 1
            if depth > limit:
                return False
        elif ch == "]" or ch == "}":
            depth -= 1
    return True


def op_shapes(row: dict[str, Any]) -> list[str]:
    """The tensor inputs' shapes as '[4,197,768]' (scalars and tensor lists left out); none for a cell
    that is not a list of shapes (an edited run's ops.csv can hold anything)."""
    dims = row.get("input_dims") or ""
    if not isinstance(dims, str) or not dims or dims == "[]" or not _nested_at_most(dims, MAX_DIMS_DEPTH):
        return []
    try:
        parsed = json.loads(dims)
    except ValueError:
        return []
    if not isinstance(parsed, list):
        return []
    return ["[" + ",".join(map(str, d)) + "]" for d in parsed if isinstance(d, list) and d
            and all(isinstance(n, int) and not isinstance(n, bool) for n in d)]


def fit_op(name: str, shapes: list[str], width: int) -> str:
    """The name followed by as many whole shapes as fit in `width` (" …" marks the ones left out)."""
    full = " ".join([name, *shapes])
    if len(full) <= width:
        return full
    text = name
    for shape in shapes:
        if len(text) + len(shape) + 3 > width:  # room for " " + shape + " …"
            break
        text = f"{text} {shape}"
    return text if text == name else f"{text} …"
