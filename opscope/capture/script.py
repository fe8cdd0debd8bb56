"""Script mode: `opscope profile train.py -- ARGS...` runs an unmodified training script as `__main__`
(as `python train.py ARGS...` would: sys.argv set, its folder importable) under torch.profiler, in the
supervised child.

Steps. A step ends at each optimizer step: a global post-hook
(torch.optim.optimizer.register_optimizer_step_post_hook) on the first optimizer that steps (a GAN's
second optimizer does not double the count); or, with `--step-fn MODULE:FUNC`, at each return of that
function (outermost call only). torch.profiler's schedule turns boundaries into a window:
`--skip-steps K` steps unprofiled (the last of them the profiler's warmup, so the first profiled step
does not pay the profiler's start), then `--steps N` profiled with shapes only, as in the model-file mode.
After the window the profiler is stopped; the script keeps running, unprofiled, to its end, or is stopped
after the line step with `--stop-after`.

Endings. A script may end itself with `os._exit(0)` (a common idiom to skip slow interpreter teardown).
In the script's own process and main thread that call is turned into an exception while the script runs
(ScriptExited), so opscope keeps what it captured up to it, writes the run and says how the script
ended; `os._exit(N)` with N != 0 is a failure, as `sys.exit(N)` is. A forked child (a DataLoader worker)
and other threads keep the real os._exit.

Source lines. A script's step cannot be re-run, so the untimed line pass of the model-file mode records
the next step instead: the step right after the window runs under the same dispatch mode
(opscope.capture.lines.line_mode), which reads each aten op's exact line, and the records are joined to
every profiled step (the steps of a training loop run the same code). When the script ends before a step
follows the window, the rows have no source line, and a warning says why.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import importlib
import inspect
import os
import sys
import tempfile
import threading
import time
import types
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import torch

from opscope.analysis.annotations import embed, make_block
from opscope.analysis.pipeline import analyze, dominant_dtype, trace_mode
from opscope.capture.dtype_probe import float32_probe
from opscope.capture.harness import process_state_kept, resolve_device
from opscope.capture.kernel_timing import kernel_timer_for
from opscope.capture.layout_probe import layout_probe_for
from opscope.capture.lines import LineRecord, discovered_module_stack, join_lines, line_mode
from opscope.capture.options import Progress
from opscope.capture.torch_profiler import (
    choose_threads,
    load_own_trace,
    machine_peaks,
    profile_meta,
    profiler_activities,
)
from opscope.errors import OpscopeError, TargetError
from opscope.machine.noise import CpuSample, CpuSampler, window_noise
from opscope.machine.peaks import Peaks
from opscope.run.model import DEFAULT_REPORTS_DIR, Run
from opscope.run.write import check_out_dir, write_run
from opscope.sources import classify_path, display_path
from opscope.target.jobs import STEP_FN_RE
from opscope.target.model_file import (
    ACCEPTED,
    add_model_folder,
    check_target_file,
    describe_exception,
    user_frame_of,
)
from opscope.target.specs import ProfileOptions, ScriptSpec
from opscope.trace.reader import TraceData


class StopScript(BaseException):
    """Raised at a step boundary to end the script once the window is recorded (--stop-after). A
    BaseException, so the script's `except Exception` does not swallow it; its `finally` blocks run."""


class ScriptExited(BaseException):
    """os._exit(code) called by the script's main thread, raised instead of ending the process (see the
    module docstring: the run would otherwise be lost). A BaseException, as SystemExit is."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@contextlib.contextmanager
def os_exit_caught() -> Iterator[None]:
    """While active, os._exit(code) in this process's main thread raises ScriptExited(code); in a forked
    child or another thread it ends the process as ever (a worker process must not unwind into a copy of
    the script's stack)."""
    original = os._exit
    pid, main = os.getpid(), threading.main_thread()

    def caught_exit(code: int) -> NoReturn:
        if os.getpid() == pid and threading.current_thread() is main:
            raise ScriptExited(code)
        original(code)

    setattr(os, "_exit", caught_exit)  # noqa: B010 (a plain assignment to a module function upsets mypy)
    try:
        yield
    finally:
        setattr(os, "_exit", original)  # noqa: B010


class StepWindow:
    """Turns the script's step boundaries into torch.profiler schedule steps, then records one more step
    under the line-recording dispatch mode.

    torch runs one profiler session at a time. While the script runs its own (torch.profiler.profile or
    torch.autograd.profiler.profile, see user_profilers()), opscope's window yields to it: the script's
    steps are not counted, and a window begun before is dropped (it would record the script's profiler
    too, and stopping it ends the script's session: its table printed empty). Counting starts afresh,
    skipped steps included, when the script's profiler stops."""

    def __init__(self, skip: int, steps: int, activities: list[torch.profiler.ProfilerActivity], trace_path: Path, stop_after: bool,
                 progress: Progress) -> None:
        self.skip, self.steps, self.stop_after, self.progress = skip, steps, stop_after, progress
        self.trace_path, self.activities = trace_path, activities
        self.prof = self._profiler()
        self.boundaries = 0  # steps the script completed
        self.counted = 0  # steps counted by the current profiler (since it started)
        self.recorded = False  # the window's trace is exported
        self.records: list[LineRecord] | None = None
        self._mode: Any = None
        self.done = False
        self._incomplete = False  # set when the script ends mid-window: no partial window is exported
        self._own = 0  # > 0 while opscope itself drives its profiler (its sessions are not the script's)
        self.user_sessions: set[int] = set()  # the script's profiler sessions now running
        self.user_profiler_at = ""  # where the script first started its own profiler
        self.user_steps = 0  # the script's steps that ran under its own profiler
        # The profiled steps' wall times and the CPU samples around them (the noise line, as a model file's)
        self.sampler = CpuSampler()
        self.before: CpuSample | None = None
        self.after: CpuSample | None = None
        self.step_s: list[float] = []
        self._step_start = 0.0
        self.module_classes: dict[str, str] = {}  # modules found in the line step (discovered_module_stack)
        self._modules: Any = None

    def _profiler(self) -> torch.profiler.profile:
        warmup = 1 if self.skip >= 1 else 0  # the profiler's own warmup is the last skipped step
        return torch.profiler.profile(
            activities=self.activities, record_shapes=True, on_trace_ready=self._ready,
            schedule=torch.profiler.schedule(wait=self.skip - warmup, warmup=warmup, active=self.steps, repeat=1))

    def start(self) -> None:
        import warnings

        self._own += 1
        try:
            with warnings.catch_warnings():  # skip 0: torch warns that there is no profiler warmup
                warnings.simplefilter("ignore")
                self.prof.start()
        finally:
            self._own -= 1
        self.step_s, self.before, self.after = [], None, None
        if self.skip == 0:  # the window records from the start
            self._window_starts()

    def _window_starts(self) -> None:
        self.before = self.sampler.sample()
        self._step_start = time.perf_counter()

    def boundary(self) -> None:
        """The script finished a step."""
        if self.done:
            return
        self.boundaries += 1
        if self.user_sessions:  # under the script's own profiler: not a step of opscope's window
            self.user_steps += 1
            return
        if not self.recorded:
            self.counted += 1
            if self.counted > self.skip:  # a profiled step ended: its time, before the export below
                now = time.perf_counter()
                self.step_s.append(now - self._step_start)
                self._step_start = now
                if self.counted == self.skip + self.steps:
                    self.after = self.sampler.sample()
            self._own += 1
            try:
                self.prof.step()  # at the window's last step this exports the trace (_ready)
                if self.recorded:
                    self.prof.stop()
            finally:
                self._own -= 1
            if self.recorded:
                self.progress.phase("recording source lines (the next step, untimed)")
                self.records = []
                self._modules = discovered_module_stack()
                current_module, self.module_classes = self._modules.__enter__()
                self._mode = line_mode(self.records, current_module)
                self._mode.__enter__()
            elif self.counted == self.skip:
                self.progress.phase(f"profiling {self.steps} steps")
                self._window_starts()
            return
        self.finish_lines()
        self.done = True
        if self.stop_after:
            self.progress.phase("stopping the script (--stop-after)")
            raise StopScript
        self.progress.phase("the script continues (not profiled)")

    def finish_lines(self) -> None:
        if self._mode is not None:
            mode, self._mode = self._mode, None
            mode.__exit__(None, None, None)
        if self._modules is not None:
            modules, self._modules = self._modules, None
            modules.__exit__(None, None, None)

    def close(self) -> None:
        """Leaves whatever is still active (the script ended or failed inside the window)."""
        self.finish_lines()
        if not self.recorded:
            self._drop()

    def _drop(self) -> None:
        """Stops opscope's profiler without exporting what it holds."""
        self._incomplete = True
        self._own += 1
        try:
            with contextlib.suppress(Exception):
                self.prof.stop()
        finally:
            self._own -= 1

    def user_started(self, session: Any, where: str) -> None:
        """The script starts a profiler session of its own (called before torch prepares it)."""
        if self._own or self.recorded:  # opscope's own session, or opscope's window is over: no conflict
            return
        if not self.user_sessions:
            self.user_profiler_at = self.user_profiler_at or where
            if not self._incomplete:  # opscope's profiler may hold a session (warmup, recording): give it up
                self._drop()
        self.user_sessions.add(id(session))

    def user_stopped(self, session: Any) -> None:
        """The script's profiler session ended: opscope's window starts afresh."""
        if id(session) not in self.user_sessions:
            return
        self.user_sessions.discard(id(session))
        if not self.user_sessions and not self.recorded:
            if self._incomplete:
                self.prof, self._incomplete = self._profiler(), False
                self.start()
            self.counted = 0
            self.step_s, self.before, self.after = [], None, None
            self.progress.phase(f"the script's own profiler stopped: skipping {self.skip} steps again")

    def _ready(self, prof: torch.profiler.profile) -> None:
        if self._incomplete:
            return
        prof.export_chrome_trace(str(self.trace_path))
        self.recorded = True


@contextlib.contextmanager
def user_profilers(window: StepWindow) -> Iterator[None]:
    """While active, every profiler session the script starts or stops is reported to `window` first.
    torch.profiler.profile and the older torch.autograd.profiler.profile both open their session through
    torch.autograd.profiler.profile._prepare_trace and close it through its __exit__."""
    from torch.autograd import profiler as autograd_profiler

    cls = autograd_profiler.profile
    prepare, leave = cls._prepare_trace, cls.__exit__

    def prepare_trace(self: Any) -> Any:
        window.user_started(self, _caller_in_user_code())
        return prepare(self)

    def exit_session(self: Any, *exc: Any) -> Any:
        try:
            return leave(self, *exc)
        finally:
            window.user_stopped(self)

    setattr(cls, "_prepare_trace", prepare_trace)  # noqa: B010 (patching a method of torch's class)
    setattr(cls, "__exit__", exit_session)  # noqa: B010
    try:
        yield
    finally:
        setattr(cls, "_prepare_trace", prepare)  # noqa: B010
        setattr(cls, "__exit__", leave)  # noqa: B010


def _caller_in_user_code() -> str:
    """'file:line' of the innermost frame of the user's code on the stack, or ""."""
    frame = sys._getframe(1)
    while frame is not None:
        if classify_path(frame.f_code.co_filename) == "user":
            return f"{display_path(frame.f_code.co_filename)}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return ""


class _StepOfOptimizer:
    """Step boundaries at the first stepping optimizer's steps (global post-step hook)."""

    def __init__(self, on_step: Callable[[], None]) -> None:
        self.on_step = on_step
        self.first: weakref.ref[torch.optim.Optimizer] | None = None
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.handle = register_optimizer_step_post_hook(self._hook)

    def _hook(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.first is None:
            self.first = weakref.ref(optimizer)
        if self.first() is optimizer:
            self.on_step()

    def remove(self) -> None:
        self.handle.remove()


def _counting(fn: Callable[..., Any], on_return: Callable[[], None]) -> Callable[..., Any]:
    """`fn`, calling on_return() after each outermost call that returns (not one that raises)."""
    depth = [0]

    @functools.wraps(fn)
    def step_fn(*args: Any, **kwargs: Any) -> Any:
        depth[0] += 1
        try:
            result = fn(*args, **kwargs)
        finally:
            depth[0] -= 1
        if depth[0] == 0:
            on_return()
        return result

    return step_fn


def _wrap_attribute(owner: Any, name: str, on_return: Callable[[], None]) -> None:
    raw = inspect.getattr_static(owner, name)
    if isinstance(raw, (staticmethod, classmethod)):
        setattr(owner, name, type(raw)(_counting(raw.__func__, on_return)))
    elif callable(raw):
        setattr(owner, name, _counting(raw, on_return))
    else:
        raise TargetError(f"--step-fn: {name} of {owner!r} is not a function")


def _install(value: Any, path: list[str], on_return: Callable[[], None]) -> Any:
    """`value` (named path[0]) with path[-1] wrapped: the value itself for a function, else its
    attribute (Class.method)."""
    if len(path) == 1:
        if not callable(value):
            raise TargetError(f"--step-fn: {path[0]} is not a function")
        return _counting(value, on_return)
    owner = value
    for part in path[1:-1]:
        owner = getattr(owner, part)
    _wrap_attribute(owner, path[-1], on_return)
    return value


class _MainNamespace(dict[str, Any]):
    """The script's globals when --step-fn names a function the script itself defines: the function is
    wrapped as the script's top-level code binds its name (CPython stores module-level names of a dict
    subclass through __setitem__), so the script stays unmodified."""

    def __init__(self, path: list[str], on_return: Callable[[], None]) -> None:
        super().__init__()
        self.path, self.on_return, self.installed = path, on_return, False

    def __setitem__(self, key: str, value: Any) -> None:
        if key == self.path[0]:
            value = _install(value, self.path, self.on_return)
            self.installed = True
        super().__setitem__(key, value)


def _step_fn_target(step_fn: str, script: Path) -> tuple[str | None, list[str]]:
    """(module to patch, or None for the script itself; attribute path)."""
    m = STEP_FN_RE.match(step_fn)
    if m is None:
        raise TargetError(f"--step-fn must be MODULE:FUNC, not {step_fn!r}")
    module = m.group("module")
    return (None if module in ("__main__", script.stem) else module), m.group("func").split(".")


def _patch_module(module: str, path: list[str], on_return: Callable[[], None], step_fn: str) -> None:
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # the user's module failed to import: one line with its message
        raise TargetError(f"--step-fn {step_fn}: cannot import {module}: {describe_exception(exc)}") from exc
    owner: Any = mod
    for part in path[:-1]:
        owner = getattr(owner, part, None)
        if owner is None:
            raise TargetError(f"--step-fn {step_fn}: {module} has no {'.'.join(path[:-1])}")
    if not hasattr(owner, path[-1]):
        raise TargetError(f"--step-fn {step_fn}: {module} has no {'.'.join(path)}")
    _wrap_attribute(owner, path[-1], on_return)


def run_as_main(path: Path, args: list[str], namespace: dict[str, Any] | None = None) -> None:
    """Runs the file as `python path args...` would: as __main__ (what runpy.run_path does), with
    sys.argv set and the file's folder importable; `namespace` (a dict subclass) as its globals."""
    code = compile(path.read_bytes(), str(path), "exec")
    module = types.ModuleType("__main__")
    ns = namespace if namespace is not None else module.__dict__
    ns.update(__name__="__main__", __file__=str(path), __cached__=None, __doc__=None, __loader__=None,
              __package__=None, __spec__=None, __builtins__=builtins)
    if namespace is not None:  # `import __main__; __main__.x` (pickle, multiprocessing) finds the names
        def module_getattr(name: str) -> Any:
            try:
                return namespace[name]
            except KeyError:
                raise AttributeError(name) from None

        module.__dict__["__getattr__"] = module_getattr
    add_model_folder(str(path.resolve().parent))
    saved_main, saved_argv = sys.modules.get("__main__"), sys.argv
    sys.modules["__main__"] = module
    sys.argv = [str(path), *args]
    try:
        exec(code, ns)  # noqa: S102 (running the user's script is the point)
    finally:
        sys.argv = saved_argv
        if saved_main is not None:
            sys.modules["__main__"] = saved_main


def profile_script(opts: ProfileOptions, script: ScriptSpec, progress: Progress | None = None, *,
                   peaks: Peaks | None = None,
                   finish: Callable[[Run, TraceData], None] | None = None) -> Run:
    """Profiles the window of an unmodified script (module docstring) and writes its run directory.
    `opts.warmup` is --skip-steps, `opts.steps` --steps."""
    progress = progress or Progress()
    check_target_file(opts.target)
    if opts.steps < 1 or opts.warmup < 0:
        raise OpscopeError("--steps must be at least 1 and --skip-steps 0 or more")
    reports = DEFAULT_REPORTS_DIR.absolute()
    out = opts.out.absolute() if opts.out is not None else None
    check_out_dir(out, reports)
    path = opts.target.absolute()
    if opts.threads:
        torch.set_num_threads(opts.threads)
    device = resolve_device(opts.device)
    calibration = None  # a rank's launcher calibrated once for all ranks (and set its threads)
    threads_chosen = None
    if peaks is None:
        sampler = CpuSampler()
        threads_chosen = choose_threads(opts, device, sampler, sampler.sample())
        peaks, calibration = machine_peaks(opts, device, progress, threads_chosen)
    with tempfile.TemporaryDirectory(prefix="opscope-") as tmp:
        trace_path = Path(tmp) / "trace.json"
        window = StepWindow(opts.warmup, opts.steps, profiler_activities(device), trace_path,
                            script.stop_after, progress)
        namespace, clock = None, None
        target = None
        if script.step_fn is not None:
            module, attr_path = _step_fn_target(script.step_fn, path)
            if module is None:
                namespace = target = _MainNamespace(attr_path, window.boundary)
            else:
                with process_state_kept(keep_additions=True):
                    add_model_folder(str(path.parent))
                    _patch_module(module, attr_path, window.boundary, script.step_fn)
        else:
            clock = _StepOfOptimizer(window.boundary)
        progress.phase(f"running {path.name} (skipping {opts.warmup} steps)")
        try:
            with process_state_kept(keep_additions=True), os_exit_caught(), user_profilers(window):
                window.start()
                ended = _run_script(path, script.args, namespace)
        finally:
            window.close()
            if clock is not None:
                clock.remove()
        if target is not None and not target.installed:
            raise TargetError(f"--step-fn {script.step_fn}: the script never defined {target.path[0]}")
        if not window.recorded:
            raise TargetError((_under_own_profiler(window) or _too_few_steps(window, script, path.name))
                              + (f" (it ended itself with {ended})" if ended else ""))
        if window.user_steps:
            progress.warn(f"the script runs its own torch.profiler{_at(window.user_profiler_at)}: torch runs one "
                          f"profiler at a time, so opscope let it run and profiled {opts.steps} steps outside it "
                          f"({window.user_steps} steps ran under it)")
        if ended:
            progress.warn(f"the script ended itself with {ended}; the run holds what opscope captured up to it "
                          f"(the profiled window of {opts.steps} steps is complete)")
        if window.records is None or not window.done:
            progress.warn("source lines: no step followed the profiled window before the script ended, so the "
                          "ops have no source line (give the script one more step than --skip-steps + --steps)")
            window.records = None
        progress.phase("analyzing")
        trace = load_own_trace(trace_path, f"the profiled steps of {path.name} ran no torch operator: there is "
                                            "nothing to profile (do its steps run the model? see --step-fn)")
        meta = profile_meta(opts, device, None, peaks)
        meta["mode"] = "unknown"
        records = window.records
        noise = None
        if window.before is not None and window.after is not None:
            noise = window_noise(window.sampler, window.before, window.after, torch.get_num_threads())
        run = analyze(trace, peaks=peaks, meta=meta, source="profile",
                      source_override=(lambda ev: join_lines(records, ev)) if records else None,
                      layout_probe=layout_probe_for(device), dtype_probe=float32_probe(device),
                      module_classes=window.module_classes if records else None, noise=noise,
                      step_us=[t * 1e6 for t in window.step_s] if len(window.step_s) == opts.steps else None,
                      kernel_timer=kernel_timer_for(device))
        meta["dtype"] = dominant_dtype(run.events)
        meta["mode"] = trace_mode(run.events)
        if records and run.events is not None:  # analyze() keeps the events it analyzed
            # as a model file's run: `opscope analyze RUN/trace.json.gz` and `opscope whatif RUN` read the
            # lines and modules of the line step from the trace (without them no finding's fix has ops)
            embed(trace_path, make_block(run.events, window.module_classes, None))
        if calibration is not None:
            meta["calibration"] = calibration
        if threads_chosen is not None:
            meta["threads_chosen"] = threads_chosen
        meta["script"] = {"args": list(script.args), "steps_from": script.step_fn or "optimizer step",
                          "skip_steps": opts.warmup, "stopped_after_window": bool(script.stop_after and window.done),
                          "source_lines": "next step" if records else "none"}
        if finish is not None:
            finish(run, trace)
        write_run(run, out, path.stem, trace_path, base=reports)
    return run


def _run_script(path: Path, args: list[str], namespace: dict[str, Any] | None = None) -> str | None:
    """Runs the script to its end; returns how it ended itself early when it called os._exit(0)
    ("os._exit(0) at train.py:41"), else None. Raises TargetError when it failed."""
    try:
        run_as_main(path, args, namespace)
    except StopScript:
        return None
    except ScriptExited as exc:
        where = user_frame_of(exc)
        at = f" at {where}" if where else ""
        if exc.code == 0:
            return f"os._exit(0){at}"
        raise TargetError(f"the script exited with os._exit({exc.code!r}){at}; opscope stopped and wrote "
                          "nothing") from exc
    except SystemExit as exc:
        if exc.code in (None, 0):
            return None  # the script ended itself successfully
        where = user_frame_of(exc)
        raise TargetError(f"the script exited with sys.exit({exc.code!r})" + (f" at {where}" if where else "")
                          + "; opscope stopped and wrote nothing") from exc
    except Exception as exc:  # the script failed: one line naming its own frame
        where = user_frame_of(exc)
        raise TargetError(f"the script raised {describe_exception(exc)}" + (f" at {where}" if where else "")
                          + "; opscope stopped and wrote nothing") from exc
    return None


def _at(where: str) -> str:
    return f" (started at {where})" if where else ""


def _under_own_profiler(window: StepWindow) -> str:
    """Why no window was recorded when the script ran its own profiler; "" when it did not."""
    if not window.user_profiler_at:
        return ""
    after = window.boundaries - window.user_steps
    return (f"the script runs its own torch.profiler{_at(window.user_profiler_at)}, and torch runs one profiler at "
            f"a time: opscope let the script's profiler run ({window.user_steps} of the script's {window.boundaries} "
            f"steps ran under it) and profiled nothing, since {after} steps ran outside it where "
            f"--skip-steps {window.skip} + --steps {window.steps} = {window.skip + window.steps} are needed; remove "
            "the script's profiler, or lower --skip-steps/--steps")


def _too_few_steps(window: StepWindow, script: ScriptSpec, name: str) -> str:
    need = window.skip + window.steps
    what = f"calls of --step-fn {script.step_fn}" if script.step_fn else "optimizer steps"
    if window.boundaries == 0:
        how = ("--step-fn names a function the script never called" if script.step_fn else
               "the script never called optimizer.step() (name the step function with --step-fn MODULE:FUNC)")
        if script.auto:
            return (f"{name} is not a model file (looked for {ACCEPTED}), so it ran as a script, and {how}; "
                    "nothing was profiled")
        return f"no step seen: {how}; nothing was profiled"
    return (f"the script ended after {window.boundaries} {what}, before the profiled window was complete "
            f"(--skip-steps {window.skip} + --steps {window.steps} = {need}); lower them")
