"""`opscope analyze TRACE`: the profile pipeline's analysis on a trace recorded elsewhere. No torch."""

from __future__ import annotations

import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from opscope import units
from opscope.analysis.annotations import ANNOTATION_KEY, Block, BlockError, embedded_lines, read_block
from opscope.analysis.capture_merge import merge_capture
from opscope.analysis.pipeline import analyze, prepare_events
from opscope.errors import TraceError
from opscope.machine.peaks import Peaks, apply_overrides, gpu_from_properties, gpu_peaks, unknown_gpu_warning
from opscope.run.model import DEFAULT_REPORTS_DIR, Run
from opscope.run.schema import FORMAT_VERSION
from opscope.run.write import TraceCompressor, check_out_dir, write_run
from opscope.table import Table, nrows
from opscope.trace.kernel_names import architecture_from_kernels, short_kernel_name
from opscope.trace.location import Url
from opscope.trace.reader import TraceData, load_trace, max_trace_bytes, read_bytes
from opscope.version import __version__

UNKNOWN_GPU = "unknown GPU (not recorded in the trace)"


def trace_device(trace: TraceData) -> dict[str, str]:
    """meta.json "device". A GPU's name comes from deviceProperties' "name"; when that is missing or
    empty (vLLM traces), from the rest of deviceProperties (compute capability, SM/CU count, memory),
    then from the kernel-name vocabulary (hipBLASLt's `Cijk_..._ISA942_` -> AMD Instinct gfx942, cuBLAS's
    `sm90_` -> NVIDIA Hopper); "name_source" says which. Never an empty name."""
    if trace.has_gpu or trace.gpu_runtime:
        runtime = trace.gpu_runtime or "cuda"
        name, source = gpu_name(trace, runtime)
        return {"type": runtime, "name": name, "name_source": source}
    return {"type": "cpu", "name": "unknown CPU (not recorded in the trace)"}


def gpu_name(trace: TraceData, runtime: str) -> tuple[str, str]:
    props = _device_props(trace)
    name = props.get("name")
    if isinstance(name, str) and name.strip():
        return name.strip(), "deviceProperties"
    known = gpu_from_properties(props, runtime)
    if known is not None:
        return known[0], f"deviceProperties without a name: {known[1]}"
    arch = architecture_from_kernels(list(trace.kernels["name"])) if nrows(trace.kernels) else None
    if arch is not None:
        return arch[0], f"kernel names (e.g. {short_kernel_name(arch[1])})"
    return UNKNOWN_GPU, "none"


def _device_props(trace: TraceData) -> dict[str, Any]:
    """The deviceProperties entry of the device most kernels ran on (by "id"), else the first."""
    props = trace.device_properties
    if not props:
        return {}
    if len(props) > 1 and nrows(trace.kernels):
        device = _mode(trace.kernels["device"])
        for p in props:
            if p.get("id") == device:
                return p
    return props[0]


def _mode(values: list[int]) -> int:
    """The most frequent value, the smallest of those tied (pandas' Series.mode().iloc[0])."""
    counts = Counter(values)
    most = max(counts.values())
    return int(min(v for v, c in counts.items() if c == most))


def trace_peaks(trace: TraceData, device: dict[str, str], peak_bw: float | None, peak_flops: list[str] | None,
                warn: Callable[[str], None]) -> Peaks:
    peaks: Peaks | None = None
    overridden = bool(peak_bw) and bool(peak_flops)
    if device["type"] in ("cuda", "rocm"):
        peaks = gpu_peaks(device["name"])
        if peaks is None and not overridden:
            warn(unknown_gpu_warning(device["name"]))
    elif not overridden:
        from opscope.machine.calibrate import cached_cpu_peaks

        peaks = cached_cpu_peaks(warn)
        if peaks is None:
            warn("CPU trace: the recording machine's ceilings are unknown and this machine has no cached "
                 "calibration; pass --peak-bw/--peak-flops (or run `opscope calibrate`) for % of peak and bound")
        else:
            warn("CPU trace: using this machine's cached calibration as the ceilings (the trace does not say "
                 "which CPU recorded it); pass --peak-bw/--peak-flops for another machine")
    return apply_overrides(peaks, peak_bw, peak_flops)


def _embedded(trace: TraceData, warn: Callable[[str], None]) -> Block | None:
    """The lines, modules and memory `opscope profile` embedded in its saved trace, if any (read_block)."""
    if trace.opscope_block is None:
        return None
    try:
        embedded = read_block(trace.opscope_block)
    except BlockError as exc:
        warn(f"{trace.path}: ignored its {ANNOTATION_KEY!r} block ({exc}); source lines and modules come from "
             "the trace's own events")
        return None
    warn(f"{trace.path}: saved by `opscope profile`: using the exact source lines, modules and memory it embedded")
    return embedded


def trace_events(path: Path, torch_trace: Path | None = None) -> tuple[TraceData, Table]:
    """A saved trace read again and its event table, exactly as `opscope analyze` builds it (the source
    lines and modules `opscope profile` embedded, compiled code placed with the run's TORCH_TRACE log):
    what opscope.analysis.whatif replays."""
    from opscope.trace.torch_trace import read_torch_trace

    trace = load_trace(path, max_bytes=max_trace_bytes(None))
    embedded = _embedded(trace, lambda m: None)
    log = read_torch_trace(torch_trace) if torch_trace is not None else None
    if embedded is None:
        ev, _, _ = prepare_events(trace, None, None, log, None)
    else:
        by_ext, classes, _memory = embedded
        ev, _, _ = prepare_events(trace, lambda e: embedded_lines(by_ext, e), classes, log, None)
    return trace, ev


def analyze_trace_file(path: Path | Url, *, out: Path | None = None, peak_bw: float | None = None,
                       peak_flops: list[str] | None = None, warn: Callable[[str], None] = lambda m: None,
                       max_trace_gb: float | None = None, capture: Path | None = None,
                       measure: Callable[[Run], dict[str, Path]] | None = None,
                       finish: Callable[[Run, TraceData], None] | None = None,
                       torch_trace: Path | None = None, inductor_cache: Path | None = None,
                       on_events: Callable[[int], None] | None = None, keep_tables: bool = True) -> Run:
    """Analyzes a trace file into a run directory; `on_events(n)` hears the events decoded so far.
    `keep_tables`: the run keeps the event table and the trace's kernels (Run.events, Run.kernels; always
    with `measure` or `finish`, which read them); without, they are freed as the analysis goes.
    `torch_trace`, `inductor_cache`: a compiled model's
    TORCH_TRACE log and inductor cache directory (opscope.analysis.compiled). `capture`: a trace recorded while the replayed CUDA/HIP
    graphs were captured (opscope.analysis.capture_merge). `measure(run)` (opscope analyze --nsys/--ncu)
    attaches measurements to the analyzed run before it is written and returns the extra files to put in
    the run directory. `finish(run, trace)` runs last before the run is written (a rank of a
    multi-process job adds its numbers: opscope.analysis.ranks)."""
    base = DEFAULT_REPORTS_DIR.absolute()
    out = out.absolute() if out is not None else None
    check_out_dir(out, base)
    limit = max_trace_bytes(max_trace_gb)
    stem = path.name.split(".")[0] or "trace"
    folder = out.parent if out is not None else base
    compressor: TraceCompressor | None = None
    raw_copy: IO[bytes] | None = None
    try:
        if isinstance(path, Path) and path.is_file():
            # read twice, at once: gzipped into the run by the compressor, and decoded as it streams in
            compressor = TraceCompressor(path, folder)
            trace = load_trace(path, max_bytes=limit, on_events=on_events)
        elif isinstance(path, Url):
            # decoded as it streams in, its bytes kept as they come (the run's copy: not fetched twice)
            raw_copy = tempfile.NamedTemporaryFile(prefix="opscope-url-", suffix=".trace")  # noqa: SIM115
            trace = load_trace(path, max_bytes=limit, on_events=on_events, copy=raw_copy)
            raw_copy.flush()
            compressor = TraceCompressor(Path(raw_copy.name), folder)
        else:
            # a pipe is read once: its bytes are gzipped into the run from memory
            data = read_bytes(path, limit)
            compressor = TraceCompressor(path, folder, data=data)
            trace = load_trace(path, data=data)
            del data  # the decoded tables replace it (the compressor keeps its own reference)
        for line in trace.warnings:
            warn(line)
        merged = None
        if capture is not None:
            captured = load_trace(capture, max_bytes=max_trace_bytes(max_trace_gb))
            for line in captured.warnings:
                warn(line)
            trace, report = merge_capture(trace, captured)
            for line in report.warnings:
                warn(line)
            merged = {"trace": str(capture), **report.to_json()}
        return _analyze_file(path, trace, out, base, stem, compressor, peak_bw, peak_flops, warn, merged,
                             measure, finish, torch_trace=torch_trace, inductor_cache=inductor_cache,
                             keep_tables=keep_tables or measure is not None or finish is not None)
    finally:
        if compressor is not None:
            compressor.discard()
        if raw_copy is not None:
            raw_copy.close()  # removes it


def _analyze_file(path: Path | Url, trace: TraceData, out: Path | None, base: Path, stem: str,
                  compressor: TraceCompressor,
                  peak_bw: float | None, peak_flops: list[str] | None, warn: Callable[[str], None],
                  capture: dict[str, Any] | None = None,
                  measure: Callable[[Run], dict[str, Path]] | None = None,
                  finish: Callable[[Run, TraceData], None] | None = None, *,
                  torch_trace: Path | None = None, inductor_cache: Path | None = None, keep_tables: bool = True) -> Run:
    device = trace_device(trace)
    peaks = trace_peaks(trace, device, peak_bw, peak_flops, warn)
    meta = trace_meta(path, trace, device, peaks)
    if capture is not None:
        meta["capture"] = capture
    if torch_trace is not None:
        meta["torch_trace"] = str(torch_trace)
    if inductor_cache is not None:
        meta["inductor_cache"] = str(inductor_cache)
    embedded = _embedded(trace, warn)
    if embedded is None:
        run = analyze(trace, peaks=peaks, meta=meta, source="trace", torch_trace=torch_trace,
                      inductor_cache=inductor_cache, keep_tables=keep_tables)
    else:
        by_ext, classes, memory = embedded
        run = analyze(trace, peaks=peaks, meta=meta, source="trace", module_classes=classes, memory=memory,
                      source_override=lambda ev: embedded_lines(by_ext, ev), torch_trace=torch_trace,
                      inductor_cache=inductor_cache, keep_tables=keep_tables)
    if not nrows(run.ops):
        raise TraceError(no_rows_message(trace))
    meta["steps"] = run.summary["steps"]
    if run.summary.get("step_source") == "whole trace":
        warn(f"{trace.path} has no ProfilerStep#N annotations (torch.profiler's schedule, or record_function"
             f"(\"ProfilerStep#N\") around each step), so opscope counts it as one step: from its first op to its "
             f"last op or kernel ({units.duration(run.summary['step_time_us'])}); per-step numbers are for the whole trace")
    extra = measure(run) if measure is not None else None
    if finish is not None:
        finish(run, trace)
    write_run(run, out, stem, None if isinstance(path, Url) else path, compressor=compressor, base=base, extra_files=extra)
    return run


def no_rows_message(trace: TraceData) -> str:
    """Why a trace gives no ops.csv row: its CPU events are all labels, none a registered op."""
    names = list(dict.fromkeys(trace.ops["name"]))
    shown = ", ".join(repr(str(n)[:40]) for n in names[:3]) + (", ..." if len(names) > 3 else "")
    return (f"{trace.path} has no operator rows: none of its {nrows(trace.ops)} CPU events ({shown}) is a "
            "registered op (`ns::op`, such as aten::mm) and it has no GPU kernels; nothing to analyze (record "
            "the model's ops with torch.profiler's CPU activity)")


def trace_meta(path: Path | Url, trace: TraceData, device: dict[str, str], peaks: Peaks) -> dict[str, Any]:
    """meta.json of an analyzed trace ("dtype", "mode" and "steps" are filled in by the analysis)."""
    return {
        "format_version": FORMAT_VERSION,
        "opscope_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "source": "trace",
        "target": path.shown if isinstance(path, Url) else os.path.normpath(path),
        "torch_version": trace.torch_version,
        "device": device,
        "dtype": None,
        "mode": "unknown",
        "steps": None,
        "peaks": peaks.to_json(),
    }
