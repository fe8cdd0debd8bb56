"""Profiles in the caller's own process: a model object with its inputs (`profile_model`), or any block
of code (`profiling()`, its steps marked by `session.step()`). The same capture and analysis as
`opscope profile`; what the steps change in the caller's process (the model's weights, gradients and
train/eval flags, torch's thread count) is put back afterwards. Imports torch when called."""

from __future__ import annotations

import copy
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any

from opscope.api.files import KeptProgress, PathLike, user_path
from opscope.api.run import Run
from opscope.capture.options import Progress
from opscope.errors import OpscopeError, TargetError

if TYPE_CHECKING:
    import torch

API_META = ("profile", "profiling")  # meta.json "api": how an in-process run was made


def _quiet_kineto() -> None:
    """libkineto prints "USDT: profiler_start/stop" lines on every profile unless its log level is 6 (read
    when a profile starts); the CLI sets it too. A level the caller set stays."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")


def _model_name(model: Any) -> str:
    """What the run is named after: the model's class (the compiled module's own, for torch.compile)."""
    inner = getattr(model, "_orig_mod", model)
    return type(inner).__name__ or "model"


class _Restore:
    """What the steps change on a model object of the caller's, taken before and put back after: the
    weights and buffers (train mode's optimizer steps, BatchNorm's running statistics), gradients and
    every module's train/eval flag."""

    def __init__(self, model: torch.nn.Module, mode: str) -> None:
        from opscope.capture.torch_profiler import weights_snapshot

        self.model = model
        self.training = [(m, m.training) for m in model.modules()]
        self.weights = weights_snapshot(model) if mode == "train" else None
        self.grads = [(p, p.grad) for p in model.parameters()]

    def restore(self) -> None:
        from opscope.capture.torch_profiler import restore_weights

        if self.weights is not None:
            restore_weights(self.model, self.weights)
        for p, grad in self.grads:
            p.grad = grad
        for m, training in self.training:
            m.training = training


def _needs_copy(model: torch.nn.Module, device: str, dtype: str | None) -> bool:
    """Whether profiling on `device` in `dtype` would move or cast the caller's model (then a copy is
    profiled: a cast back would not restore the weights' bits)."""
    from opscope.capture.harness import DTYPES, resolve_device

    want = resolve_device(device)
    to_dtype = DTYPES[dtype] if dtype else None
    for t in list(model.parameters()) + list(model.buffers()):
        if t.device.type != want.type:
            return True
        if to_dtype is not None and t.is_floating_point() and t.dtype != to_dtype:
            return True
    return False


def profile_model(model: torch.nn.Module, inputs: Any, *, mode: str = "inference", steps: int = 5, warmup: int = 2,
                  device: str = "auto", dtype: str | None = None, out: PathLike | None = None,
                  compile: str | None = None, threads: int | None = None, peak_bw: float | None = None,
                  peak_flops: Sequence[str] | str | None = None, loss_fn: Callable[[Any], Any] | None = None,
                  progress: Progress | None = None) -> Run:
    """Profiles `model(*inputs)` in this process (see opscope.profile)."""
    import sys

    import torch

    from opscope.api.jobs import profile_options
    from opscope.capture.torch_profiler import profile_target
    from opscope.target.model_file import Target, split_inputs

    if not isinstance(model, torch.nn.Module):
        raise TargetError(f"the model must be a torch.nn.Module (or the path of a model file); got "
                          f"{type(model).__name__}")
    args, kwargs = split_inputs(inputs if inputs is not None else (), "inputs")
    if loss_fn is not None and not callable(loss_fn):
        raise OpscopeError("loss_fn must be callable: loss_fn(output) -> scalar tensor")
    out_dir = user_path(out)
    name = _model_name(model)
    opts = profile_options(Path(name), check_file=False, entry=None, device=device, dtype=dtype, mode=mode, warmup=warmup,
                           steps=steps, threads=threads, peak_bw=peak_bw, peak_flops=peak_flops, out=out_dir)
    if compile is not None:
        from opscope.capture.compiled import COMPILE_MODES

        if compile not in COMPILE_MODES:
            raise OpscopeError(f"compile must be one of {', '.join(COMPILE_MODES)}; got {compile!r}")
        opts.compile = compile
    if _needs_copy(model, device, dtype):
        model = copy.deepcopy(model)
    restore = _Restore(model, mode)
    module = sys.modules.get(type(model).__module__) or ModuleType(type(model).__module__)
    target = Target(path=Path(name), module=module, model=model, args=args, kwargs=kwargs, loss_fn=loss_fn)
    kept = KeptProgress(progress)
    _quiet_kineto()
    from opscope.capture.compiled import holds_compiled

    if (compile is not None or holds_compiled(model)) and not os.environ.get("TORCH_TRACE"):
        kept.warn("the model is torch.compile'd: in this process inductor's kernels get no FLOPs, bytes or source "
                  "lines (torch.compile's log, TORCH_TRACE, must be set before torch is imported); profile its "
                  "model file with opscope.profile('model.py') or `opscope profile` for those")

    try:
        data, _ = profile_target(opts, kept, target=target, finish=lambda run, trace: run.meta.update(api="profile"))
    finally:
        restore.restore()
    return Run.written(data, kept.warnings)


class Session:
    """A block of the caller's code under the profiler (opscope.profiling()). `step()` marks the end of
    each step; after the block, `run` is the analyzed Run, written to its run directory."""

    def __init__(self, *, out: PathLike | None = None, device: str = "auto", skip_steps: int = 0,
                 peak_bw: float | None = None, peak_flops: Sequence[str] | str | None = None,
                 name: str = "profiling", progress: Progress | None = None) -> None:
        from opscope.api.jobs import profile_options

        if skip_steps < 0:
            raise OpscopeError("skip_steps must be 0 or more")
        self._out = user_path(out)
        self._opts = profile_options(Path(name), check_file=False, entry=None, device=device, dtype=None, mode="inference",
                                     warmup=skip_steps, steps=1, threads=None, peak_bw=peak_bw,
                                     peak_flops=peak_flops, out=self._out)
        self._skip = skip_steps
        self._progress = KeptProgress(progress)
        self._run: Run | None = None
        self._prof: Any = None
        self._range: Any = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.steps = 0  # steps ended by step() (skipped ones included)
        self._recorded = 0  # steps ended while the profiler recorded
        self._step_s: list[float] = []
        self._step_start = 0.0
        self._device: Any = None
        self._active = False
        self._before: Any = None
        self._sampler: Any = None

    @property
    def run(self) -> Run:
        """The Run of the block, once the `with` block has ended."""
        if self._run is None:
            raise OpscopeError("the run is ready when the `with opscope.profiling()` block has ended")
        return self._run

    def __enter__(self) -> Session:
        from opscope.capture.harness import resolve_device
        from opscope.machine.noise import CpuSampler
        from opscope.run.model import DEFAULT_REPORTS_DIR
        from opscope.run.write import check_out_dir

        check_out_dir(self._out.absolute() if self._out else None, DEFAULT_REPORTS_DIR.absolute())
        self._device = resolve_device(self._opts.device)
        self._sampler = CpuSampler()
        self._tmp = tempfile.TemporaryDirectory(prefix="opscope-")
        self._active = True
        if self._skip == 0:
            self._start()
        return self

    def _start(self) -> None:
        import torch

        from opscope.capture.torch_profiler import profiler_activities

        _quiet_kineto()
        # Python frames (with_stack) give the source lines and modules: the block cannot be run again
        # under opscope's line-recording pass
        self._prof = torch.profiler.profile(activities=profiler_activities(self._device), record_shapes=True,
                                            with_stack=True)
        self._prof.start()
        self._before = self._sampler.sample()
        self._open_step()

    def _open_step(self) -> None:
        import torch

        self._range = torch.autograd.profiler.record_function(f"ProfilerStep#{self._recorded}")
        self._range.__enter__()
        self._step_start = time.perf_counter()

    def _close_step(self) -> None:
        if self._range is not None:
            self._sync()
            self._range.__exit__(None, None, None)
            self._range = None

    def _sync(self) -> None:
        if self._device is not None and self._device.type == "cuda":
            import torch

            torch.cuda.synchronize()

    def step(self) -> None:
        """Marks the end of a step (one iteration of the caller's loop)."""
        if not self._active:
            raise OpscopeError("session.step() belongs inside its `with opscope.profiling()` block")
        self.steps += 1
        if self._prof is None:
            if self.steps >= self._skip:
                self._start()
            return
        self._close_step()
        self._step_s.append(time.perf_counter() - self._step_start)
        self._recorded += 1
        self._open_step()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._active = False
        assert self._tmp is not None
        try:
            if self._prof is None:
                if exc_type is None:
                    raise OpscopeError(f"the block ended after {self.steps} steps, before the {self._skip} to "
                                       "skip (skip_steps): nothing was profiled")
                return
            marked = self._recorded > 0
            if not marked:  # no step() at all: the whole block is one step
                self._step_s.append(time.perf_counter() - self._step_start)
            self._close_step()
            after = self._sampler.sample()
            self._prof.stop()
            if exc_type is not None:  # the caller's error goes on as it is; nothing is written
                return
            trace_path = Path(self._tmp.name) / "trace.json"
            self._prof.export_chrome_trace(str(trace_path))
            if marked:  # the range after the last step() holds what ran after it: not a step
                _rename_last_step(trace_path, self._recorded)
            self._run = self._analyze(trace_path, after)
        finally:
            self._prof = None
            self._tmp.cleanup()

    def _analyze(self, trace_path: Path, after: Any) -> Run:
        import torch

        from opscope.analysis.pipeline import analyze, dominant_dtype, trace_mode
        from opscope.capture.dtype_probe import float32_probe
        from opscope.capture.kernel_timing import kernel_timer_for
        from opscope.capture.layout_probe import layout_probe_for
        from opscope.capture.torch_profiler import machine_peaks, profile_meta
        from opscope.machine.noise import window_noise
        from opscope.run.model import DEFAULT_REPORTS_DIR
        from opscope.run.write import write_run
        from opscope.trace.reader import NothingRecorded, load_trace

        progress = self._progress
        try:
            trace = load_trace(trace_path)
        except NothingRecorded:
            raise TargetError("the profiled block ran no torch operator: there is nothing to profile") from None
        steps = max(self._recorded, 1)
        self._opts.steps = steps
        noise = window_noise(self._sampler, self._before, after, torch.get_num_threads(),
                             during="during the profiled block")
        peaks, calibration = machine_peaks(self._opts, self._device, progress)
        meta = profile_meta(self._opts, self._device, None, peaks)
        if calibration is not None:
            meta["calibration"] = calibration
        data = analyze(trace, peaks=peaks, meta=meta, source="profile", layout_probe=layout_probe_for(self._device),
                       dtype_probe=float32_probe(self._device), noise=noise, step_us=[t * 1e6 for t in self._step_s],
                       kernel_timer=kernel_timer_for(self._device))
        meta["dtype"] = dominant_dtype(data.events)
        meta["mode"] = trace_mode(data.events)
        meta["api"] = "profiling"
        write_run(data, self._out.absolute() if self._out else None, str(self._opts.target), trace_path,
                  base=DEFAULT_REPORTS_DIR.absolute())
        return Run.written(data, progress.warnings)


def _rename_last_step(path: Path, index: int) -> None:
    """Renames the step range that was open when the block ended (ProfilerStep#index, after the last
    step()) in the exported trace, so that what ran after the last step() is not counted as a step."""
    data = path.read_bytes()
    name = f'"ProfilerStep#{index}"'.encode()
    path.write_bytes(data.replace(name, b'"opscope: after the last step"'))


def profiling(*, out: PathLike | None = None, device: str = "auto", skip_steps: int = 0,
              peak_bw: float | None = None, peak_flops: Sequence[str] | str | None = None,
              progress: Progress | None = None) -> Session:
    """See opscope.profiling."""
    return Session(out=out, device=device, skip_steps=skip_steps, peak_bw=peak_bw, peak_flops=peak_flops,
                   progress=progress)
