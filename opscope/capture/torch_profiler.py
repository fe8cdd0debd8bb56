"""`opscope profile`: warm up, one lean timed pass under torch.profiler, then untimed passes for what
timing does not need (exact source lines and modules; memory), then the shared analysis pipeline.

The timed pass records shapes only (no stacks, no memory, no perf counters) so its per-step time stays
within a few percent of a bare `torch.profiler.profile(record_shapes=True)`; see benchmarks/.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from opscope import units
from opscope.analysis.annotations import embed, make_block
from opscope.analysis.events import build_events
from opscope.analysis.memory import MemoryProfile, memory_profile
from opscope.analysis.pipeline import analyze
from opscope.capture.compiled import (
    CompileInfo,
    TorchTraceLog,
    dynamo_compiled,
    dynamo_frames,
    dynamo_ok_frames,
    kept_log,
    warmup_steps,
)
from opscope.capture.dtype_probe import float32_probe
from opscope.capture.harness import Harness, process_state_kept, resolve_device
from opscope.capture.kernel_timing import kernel_timer_for
from opscope.capture.layout_probe import layout_probe_for
from opscope.capture.lines import LineRecord, join_lines, module_classes, module_origins, record_lines
from opscope.capture.nvtx_ranges import module_ranges, step_range
from opscope.capture.options import Progress
from opscope.errors import OpscopeError, TargetError
from opscope.machine.noise import MIN_WINDOW_S, CpuSample, CpuSampler, other_cores, window_noise
from opscope.machine.peaks import Peaks, apply_overrides, gpu_peaks, unknown_gpu_warning
from opscope.machine.threads import busy, idle_threads, scaled_calibration
from opscope.run.model import DEFAULT_REPORTS_DIR, Run
from opscope.run.schema import FORMAT_VERSION
from opscope.run.write import check_out_dir, write_run
from opscope.target.model_file import Target, load_target
from opscope.target.specs import ProfileOptions
from opscope.trace.reader import NothingRecorded, TraceData, load_trace
from opscope.version import __version__


@dataclass
class ProfileTimings:
    """Seconds spent in each phase (the benchmark reads these)."""

    load: float = 0.0
    warmup: float = 0.0
    first_step: float = 0.0  # the first warm-up step (a compiled model compiles in it)
    timed: float = 0.0
    timed_step_s: float = 0.0
    export: float = 0.0
    calibration: float = 0.0
    lines: float = 0.0
    memory: float = 0.0
    analysis: float = 0.0


def _validate(opts: ProfileOptions) -> None:
    if opts.steps < 1:
        raise OpscopeError("--steps must be at least 1")
    if opts.warmup < 0:
        raise OpscopeError("--warmup must be 0 or more")
    if opts.threads is not None and opts.threads < 1:
        raise OpscopeError("--threads must be at least 1")
    if opts.dtype not in (None, "float32", "bfloat16", "float16"):
        raise OpscopeError(f"--dtype must be float32, bfloat16 or float16; got {opts.dtype!r}")


def cpu_name() -> str:
    from opscope.machine.calibrate import cpu_model_name

    return cpu_model_name()


def choose_threads(opts: ProfileOptions, device: torch.device, sampler: CpuSampler,
                   since: CpuSample) -> dict[str, Any] | None:
    """Before the timed steps: the cores other processes used since `since` (a window widened to
    noise.MIN_WINDOW_S by an idle wait) and, on a CPU run without --threads, torch's thread count set so
    that torch does not oversubscribe the cores left (opscope.machine.threads). Returns meta.json's
    "threads_chosen" entry ({"threads", "default", "other_cores", "cores", "set"}); None for a GPU run."""
    if device.type != "cpu":
        return None
    end = sampler.sample()
    if end.wall_s - since.wall_s < MIN_WINDOW_S:
        time.sleep(since.wall_s + MIN_WINDOW_S - end.wall_s)
        end = sampler.sample()
    others = other_cores(since, end)
    default = torch.get_num_threads()
    chosen = default if opts.threads else idle_threads(others, sampler.cores, default)
    if chosen != default:  # said in the run's header (not on stderr: an error later must stay one line)
        torch.set_num_threads(chosen)
    return {"threads": chosen, "default": default, "cores": sampler.cores, "set": "--threads" if opts.threads else
            ("fewer, for other processes" if chosen != default else "default"),
            "other_cores": None if others is None else round(others, 3)}


def machine_peaks(opts: ProfileOptions, device: torch.device, progress: Progress,
                  threads_chosen: dict[str, Any] | None = None) -> tuple[Peaks, dict[str, Any] | None]:
    """The ceilings, and for a measured CPU calibration meta.json's "calibration" entry. On a busy machine
    (`threads_chosen`'s other cores) a thread count without a cached calibration reuses the cached quiet
    one of another thread count, scaled (opscope.machine.threads), rather than measuring under load."""
    calibration = None
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peaks = gpu_peaks(name)
        if peaks is None and not (opts.peak_bw and opts.peak_flops):
            progress.warn(unknown_gpu_warning(name))
    else:
        if opts.peak_bw and opts.peak_flops:
            peaks = None  # fully overridden: no need to measure
        else:
            from opscope.machine.calibrate import cpu_model_name, load, obtain

            n = torch.get_num_threads()
            others = (threads_chosen or {}).get("other_cores")
            cores = int((threads_chosen or {}).get("cores") or 0)
            scaled = None
            if busy(others, cores, n) and load(n) is None:
                scaled = scaled_calibration(n, cpu_model_name(), str(torch.__version__))
            if scaled is not None:
                peaks = scaled.peaks
                calibration = {"stable": True, "cached": True, "quick": scaled.result.quick, "scaled": True}
                progress.warn(f"the machine is busy (other processes use {others:.2f} of {cores} cores): "
                              f"reusing the calibration measured on {units.count(scaled.result.threads, 'thread')} on a quiet "
                              f"machine, GEMM FLOP/s scaled to {n} (run `opscope calibrate --threads {n}` on an "
                              "idle machine to measure it)")
                threads_chosen = threads_chosen if threads_chosen is not None else {}
                threads_chosen["calibration_threads"] = scaled.result.threads
            else:
                got = obtain(n, quick=True, progress=progress.warn)
                peaks = got.result.peaks()
                calibration = {"stable": got.result.stable, "cached": got.path is not None,
                               "quick": got.result.quick}
    return apply_overrides(peaks, opts.peak_bw, opts.peak_flops), calibration


def profiler_activities(device: torch.device) -> list[torch.profiler.ProfilerActivity]:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return activities


def timed_pass(harness: Harness, steps: int, activities: list[torch.profiler.ProfilerActivity],
               nvtx: bool = False) -> tuple[torch.profiler.profile, float, list[float]]:
    """The only timed part of a profile: shapes recorded, nothing else. Returns (profiler, seconds,
    each step's wall seconds including its synchronize). With `nvtx`, each step is also an NVTX range and
    each top-level module forward one (--nvtx)."""
    step_s: list[float] = []
    clock = time.perf_counter
    t0 = clock()
    with module_ranges(harness.model, nvtx), torch.profiler.profile(activities=activities,
                                                                    record_shapes=True) as prof:
        for i in range(steps):
            start = clock()
            # The same step annotation torch.profiler's schedule would add, without a schedule.
            with step_range(nvtx), torch.profiler.record_function(f"ProfilerStep#{i}"):
                harness.step()
                harness.synchronize()
            step_s.append(clock() - start)
    return prof, clock() - t0, step_s


MEMORY_STEPS = 3  # steps of the memory pass: memory-growth compares what each of them leaves allocated


def memory_pass(harness: Harness, activities: list[torch.profiler.ProfilerActivity], path: Path, steps: int = MEMORY_STEPS) -> list[int]:
    """Untimed: `steps` more steps under torch.profiler with profile_memory, exported to `path`. Returns
    torch.cuda.max_memory_allocated of each step on CUDA (else [])."""
    cuda = harness.device.type == "cuda"
    cuda_peaks: list[int] = []
    with torch.profiler.profile(activities=activities, record_shapes=True, profile_memory=True) as prof:
        for i in range(steps):
            if cuda:
                torch.cuda.reset_peak_memory_stats(harness.device)
            with torch.profiler.record_function(f"ProfilerStep#{i}"):
                harness.step()
                harness.synchronize()
            if cuda:
                cuda_peaks.append(int(torch.cuda.max_memory_allocated(harness.device)))
    prof.export_chrome_trace(str(path))
    return cuda_peaks


NO_OPERATORS = ("the model's steps ran no torch operator (its forward returns its input unchanged, or computes "
                "nothing with torch): there is nothing to profile; give opscope a model whose forward computes")


def load_own_trace(path: Path, nothing: str = NO_OPERATORS) -> TraceData:
    """A trace opscope recorded of the user's code, in its private temporary folder. One in which nothing
    ran is the user's code's doing: TargetError `nothing`, not an error naming the temporary file."""
    try:
        return load_trace(path, with_python=False)
    except NothingRecorded:
        raise TargetError(nothing) from None


def memory_of(path: Path, records: list[LineRecord], cuda_peaks: list[int]) -> MemoryProfile | None:
    """The memory pass's trace, its ops joined to the dispatch pass's lines and modules like the timed
    trace's, as a MemoryProfile keyed like ops.csv rows."""
    trace = load_own_trace(path)
    ev = build_events(trace, lambda e: join_lines(records, e))
    memory = memory_profile(trace, ev, "memory pass")
    if memory is not None and cuda_peaks:
        memory.summary["cuda_max_memory_allocated_bytes"] = max(cuda_peaks)
        for entry, peak in zip(memory.summary["per_step"], cuda_peaks, strict=False):
            entry["cuda_max_memory_allocated_bytes"] = peak
    return memory


def profile_target(opts: ProfileOptions, progress: Progress | None = None,
                   sink: Callable[[Run, Path], None] | None = None, *, device: torch.device | None = None,
                   prepare: Callable[[Harness], None] | None = None, peaks: Peaks | None = None,
                   finish: Callable[[Run, TraceData], None] | None = None,
                   extra: Callable[[Harness, Run], dict[str, str]] | None = None,
                   target: Target | None = None) -> tuple[Run, ProfileTimings]:
    """Profiles and analyzes, then writes the run directory, or with `sink` hands the run and its
    trace file to sink(run, trace_path) instead (`profile --nsys/--ncu` adds measurements first).
    A rank of a multi-process job (opscope.capture.distributed) passes its `device`, `prepare` (wraps
    the model in DistributedDataParallel), the ceilings its launcher measured once for all ranks
    (`peaks`) and `finish` (adds the rank's numbers before the run is written).
    `extra(harness, run)`, when given, runs after the analysis with the loaded model, its weights as
    loaded (train mode's steps undone; opscope swap), and returns more files ({name: text}) for the run
    directory; it cannot be combined with `sink`. `target`: the model and inputs already in this process
    (opscope.profile of a model object), instead of loading opts.target's file."""
    if extra is not None and sink is not None:
        raise ValueError("profile_target: extra files and a sink cannot be combined")
    threads_before = torch.get_num_threads()
    try:
        return _profile_target(opts, progress, sink, device=device, prepare=prepare, peaks=peaks, finish=finish,
                               extra=extra, target=target)
    finally:  # --threads and the thread choice are the run's: the caller's process keeps its own count
        if torch.get_num_threads() != threads_before:
            torch.set_num_threads(threads_before)


def _profile_target(opts: ProfileOptions, progress: Progress | None,
                    sink: Callable[[Run, Path], None] | None, *, device: torch.device | None,
                    prepare: Callable[[Harness], None] | None, peaks: Peaks | None,
                    finish: Callable[[Run, TraceData], None] | None,
                    extra: Callable[[Harness, Run], dict[str, str]] | None,
                    target: Target | None) -> tuple[Run, ProfileTimings]:
    progress = progress or Progress()
    _validate(opts)
    # Absolute before the model is loaded: its code may change the working directory.
    reports = DEFAULT_REPORTS_DIR.absolute()
    out = opts.out.absolute() if opts.out is not None else None
    check_out_dir(out, reports)
    timings = ProfileTimings()
    if opts.threads:
        torch.set_num_threads(opts.threads)
    device = device if device is not None else resolve_device(opts.device)

    t0 = time.perf_counter()
    sampler = CpuSampler()
    loading = sampler.sample()  # other processes' CPU use is measured from here to the thread choice
    progress.phase("loading model")
    compile_log = TorchTraceLog()  # before the model's code runs: it may compile at once
    compiled_before = dynamo_ok_frames()  # this process may have compiled other code already (API, tests)
    if target is None:
        with module_origins(), process_state_kept(keep_additions=True):
            target = load_target(opts.target, opts.entry)
    harness = Harness(target, mode=opts.mode, device=device, dtype=opts.dtype, compile=opts.compile)
    for note in harness.compiled.notes if harness.compiled is not None else []:
        progress.warn(note)
    if prepare is not None:
        prepare(harness)
    # `extra` (opscope swap) starts from the weights as loaded: the profile's SGD steps (warmup, timed,
    # line and memory passes) would otherwise leave it a model drifted by however many steps ran
    loaded = weights_snapshot(harness.model) if extra is not None and opts.mode == "train" else None
    timings.load = time.perf_counter() - t0

    t0 = time.perf_counter()
    threads_chosen = None
    if peaks is None:
        threads_chosen = choose_threads(opts, device, sampler, loading)
        peaks, calibration = machine_peaks(opts, device, progress, threads_chosen)
    else:  # a rank of a multi-process job: its launcher calibrated once for all ranks and set its threads
        calibration = None
    timings.calibration = time.perf_counter() - t0

    warmup = warmup_steps(opts.warmup, harness.compiled, progress.warn)
    progress.phase("warmup", total=warmup)
    t0 = time.perf_counter()
    for i in range(warmup):
        harness.step()
        if i == 0:
            harness.synchronize()
            timings.first_step = time.perf_counter() - t0
        progress.advance()
    harness.synchronize()
    timings.warmup = time.perf_counter() - t0

    progress.phase(f"profiling {opts.steps} steps")
    activities = profiler_activities(device)
    with tempfile.TemporaryDirectory(prefix="opscope-") as tmp:
        trace_path = Path(tmp) / "trace.json"
        frames = dynamo_frames()
        before = sampler.sample()
        prof, timings.timed, step_s = timed_pass(harness, opts.steps, activities, nvtx=opts.nvtx)
        after = sampler.sample()
        if dynamo_frames() > frames:
            progress.warn("torch.compile compiled during the profiled steps (a recompilation, or code that compiles "
                          "late), so their time includes compiling: raise --warmup (TORCH_LOGS=recompiles says why)")
        timings.timed_step_s = timings.timed / opts.steps
        t0 = time.perf_counter()
        prof.export_chrome_trace(str(trace_path))
        timings.export = time.perf_counter() - t0

        progress.phase("recording source lines")
        t0 = time.perf_counter()
        records = record_lines(harness.step, harness.model)
        harness.synchronize()
        timings.lines = time.perf_counter() - t0
        noise = window_noise(sampler, before, after, torch.get_num_threads())

        progress.phase("recording memory")
        t0 = time.perf_counter()
        memory_path = Path(tmp) / "memory.json"
        cuda_peaks = memory_pass(harness, activities, memory_path)
        memory = memory_of(memory_path, records, cuda_peaks)
        timings.memory = time.perf_counter() - t0

        progress.phase("analyzing")
        t0 = time.perf_counter()
        trace = load_own_trace(trace_path)
        meta = profile_meta(opts, device, harness.dtype_name, peaks)
        if calibration is not None:
            meta["calibration"] = calibration
        if threads_chosen is not None:
            meta["threads_chosen"] = threads_chosen
        compiled = harness.compiled or (CompileInfo(None, "model") if dynamo_compiled(compiled_before) else None)
        if compiled is not None:
            meta["compile"] = {**compiled.to_json(), "first_step_s": timings.first_step if warmup else None}
        torch_trace, too_big = kept_log(compile_log.path())
        if too_big is not None:
            progress.warn(too_big)
        probe = layout_probe_for(device) if opts.mode in ("inference", "train") else None
        classes = module_classes(harness.model)
        run = analyze(trace, peaks=peaks, meta=meta, source="profile",
                      source_override=lambda ev: join_lines(records, ev), layout_probe=probe,
                      dtype_probe=float32_probe(device), module_classes=classes, memory=memory,
                      noise=noise, step_us=[t * 1e6 for t in step_s], torch_trace=torch_trace,
                      kernel_timer=kernel_timer_for(device))
        # `opscope analyze RUN/trace.json.gz` reproduces this run's table from what is embedded here
        assert run.events is not None  # analyze() keeps the events it analyzed
        embed(trace_path, make_block(run.events, classes, memory))
        if finish is not None:
            finish(run, trace)
        if sink is not None:
            sink(run, trace_path)
        else:
            if loaded is not None:
                restore_weights(harness.model, loaded)
            files = extra(harness, run) if extra is not None else None
            write_run(run, out, target.stem, trace_path, base=reports, extra_texts=files, torch_trace=torch_trace)
        timings.analysis = time.perf_counter() - t0
    return run, timings


def weights_snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of the model's state_dict on the CPU (so that it costs no accelerator memory)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def restore_weights(model: torch.nn.Module, snapshot: dict[str, torch.Tensor]) -> None:
    """Copies a weights_snapshot back into the model's own tensors, in place."""
    with torch.no_grad():
        for k, v in model.state_dict().items():
            v.copy_(snapshot[k])


def profile_meta(opts: ProfileOptions, device: torch.device, dtype: str | None, peaks: Peaks) -> dict[str, Any]:
    """meta.json of a profile; `dtype` is the model's (None where opscope does not know it: a script)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        dev = {"type": "rocm" if torch.version.hip else "cuda", "name": name}
    else:
        dev = {"type": "cpu", "name": cpu_name()}
    return {
        "format_version": FORMAT_VERSION,
        "opscope_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "source": "profile",
        "target": os.path.normpath(opts.target),  # as shown: /work/../models/x.py printed as given
        "torch_version": torch.__version__,
        "device": dev,
        "dtype": dtype,
        "mode": opts.mode,
        "steps": opts.steps,
        "threads": torch.get_num_threads(),
        "peaks": peaks.to_json(),
    }


