"""`opscope analyze TRACE`: the profile pipeline's analysis on a trace recorded elsewhere. No torch."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opscope import __version__
from opscope.analysis.pipeline import analyze
from opscope.hardware import Peaks, apply_overrides, gpu_peaks, unknown_gpu_warning
from opscope.run import DEFAULT_REPORTS_DIR, Run, TraceCompressor, check_out_dir, write_run
from opscope.trace import TraceData, load_trace, max_trace_bytes, read_bytes


def trace_device(trace: TraceData) -> dict[str, str]:
    if trace.has_gpu or trace.gpu_runtime:
        props = trace.device_properties[0] if trace.device_properties else {}
        return {"type": trace.gpu_runtime or "cuda", "name": str(props.get("name", "unknown GPU"))}
    return {"type": "cpu", "name": "unknown CPU (not recorded in the trace)"}


def trace_peaks(trace: TraceData, device: dict[str, str], peak_bw: float | None, peak_flops: list[str] | None,
                warn: Callable[[str], None]) -> Peaks:
    peaks: Peaks | None = None
    overridden = bool(peak_bw) and bool(peak_flops)
    if device["type"] in ("cuda", "rocm"):
        peaks = gpu_peaks(device["name"])
        if peaks is None and not overridden:
            warn(unknown_gpu_warning(device["name"]))
    elif not overridden:
        from opscope.calibrate import cached_cpu_peaks

        peaks = cached_cpu_peaks()
        if peaks is None:
            warn("CPU trace: the recording machine's ceilings are unknown and this machine has no cached "
                 "calibration; pass --peak-bw/--peak-flops (or run `opscope calibrate`) for % of peak and bound")
        else:
            warn("CPU trace: using this machine's cached calibration as the ceilings (the trace does not say "
                 "which CPU recorded it); pass --peak-bw/--peak-flops for another machine")
    return apply_overrides(peaks, peak_bw, peak_flops)


def analyze_trace_file(path: Path, *, out: Path | None = None, peak_bw: float | None = None,
                       peak_flops: list[str] | None = None, warn: Callable[[str], None] = lambda m: None,
                       max_trace_gb: float | None = None,
                       measure: Callable[[Run], dict[str, Path]] | None = None) -> Run:
    """Analyzes a torch.profiler trace into a run directory. `measure(run)` (opscope analyze --nsys/--ncu)
    attaches measurements to the analyzed run before it is written and returns the extra files to put in
    the run directory."""
    base = DEFAULT_REPORTS_DIR.absolute()
    out = out.absolute() if out is not None else None
    check_out_dir(out, base)
    data = read_bytes(path, max_trace_bytes(max_trace_gb))  # once: `path` may be a pipe
    stem = path.name.split(".")[0] or "trace"
    folder = out.parent if out is not None else base
    compressor: TraceCompressor | None = None
    try:
        compressor = TraceCompressor(path, folder, data=None if path.is_file() else data)
        trace = load_trace(path, data=data)
        del data  # the decoded tables replace it (the compressor keeps its own reference if it needs one)
        for line in trace.warnings:
            warn(line)
        return _analyze_file(path, trace, out, base, stem, compressor, peak_bw, peak_flops, warn, measure)
    finally:
        if compressor is not None:
            compressor.discard()


def _analyze_file(path: Path, trace: TraceData, out: Path | None, base: Path, stem: str,
                  compressor: TraceCompressor,
                  peak_bw: float | None, peak_flops: list[str] | None, warn: Callable[[str], None],
                  measure: Callable[[Run], dict[str, Path]] | None = None) -> Run:
    device = trace_device(trace)
    peaks = trace_peaks(trace, device, peak_bw, peak_flops, warn)
    meta = trace_meta(path, trace, device, peaks)
    run = analyze(trace, peaks=peaks, meta=meta, source="trace")
    meta["steps"] = run.summary["steps"]
    extra = measure(run) if measure is not None else None
    write_run(run, out, stem, path, compressor=compressor, base=base, extra_files=extra)
    return run


def trace_meta(path: Path, trace: TraceData, device: dict[str, str], peaks: Peaks) -> dict[str, Any]:
    """meta.json of an analyzed trace ("dtype", "mode" and "steps" are filled in by the analysis)."""
    return {
        "format_version": 1,
        "opscope_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "source": "trace",
        "target": str(path),
        "torch_version": trace.torch_version,
        "device": device,
        "dtype": None,
        "mode": "unknown",
        "steps": None,
        "peaks": peaks.to_json(),
    }
