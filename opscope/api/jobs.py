"""Model files and scripts profiled in a supervised child process (opscope.target.supervise), as the CLI
does: the user's code runs apart from the caller's process, so that its crash, exit or changes to the
process (threads, working directory, sys.path, signals) cannot touch the caller. `profile` and `swap` of
a file, with every option of `opscope profile` / `opscope swap`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opscope.api.files import KeptProgress, PathLike, user_path
from opscope.api.run import Run
from opscope.capture.options import Progress
from opscope.errors import OpscopeError

if TYPE_CHECKING:
    from opscope.target.specs import Job, ProfileOptions

def _flops(peak_flops: Sequence[str] | str | None) -> list[str]:
    return [peak_flops] if isinstance(peak_flops, str) else list(peak_flops or [])


def profile_options(target: Path, *, check_file: bool = True, entry: str | None, device: str, dtype: str | None, mode: str, warmup: int,
                    steps: int, threads: int | None, peak_bw: float | None, peak_flops: Sequence[str] | str | None,
                    out: Path | None, debug: bool = False) -> ProfileOptions:
    """The options of a child's job, after every check that needs no torch (so that they are one line
    before the child starts and imports torch). `check_file`: `target` is a file to load (else it only
    names the run: a model object of the caller's)."""
    from opscope.machine.peaks import apply_overrides
    from opscope.run.model import DEFAULT_REPORTS_DIR
    from opscope.run.write import check_out_dir
    from opscope.target.model_file import check_target_file
    from opscope.target.specs import ProfileOptions

    if device not in ("auto", "cpu", "cuda"):
        raise OpscopeError(f"device must be auto, cpu or cuda; got {device!r}")
    if dtype not in (None, "float32", "bfloat16", "float16"):
        raise OpscopeError(f"dtype must be float32, bfloat16 or float16; got {dtype!r}")
    if mode not in ("inference", "train"):
        raise OpscopeError(f"mode must be inference or train; got {mode!r}")
    if steps < 1 or warmup < 0:
        raise OpscopeError("steps must be at least 1 and warmup 0 or more")
    if threads is not None and threads < 1:
        raise OpscopeError("threads must be at least 1")
    if check_file:
        check_target_file(target)
    check_out_dir(out.absolute() if out else None, DEFAULT_REPORTS_DIR.absolute())
    apply_overrides(None, peak_bw, _flops(peak_flops))  # a bad peak is one line now, not later
    return ProfileOptions(target=target.absolute() if check_file else target, entry=entry, device=device, dtype=dtype, mode=mode,
                          warmup=warmup, steps=steps, threads=threads, peak_bw=peak_bw,
                          peak_flops=_flops(peak_flops), out=out.absolute() if out else None, debug=debug)


def run_job(module: str, job: Job, out: Path | None, progress: Progress | None = None, *, torch_trace: bool = False,
            on_written: Callable[[Path], None] | None = None) -> Path:
    """Runs the child `module` (opscope.capture.worker, opscope.swap.worker) with `job` under supervision
    and returns the run directory it wrote. Whatever the child left half-written is removed when it
    fails. `on_written(path)` is called as soon as the child reports its run complete."""
    from opscope.run.model import DEFAULT_REPORTS_DIR
    from opscope.run.write import discard_staging
    from opscope.target.specs import ProfileJob, SwapJob
    from opscope.target.supervise import Listener, WorkerCrashed, run_worker

    progress = progress or Progress()
    folders = [out.absolute().parent if out else DEFAULT_REPORTS_DIR.absolute()]
    phases: list[str] = []

    def phase(name: str, total: int | None) -> None:
        phases.append(name)
        progress.phase(name, total)

    def done(result: dict[str, Any]) -> None:
        if on_written is not None and result.get("run_dir"):
            on_written(Path(result["run_dir"]))

    listener = Listener(phase=phase, advance=progress.advance, warn=progress.warn, done=done)
    script = isinstance(job, ProfileJob) and job.script is not None
    try:
        result = run_worker(module, job, listener,
                            what="the code under test" if isinstance(job, SwapJob) else
                                 "the script" if script else "the model's code",
                            on_abort=lambda pid: discard_staging(folders, pid), forward_stdin=script,
                            torch_trace=torch_trace)
    except WorkerCrashed as exc:
        from opscope.swap.worker import PHASE_PREFIX

        if phases and phases[-1].startswith(PHASE_PREFIX):  # a swapped kernel crashed: a failed check
            exc.exit_code = 1
        raise
    return Path(result["run_dir"])


def profile_file(target: PathLike, *, entry: str | None = None, device: str = "auto", dtype: str | None = None,
                 mode: str = "inference", warmup: int = 2, steps: int = 5, threads: int | None = None,
                 peak_bw: float | None = None, peak_flops: Sequence[str] | str | None = None,
                 out: PathLike | None = None, compile: str | None = None, try_swaps: bool = False,
                 nvtx: bool = False, nsys: bool = False, nsys_args: str | None = None, ncu: bool = False,
                 ncu_top: int = 10, nvtx_ops: bool = False, script: bool = False,
                 script_args: Sequence[str] = (), step_fn: str | None = None, stop_after: bool = False,
                 nproc_per_node: int | None = None, nnodes: int = 1, node_rank: int = 0,
                 master_addr: str | None = None, master_port: int | None = None, debug: bool = False,
                 progress: Progress | None = None, on_written: Callable[[Path], None] | None = None) -> Run:
    """`opscope profile TARGET`: a model file (get_model/get_inputs, KernelBench's Model, or --entry) or an
    unmodified training script, in a supervised child process, in one process or several (torchrun);
    every keyword is the CLI option of the same name. Returns the run it wrote."""
    from opscope.nsight.commands import split_tool_args
    from opscope.nsight.session import NsightRequest, check_request
    from opscope.target.jobs import check_tool_options, launch_spec, script_spec
    from opscope.target.specs import ProfileJob, SwapJob, SwapSpec

    path = user_path(target)
    assert path is not None
    out_dir = user_path(out)
    options = profile_options(path, entry=entry, device=device, dtype=dtype, mode=mode, warmup=warmup,
                              steps=steps, threads=threads, peak_bw=peak_bw, peak_flops=peak_flops, out=out_dir,
                              debug=debug)
    job_script = script_spec(path, script=script, entry=entry, args=list(script_args), step_fn=step_fn,
                             stop_after=stop_after, dtype=dtype, mode=mode)
    job_launch = launch_spec(nproc_per_node, nnodes, node_rank, master_addr, master_port)
    check_tool_options(job_script, job_launch, nsys=nsys, ncu=ncu, nvtx=nvtx)
    if compile is not None:
        from opscope.capture.compiled import COMPILE_MODES

        if compile not in COMPILE_MODES:
            raise OpscopeError(f"--compile must be one of {', '.join(COMPILE_MODES)}; got {compile!r}")
        if job_script is not None:
            raise OpscopeError("--compile applies to a model file (get_model/Model + get_inputs), not to a script "
                               "(script mode): a script calls torch.compile itself")
        if job_launch is not None:
            raise OpscopeError("--compile does not apply to --nproc-per-node yet: return torch.compile(model) from "
                               "get_model() instead")
        if try_swaps:
            raise OpscopeError("--try-swaps cannot be combined with --compile: a swap replaces an op of the eager "
                               "model; run them as two profiles")
        options.compile = compile
    if try_swaps and (job_script or job_launch):
        raise OpscopeError("--try-swaps works on a model file in one process: run `opscope swap` on the model "
                           "file" + (" instead of the script" if job_script else ", without --nproc-per-node"))
    if nsys_args is not None and not nsys:
        raise OpscopeError("--nsys-args passes arguments to nsys: use it with --nsys")
    nsight = NsightRequest(nsys=nsys, nsys_args=split_tool_args(nsys_args, "--nsys-args"), ncu=ncu,
                           ncu_top=ncu_top, nvtx_ops=nvtx_ops)
    if try_swaps and nsight.wanted:
        raise OpscopeError("--try-swaps cannot be combined with --nsys/--ncu yet: run them as two profiles")
    tools = check_request(nsight, device)  # GPU, tools on PATH, flags: before anything runs
    options.nvtx = nvtx or nsight.wanted
    kept = KeptProgress(progress)
    if nsight.wanted:
        from opscope.nsight.session import profile_with_nsight
        from opscope.run.model import DEFAULT_REPORTS_DIR
        from opscope.run.write import discard_staging
        from opscope.target.supervise import Listener

        folders = [out_dir.absolute().parent if out_dir else DEFAULT_REPORTS_DIR.absolute()]
        listener = Listener(phase=kept.phase, advance=kept.advance, warn=kept.warn)
        run_dir = profile_with_nsight(options, nsight, tools, listener, out=out_dir.absolute() if out_dir else None,
                                      reports=DEFAULT_REPORTS_DIR.absolute(), stem=path.stem,
                                      on_abort=lambda pid: discard_staging(folders, pid))
    elif try_swaps:
        run_dir = run_job("opscope.swap.worker", SwapJob(options=options, swap=SwapSpec()), out_dir, kept,
                          on_written=on_written)
    else:
        job = ProfileJob(options=options, script=job_script, launch=job_launch)
        # a model file in one process: torch.compile's log (TORCH_TRACE) costs nothing unless the model compiles
        run_dir = run_job("opscope.capture.worker", job, out_dir, kept,
                          torch_trace=job_script is None and job_launch is None, on_written=on_written)
    if on_written is not None:
        on_written(run_dir)
    from opscope.run.read import read_run

    return Run(read_run(run_dir), kept.warnings)


def profile_repeated(target: PathLike, repeat: int, *, out: PathLike | None = None,
                     progress: Progress | Callable[[int], AbstractContextManager[Progress]] | None = None,
                     on_run: Callable[[int, Run], None] | None = None, **options: Any) -> list[Run]:
    """`opscope profile TARGET --repeat N`: `repeat` profiles of the same target, one after the other, each a
    separate profile (its own child process) and run directory: OUT/run-1 ... OUT/run-N with `out` (which must
    not exist or be empty: opscope never overwrites a run), else new folders under ./reports. Samples for
    `baseline_save` and `gate`. `options`: profile_file's keywords (entry, device, steps, threads, ...), the
    same for every run.

    progress: a Progress for every run, or a function of the run's number (1 to N) giving a context manager
    that yields that run's Progress (the CLI's progress bar, one per run). on_run(i, run) is called as each
    run is written (the CLI prints its folder). Returns the runs in order."""
    if repeat < 1:
        raise OpscopeError(f"--repeat must be at least 1; got {repeat}")
    out_dir = user_path(out)
    # checked before the first run: a clash found at run 2 would leave half a set behind
    if out_dir is not None and out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise OpscopeError(f"--out {out_dir} already exists and is not empty; opscope never overwrites a run")
    runs: list[Run] = []
    for i in range(1, repeat + 1):
        shown: AbstractContextManager[Progress | None] = (
            nullcontext(progress) if progress is None or isinstance(progress, Progress) else progress(i))
        with shown as each:
            run = profile_file(target, out=None if out_dir is None else out_dir / f"run-{i}", progress=each,
                               **options)
        runs.append(run)
        if on_run is not None:
            on_run(i, run)
    return runs


def swap(target: PathLike, *, kernels: Sequence[str] | None = None, op: str | None = None,
         module: str | None = None, entry: str | None = None, device: str = "auto", dtype: str | None = None,
         mode: str = "inference", warmup: int = 2, steps: int = 5, repeats: int = 15, threads: int | None = None,
         peak_bw: float | None = None, peak_flops: Sequence[str] | str | None = None, out: PathLike | None = None,
         debug: bool = False, progress: Progress | None = None,
         on_written: Callable[[Path], None] | None = None) -> Run:
    """`opscope swap TARGET`: puts kernels in place of part of the model file's model (bundled kernels by
    name, `compile`, or a user kernel "FILE.py:FUNC" with `op` or `module`; default: every bundled kernel
    matching an op of the profile), verifies the model is still right (outputs, gradients, the five
    custom-op traps) and measures the op-level and end-to-end speedup, in a supervised child process.
    Returns the run; `run.swap` holds swap.json (a failed verification has status "failed")."""
    from opscope.kernels.catalog import parse_requests
    from opscope.target.specs import SwapJob, SwapSpec

    if not 5 <= repeats <= 1000:
        raise OpscopeError(f"repeats must be between 5 and 1000; got {repeats}")
    requests = parse_requests(list(kernels), op, module) if kernels else None
    if not kernels and (op is not None or module is not None):
        raise OpscopeError("--op and --module say what a user kernel replaces: give it with --kernel FILE.py:FUNC")
    path = user_path(target)
    assert path is not None
    out_dir = user_path(out)
    options = profile_options(path, entry=entry, device=device, dtype=dtype, mode=mode, warmup=warmup, steps=steps,
                              threads=threads, peak_bw=peak_bw, peak_flops=peak_flops, out=out_dir, debug=debug)
    swaps = SwapSpec(requests=[r.to_json() for r in requests] if requests is not None else None, repeats=repeats)
    kept = KeptProgress(progress)
    run_dir = run_job("opscope.swap.worker", SwapJob(options=options, swap=swaps), out_dir, kept, on_written=on_written)
    if on_written is not None:
        on_written(run_dir)
    from opscope.run.read import read_run

    return Run(read_run(run_dir), kept.warnings)
