"""trace -> events -> ops table -> findings -> Run. Shared by `opscope profile` and `opscope analyze`
so that a profile run and an analyzed trace go through exactly the same numbers."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from opscope.analysis.compiled import place_compiled
from opscope.analysis.events import SourceOverride, build_events
from opscope.analysis.fixes import assign_ids
from opscope.analysis.gpu_timeline import clip, gpu_summary, step_windows
from opscope.analysis.memory import MemoryProfile, add_memory_columns, memory_profile
from opscope.analysis.modules import finding_modules, module_table
from opscope.analysis.ops_table import BOUNDS, JSON_TEXT_COLUMNS, build_ops_table, event_costs
from opscope.analysis.timeline import build_timeline, row_step_times
from opscope.analysis.whatif import run_whatif
from opscope.findings import Context, run_rules
from opscope.findings.base import DtypeProbe, LayoutProbe
from opscope.findings.compiled import first_line
from opscope.findings.graph_break import broken_frames
from opscope.findings.recompile import failed_guard
from opscope.machine.noise import step_spread, unknown
from opscope.machine.peaks import Peaks
from opscope.run.compare import COMPILE_WRAPPER, module_key
from opscope.run.model import Run
from opscope.run.schema import FORMAT_VERSION
from opscope.table import Table, compact, group_sums, mean, nrows, pairwise_sum, records, take
from opscope.trace.reader import TraceData, no_gc
from opscope.trace.torch_trace import TorchTraceLog, read_torch_trace

# A trace recorded elsewhere says nothing about what else ran on its machine.
TRACE_NOISE_REASON = "a trace recorded elsewhere: other processes' CPU use on its machine is not known"
# ... nor how a bundled kernel would do there: only profile times the candidates (opscope.kernels.incontext)
TRACE_KERNELS_REASON = "a trace analyzed, not profiled here: the kernels were not timed on its shapes"

# profile's in-context timing of the swap candidates: (candidates, ops table, steps) -> the candidates measured
KernelTimer = Callable[[list[dict[str, Any]], Table, int], list[dict[str, Any]]]


def analyze(trace: TraceData, *, peaks: Peaks, meta: dict[str, Any], source: str,
            source_override: SourceOverride | None = None,
            layout_probe: LayoutProbe | None = None, dtype_probe: DtypeProbe | None = None,
            module_classes: dict[str, str] | None = None, memory: MemoryProfile | None = None,
            noise: dict[str, Any] | None = None, step_us: list[float] | None = None,
            torch_trace: Path | None = None, inductor_cache: Path | None = None,
            kernel_timer: KernelTimer | None = None, keep_tables: bool = True) -> Run:
    """`module_classes`: qualified module name -> class for every module of the model (profile), so
    modules.csv can name modules that issued no op of their own. `memory`: profile's untimed memory
    pass; without it, the trace's own memory events (if it has any) are read. `noise`:
    opscope.machine.noise.assess() of the timed pass (profile), else "unknown"; `step_us`: each step's measured
    wall time (profile), else the ProfilerStep annotations' durations are used. `torch_trace`: the
    compiled model's TORCH_TRACE log (opscope.trace.torch_trace); `inductor_cache`: inductor's cache
    directory of the recording machine (its generated kernels), both for compiled code (analysis.compiled).
    `kernel_timer`: profile's in-context timing of the swap candidates (opscope.kernels.incontext.measure);
    without it every candidate is "not measured here". `keep_tables`: the run keeps the event table and the
    trace's kernels (Run.events, Run.kernels); without, the event table's columns and the trace's tables are
    freed as soon as nothing later reads them (release_tables: a large trace's peak memory), the steps
    excepted."""
    log = read_torch_trace(torch_trace) if torch_trace is not None else None
    with no_gc():
        return _analyze(trace, peaks=peaks, meta=meta, source=source, source_override=source_override,
                        layout_probe=layout_probe, dtype_probe=dtype_probe, module_classes=module_classes,
                        memory=memory, noise=noise or unknown(TRACE_NOISE_REASON), step_us=step_us,
                        log=log, inductor_cache=inductor_cache, kernel_timer=kernel_timer, keep_tables=keep_tables)


def _analyze(trace: TraceData, *, peaks: Peaks, meta: dict[str, Any], source: str,
             source_override: SourceOverride | None, layout_probe: LayoutProbe | None,
             dtype_probe: DtypeProbe | None, module_classes: dict[str, str] | None,
             memory: MemoryProfile | None, noise: dict[str, Any], step_us: list[float] | None,
             log: TorchTraceLog | None, inductor_cache: Path | None, kernel_timer: KernelTimer | None,
             keep_tables: bool) -> Run:
    ev, classes, renamed = prepare_events(trace, source_override, module_classes, log, inductor_cache)
    gpu = trace.has_gpu
    if renamed:
        module_classes = classes
    if source == "trace":
        meta["dtype"] = dominant_dtype(ev)
        meta["mode"] = trace_mode(ev)
    # the very column (compact, never written in place): a list of it held a pointer per event
    ev["time_us"] = ev["device_us"] if gpu else ev["self_us"]
    ops = build_ops_table(ev, gpu=gpu, peaks=peaks, kernels=trace.kernels, windows=step_windows(trace))
    if memory is None:
        memory = memory_profile(trace, ev, "trace")
    ops = add_memory_columns(ops, memory)
    steps, step_time_us = step_stats(trace, ev)
    busy = device_busy_share(trace, steps, step_time_us) if gpu else None
    candidates = measured_candidates(ops, steps, kernel_timer)
    timeline = gpu_summary(trace, ev, steps=steps, step_time_us=step_time_us) if gpu else None
    ctx = Context(ops=ops, events=ev, peaks=peaks, gpu=gpu, source=source, steps=steps,
                  step_time_us=step_time_us, device_busy_share=busy, meta=meta, layout_probe=layout_probe,
                  gpu_timeline=timeline, dtype_probe=dtype_probe, memory=memory, noise=noise, compile_log=log,
                  kernel_speedups={c["kernel"]: c.get("measured_speedup") for c in candidates})
    findings = run_rules(ctx)
    ctx.cache.clear()  # the rules' per-event structures (children, rows' events): not the what-if's peak
    finding_modules(findings, ops)
    assign_ids(findings)  # the timeline names them; the what-if, the last to read the events, adds its savings
    timeline_file = build_timeline(trace, ev, ops, findings, memory)
    measured_steps = step_us is not None  # a profile timed each step itself: kept as samples (opscope gate)
    op_step_times = row_step_times(trace, ev, ops) if measured_steps else None
    release = None
    if not keep_tables and nrows(ops):  # (without rows, the caller's message reads the trace's ops)
        def release(keep: Mapping[str, Sequence[str]] | None) -> None:
            release_tables(trace, ev, keep)
    whatif, whatif_file = run_whatif(trace, ev, findings, peaks=peaks, gpu=gpu, step_time_us=step_time_us,
                                     release=release)
    if step_us is None:
        step_us = list(trace.steps["dur"]) if nrows(trace.steps) else [step_time_us]
    summary = summarize(ops, steps=steps, step_time_us=step_time_us, n_findings=len(findings), busy=busy,
                        step_us=step_us, noise=noise, gpu_keys=timeline, compile_log=ctx.compile_log,
                        candidates=candidates)
    if measured_steps:
        summary["step_times_us"] = [float(t) for t in step_us[:MAX_STEP_SAMPLES]]
        summary["op_step_times_us"] = op_step_times
    if memory is not None:
        summary["memory"] = memory.summary
    summary["step_source"] = "annotations" if nrows(trace.steps) else "whole trace"
    summary["whatif"] = whatif
    return Run(meta=meta, ops=ops, findings=findings, summary=summary, events=ev if keep_tables else None,
               kernels=trace.kernels if keep_tables else None,
               modules=module_table(ops, findings, module_classes or trace.module_classes), whatif=whatif_file,
               timeline=timeline_file)


def release_tables(trace: TraceData, ev: Table, keep: Mapping[str, Sequence[str]] | None) -> None:
    """Frees what a run that does not keep its tables (analyze(keep_tables=False)) no longer reads: every
    column of the event table, the trace's launches and kernels but `keep`'s ({"events" | "launches" |
    "kernels": its columns}: what the what-if graph is built from, opscope.analysis.replay_graph.READS), and
    the trace's other tables but its steps. In place: the caller's (and the findings' Context's) tables are
    these very dicts. A column the event table shares with the trace's ops lives on while one of them holds
    it."""
    kept = keep or {}
    for table, name in ((ev, "events"), (trace.launches, "launches"), (trace.kernels, "kernels")):
        for column in [c for c in table if c not in kept.get(name, ())]:
            del table[column]
    for table in (trace.ops, trace.python, trace.modules, trace.memory, trace.annotations):
        table.clear()


def prepare_events(trace: TraceData, source_override: SourceOverride | None, module_classes: dict[str, str] | None,
                   log: TorchTraceLog | None, inductor_cache: Path | None) -> tuple[Table, dict[str, str], bool]:
    """The event table the findings read: build_events, costs, module names as in the user's module, and
    compiled code placed. Returns (events, module classes, whether the classes were renamed)."""
    compact(trace.ops)  # before the event table is built beside it
    ev = build_events(trace, source_override)
    ev.update(event_costs(ev))
    classes = module_classes or trace.module_classes
    renamed = False
    if any(m == COMPILE_WRAPPER or m.startswith(COMPILE_WRAPPER + ".") for m in classes):
        # torch.compile's wrapper (an OptimizedModule holding the user's module as `_orig_mod`): modules are
        # named as in the user's own module, never after the wrapper
        keys: dict[str, str] = {}  # one string per distinct module, not per event
        ev["module"] = [keys[m] if m in keys else keys.setdefault(m, module_key(m)) for m in ev["module"]]
        classes = {module_key(k): v for k, v in classes.items() if not (k == "" and v == "OptimizedModule")}
        renamed = True
    place_compiled(ev, log, inductor_cache=inductor_cache, module_classes=classes, gpu=trace.has_gpu)
    compact_columns(trace, ev)
    return ev, classes, renamed


def compact_columns(trace: TraceData, ev: Table) -> None:
    """The event table's own columns, and the trace's memory and Python tables, compacted
    (opscope.table.compact: Coded or Packed) once every stage that writes them is done. The columns the
    event table shares with trace.ops were compacted before it was built, and are left as they are."""
    compact(ev)
    for table in (trace.memory, trace.python):
        if table:
            compact(table)


# The most per-step wall times summary.json keeps (step_times_us): samples for opscope gate, bounded in size.
MAX_STEP_SAMPLES = 1000


def step_stats(trace: TraceData, ev: Table) -> tuple[int, float]:
    """(number of ProfilerStep#N annotations, their mean wall time); without annotations one step
    spanning every op and kernel."""
    if nrows(trace.steps):
        return nrows(trace.steps), mean(trace.steps["dur"])
    ts, end = ev["ts"], ev["end"]
    if "captured" in ev:  # copies of a graph capture's ops did not run in this trace
        ran = [i for i, c in enumerate(ev["captured"]) if not c]
        ts, end = [ts[i] for i in ran], [end[i] for i in ran]
    starts = [_nanmin(ts)] if ts else []  # a GPU-only trace has no CPU events
    ends = [_nanmax(end)] if end else []
    k = trace.kernels
    if nrows(k):
        starts.append(_nanmin(k["ts"]))
        ends.append(_nanmax([t + d for t, d in zip(k["ts"], k["dur"], strict=True)]))
    return 1, float(max(ends) - min(starts))


def _nanmin(values: Sequence[float]) -> float:
    return min((v for v in values if v == v), default=math.nan)


def _nanmax(values: Sequence[float]) -> float:
    return max((v for v in values if v == v), default=math.nan)


def device_busy_share(trace: TraceData, steps: int, step_time_us: float) -> float | None:
    """Union of kernel intervals inside the profiled steps over their wall time (capped at 1): kernel
    time before the first step or after the last (a GPU running behind the CPU) is not the steps'."""
    k = trace.kernels
    if not nrows(k) or step_time_us <= 0:
        return None
    start = k["ts"]
    busy = union_length(*clip(start, [s + d for s, d in zip(start, k["dur"], strict=True)], step_windows(trace)))
    return float(min(busy / (steps * step_time_us), 1.0))


def union_length(start: Sequence[float], end: Sequence[float]) -> float:
    """Total length of the union of the intervals [start, end)."""
    if not len(start):
        return 0.0
    order = sorted(range(len(start)), key=start.__getitem__)
    busy, cur_s, cur_e = 0.0, float(start[order[0]]), float(end[order[0]])
    for i in order[1:]:
        s, e = float(start[i]), float(end[i])
        if s > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    return float(busy + cur_e - cur_s)


def summarize(ops: Table, *, steps: int, step_time_us: float, n_findings: int,
              busy: float | None, step_us: list[float] | None = None, noise: dict[str, Any] | None = None,
              gpu_keys: dict[str, Any] | None = None, compile_log: TorchTraceLog | None = None,
              candidates: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """summary.json from the ops table. `step_us`: each step's wall time (default: one step of `step_time_us`); `noise`:
    opscope.machine.noise.assess() of the timed pass (default: unknown, as for a file recorded elsewhere);
    `compile_log`: a compiled model's TORCH_TRACE log, whose compile times become "compile"; `candidates`: the
    swap candidates (default: those of `ops`, not measured here)."""
    times = [float(t) for t in ops["time_us_total"]]
    # pandas' sums, so that the shares stay the same to the last bit
    total = pairwise_sum(times)
    covered = [t for t, f, b in zip(times, ops["flops_per_call"], ops["bytes_per_call"], strict=True)
               if _present(f) and _present(b)]
    bound_share = {b: 0.0 for b in BOUNDS}
    for b, t in sorted(group_sums(ops["bound"], times).items()):
        bound_share[b] = t / total if total > 0 else 0.0
    summary: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "total_time_us": total,
        "steps": int(steps),
        "step_time_us": float(step_time_us),
        **step_spread(step_us if step_us is not None else [step_time_us]),
        "noise": noise or unknown(TRACE_NOISE_REASON),
        "ops_covered_time_share": pairwise_sum(covered) / total if total > 0 else 0.0,
        "bound_time_share": bound_share,
        "findings": int(n_findings),
        "top_ops": top_ops(ops, 10),
    }
    if busy is not None:
        summary["device_busy_share"] = busy
    summary["swap_candidates"] = candidates if candidates is not None else measured_candidates(ops, steps, None)
    summary.update(gpu_keys or {})  # opscope.analysis.gpu_timeline: kernel families, graph replay, streams, gaps
    if compile_log is not None:
        summary["compile"] = compile_summary(compile_log)
    return summary


def compile_summary(log: TorchTraceLog) -> list[dict[str, Any]]:
    """summary.json "compile": one entry per frame compilation dynamo recorded, in log order: the frame, the
    compile time (the frame's, plus its backward graph's when that compiled later), inductor's share of it,
    the graph breaks in it, the guard that failed when it is a recompilation, and why it failed, if it
    did. Compile time, apart from the steps' time."""
    backward: dict[str, tuple[float, float]] = {}
    for b in log.backward_metrics:
        seconds, inductor_s = backward.get(b.compile_id, (0.0, 0.0))
        backward[b.compile_id] = (seconds + (b.duration_s or 0.0), inductor_s + (b.inductor_compile_time_s or 0.0))
    breaks = Counter(broken_frames(log))
    out = []
    for m in log.metrics:
        frame = m.entire_frame_compile_time_s if m.entire_frame_compile_time_s is not None else m.duration_s
        bwd, bwd_inductor = backward.get(m.compile_id, (0.0, 0.0))
        inductor = m.inductor_compile_time_s
        out.append({
            "compile_id": m.compile_id, "co_name": m.co_name or None, "co_filename": m.co_filename or None,
            "line": m.co_firstlineno or None,
            "compile_time_s": frame + bwd if frame is not None else None,
            "inductor_time_s": inductor + bwd_inductor if inductor is not None else None,
            "graph_breaks": breaks.get(m.compile_id, 0),
            "recompile": failed_guard(m.recompile_reason) if m.attempt > 0 and m.recompile_reason else None,
            "failed": first_line(f"{m.fail_type}: {m.fail_reason}" if m.fail_reason else m.fail_type) or None,
        })
    return out


def _present(x: Any) -> bool:
    """pandas' notna for one value."""
    return x is not None and x == x



def swap_candidates(ops: Table) -> list[dict[str, Any]]:
    """The bundled kernels that could replace ops of the run (opscope.kernels.catalog.candidates); empty when
    the manifests cannot be read (that is `opscope kernels`' error to report, not the analysis')."""
    from opscope.errors import OpscopeError
    from opscope.kernels.catalog import candidates

    try:
        return candidates(ops)
    except OpscopeError:
        return []


def measured_candidates(ops: Table, steps: int, timer: KernelTimer | None) -> list[dict[str, Any]]:
    """The swap candidates, timed in context by `timer` (profile), else each "not measured here"."""
    from opscope.kernels.incontext import not_measured

    found = swap_candidates(ops)
    return timer(found, ops, steps) if timer is not None else not_measured(found, TRACE_KERNELS_REASON)


def top_ops(ops: Table, n: int) -> list[dict[str, Any]]:
    """First n rows of the ops table as objects: numbers as numbers, empty as null, JSON-text columns kept
    as text."""
    out = []
    for rec in records(take(ops, range(min(n, nrows(ops))))):
        row = {}
        for k, v in rec.items():
            if isinstance(v, float) and v != v or isinstance(v, str) and v == "" and k not in JSON_TEXT_COLUMNS and k != "source_location":
                v = None
            elif hasattr(v, "item"):
                v = v.item()
            row[k] = v
        out.append(row)
    return out


def dominant_dtype(ev: Any) -> str | None:
    """The most common floating dtype among row ops (meta.json 'dtype' for traces); None when most rows record
    none (a CUDA-graph replay's kernel rows: the few CPU-side ops that do would name the run's dtype)."""
    rows = 0
    counts: Counter[str] = Counter()
    for d, row in zip(ev["dtype"], ev["is_row"], strict=True):
        if row:
            rows += 1
            if d:
                counts[d] += 1
    if not counts or 2 * sum(counts.values()) < rows:
        return None
    return counts.most_common(1)[0][0]


def trace_mode(ev: Any) -> str:
    backward = any(isinstance(name, str) and (name.startswith("autograd::engine::evaluate_function")
                                              or name.endswith("_backward")) for name in ev["name"])
    return "train" if backward else "inference"
