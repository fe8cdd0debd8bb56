"""The `opscope` command line: parse, call, print. Bad input raises OpscopeError, caught once in main()
and printed as one line on stderr with exit code 2 (the traceback only with --debug)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
import traceback
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.text import Text

from opscope.capture.options import Progress
from opscope.errors import OpscopeError
from opscope.heap import keep_large_blocks_apart
from opscope.machine.peaks import dtype_names
from opscope.version import __version__

if TYPE_CHECKING:
    from rich.progress import TaskID

    from opscope.api import Run as ApiRun
    from opscope.run.model import Run

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Which PyTorch operators make your model slow, why, and what to do about it.",
)
# The terminal's width is input too ($COLUMNS): at a billion columns a report took minutes and gigabytes,
# at 0 it printed nothing. Every console the commands print on is clamped to these.
MIN_WIDTH, MAX_WIDTH = 40, 1000


def _console(*, stderr: bool = False) -> Console:
    console = Console(stderr=stderr, highlight=False)
    console.width = min(max(console.width, MIN_WIDTH), MAX_WIDTH)
    return console


stderr = _console(stderr=True)
_state = {"debug": False}
# The run directory this command has put in place, once it is complete: an interruption after that (during
# the console report, or while the child exits) says where the run is, not "nothing was written".
_written: list[Path] = []


def _run_complete(path: Path | str | None) -> None:
    if path is not None:
        _written[:] = [Path(path)]


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class DType(str, Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class Mode(str, Enum):
    inference = "inference"
    train = "train"


class Engine(str, Enum):
    """Where the ranks of a folder are analyzed (opscope.analysis.engines)."""

    local = "local"
    ray = "ray"


class CompileMode(str, Enum):
    """torch.compile's modes (opscope.capture.compiled.COMPILE_MODES)."""

    default = "default"
    reduce_overhead = "reduce-overhead"
    max_autotune = "max-autotune"


def _user_path(value: str) -> Path:
    """A path argument, refused in one line where the OS would refuse it (a name over 255 bytes; every
    later stat, open or mkdir of it raised ENAMETOOLONG, in as many places)."""
    from opscope.limits import bounded, path_problem

    problem = path_problem(value)
    if problem is not None:
        raise OpscopeError(f"{bounded(value, 80)}: {problem}")
    return Path(value)


PEAK_BW = typer.Option(None, "--peak-bw", metavar="GBPS", help="Override the memory-bandwidth ceiling (GB/s).")
PEAK_FLOPS = typer.Option(
    None, "--peak-flops", metavar="[DTYPE=]GFLOPS",
    help="Override a FLOP/s ceiling (GFLOP/s); DTYPE one of " + dtype_names() + " (int8 in GOPS). "
         "Without DTYPE it applies to every dtype. Repeatable.")
OUT = typer.Option(None, "--out", parser=_user_path, help="Run directory to create (must not exist or be empty).")
JSON_OUT = typer.Option(False, "--json", help="Print the run summary as one JSON document on stdout.")
DEBUG = typer.Option(False, "--debug", help="Show Python tracebacks for errors.")
# Bounds on counts: far above any real use, far below what overflows torch's C++ ints.
MAX_THREADS = 4096
MAX_STEPS = 100_000
MAX_REPEAT = 1000


def _warn(message: str, console: Console | None = None) -> None:
    from rich.text import Text

    from opscope.render.text import clean

    text = Text("opscope: ", style="yellow") + Text(clean(message.removeprefix("opscope: ")))
    (console or stderr).print(text, highlight=False, soft_wrap=True)


class _WarnOnly(Progress):
    """Warnings on stderr, as they come; no progress bar (analysis is quick)."""

    def warn(self, message: str) -> None:
        _warn(message)


class _EventsProgress(Progress):
    """analyze's progress on stderr, on a terminal only: the events decoded so far and their rate
    (a trace of millions of events takes a while), redrawn at most 5 times a second."""

    def __init__(self, console: Console) -> None:
        from rich.progress import Progress, ProgressColumn, Task, TextColumn, TimeElapsedColumn
        from rich.text import Text

        class _Rate(ProgressColumn):
            def render(self, task: Task) -> Text:  # over the phase so far
                elapsed = task.elapsed
                speed = task.completed / elapsed if elapsed and task.completed else None
                return Text(f"{speed:,.0f} /s" if speed else "")

        class _Count(ProgressColumn):
            def render(self, task: Task) -> Text:  # "1,234" events; "3/32" ranks
                return Text(f"{task.completed:,.0f}" + (f"/{task.total:,.0f}" if task.total else ""))

        # rich keeps a sample per advance for its speed estimate, over 30 s by default: made while a batch of
        # events is decoded, one in each batch's small-object arenas held all of them (about 20 MiB of the 20x
        # scaling trace's reading); with no period, only the last is kept, and _Rate needs none
        self.bar = Progress(TextColumn("[bold]{task.description}"), _Count(), _Rate(),
                            TimeElapsedColumn(), console=console, auto_refresh=False, transient=True,
                            speed_estimate_period=0.0)
        self.task: TaskID | None = None
        self.shown = console.is_terminal
        self.drawn = 0.0

    def __enter__(self) -> _EventsProgress:
        if self.shown:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.shown:
            self.bar.stop()

    def phase(self, name: str, total: int | None = None) -> None:
        self.task = self.bar.add_task(name, total=total)

    def advance(self, n: int = 1) -> None:
        if self.task is None:
            return
        self.bar.advance(self.task, n)
        now = time.monotonic()
        if self.shown and now - self.drawn > 0.2:
            self.drawn = now
            self.bar.refresh()

    def warn(self, message: str) -> None:
        _warn(message, self.bar.console if self.shown else None)


class _RichProgress(Progress):
    """Phase progress on stderr. Never refreshes on its own: nothing runs during timed steps."""

    def __init__(self, console: Console) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = console
        self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=console, auto_refresh=False, transient=True)
        self.task: TaskID | None = None

    def __enter__(self) -> _RichProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def phase(self, name: str, total: int | None = None) -> None:
        if self.task is not None:
            self.bar.update(self.task, completed=self.bar.tasks[self.task].total or 1)
        self.task = self.bar.add_task(name, total=total if total else 1)
        self.bar.refresh()

    def advance(self, n: int = 1) -> None:
        if self.task is not None:
            self.bar.advance(self.task, n)
            self.bar.refresh()

    def warn(self, message: str) -> None:
        _warn(message, self.bar.console)
        self.bar.refresh()


def _emit(run: Run, json_out: bool, top: int) -> None:
    """Shows a run just written: its summary as JSON (and where it is, on stderr), or the console report."""
    from rich.text import Text

    from opscope.render.text import clean
    from opscope.run.model import shown_path
    from opscope.run.write import dumps

    _run_complete(run.path)
    if json_out:
        assert run.path is not None  # a written run knows its directory
        sys.stdout.write(dumps(run.summary) + "\n")
        sys.stdout.flush()
        stderr.print(Text(f"run directory: {clean(shown_path(run.path))}"), highlight=False)
        return
    from opscope.render.console import render_run

    render_run(run, _console(), top=top)


@app.command()
def profile(
    target: Path = typer.Argument(..., parser=_user_path, help="Python file with the model (see README: accepted shapes)."),
    entry: str | None = typer.Option(None, "--entry", metavar="FUNC", help="Function returning (model, inputs)."),
    device: Device = typer.Option(Device.auto, "--device", help="auto = cuda when available, else cpu."),
    dtype: DType | None = typer.Option(None, "--dtype", help="Cast model and floating inputs (default: the model's own)."),
    mode: Mode = typer.Option(Mode.inference, "--mode", help="inference: forward only; train: + loss, backward, SGD step."),
    warmup: int = typer.Option(2, "--warmup", "--skip-steps", min=0, max=MAX_STEPS,
                               help="Untimed steps before profiling (a script's first steps are skipped)."),
    steps: int = typer.Option(5, "--steps", min=1, max=MAX_STEPS, help="Profiled steps."),
    threads: int | None = typer.Option(None, "--threads", min=1, max=MAX_THREADS,
                                       help="torch.set_num_threads for the run."),
    peak_bw: float | None = PEAK_BW,
    peak_flops: list[str] | None = PEAK_FLOPS,
    out: Path | None = OUT,
    top: int = typer.Option(15, "--top", min=1, help="Rows of the op table to print."),
    try_swaps: bool = typer.Option(False, "--try-swaps", help="Also run `opscope swap` for every swap candidate "
                                                               "(bundled kernel matching an op) and add the results."),
    compile_mode: CompileMode | None = typer.Option(
        None, "--compile", metavar="MODE", help="torch.compile the model with this mode (default, reduce-overhead, "
        "max-autotune) before profiling it; the warm-up steps absorb the compilation."),
    nvtx: bool = typer.Option(False, "--nvtx", help="NVTX ranges around each profiled step and each top-level "
                              "module's forward, for Nsight tools (implied by --nsys/--ncu)."),
    nsys: bool = typer.Option(False, "--nsys", help="Also run the steps under Nsight Systems (nsys): measured "
                              "kernel timeline per op, module and step; keeps nsys.nsys-rep in the run."),
    nsys_args: str | None = typer.Option(None, "--nsys-args", metavar="ARGS",
                                         help="Extra `nsys profile` arguments, quoted as one string."),
    nvtx_ops: bool = typer.Option(False, "--nvtx-ops", help="With --nsys: every aten op an NVTX range "
                                  "(torch.autograd.profiler.emit_nvtx, with record_shapes=True); adds CPU time per op."),
    ncu: bool = typer.Option(False, "--ncu", help="Also measure the kernels of the heaviest op rows with Nsight "
                             "Compute (ncu): DRAM bytes, FLOPs and % of speed of light next to the modeled ones."),
    ncu_top: int = typer.Option(10, "--ncu-top", min=1, max=10_000, metavar="N",
                                help="With --ncu: measure the kernels of the N op rows with the most GPU time."),
    json_out: bool = JSON_OUT,
    debug: bool = DEBUG,
    script_args: list[str] | None = typer.Argument(
        None, metavar="[-- ARGS...]", help="Arguments for a script (script mode), after `--`."),
    script: bool = typer.Option(False, "--script", help="Run TARGET as a script even if it defines get_model/Model."),
    step_fn: str | None = typer.Option(
        None, "--step-fn", metavar="MODULE:FUNC",
        help="Script mode: a step is one call of this function (default: one optimizer step)."),
    stop_after: bool = typer.Option(False, "--stop-after", help="Script mode: stop the script after the window."),
    nproc_per_node: int | None = typer.Option(
        None, "--nproc-per-node", metavar="N", help="Run N processes (ranks) through torchrun; one run merges them."),
    nnodes: int = typer.Option(1, "--nnodes", metavar="M", help="Nodes of the job (torchrun)."),
    node_rank: int = typer.Option(0, "--node-rank", metavar="R", help="This node's rank (torchrun)."),
    master_addr: str | None = typer.Option(None, "--master-addr", metavar="A", help="Host of node 0 (torchrun)."),
    master_port: int | None = typer.Option(None, "--master-port", metavar="P", help="Port on node 0 (torchrun)."),
    repeat: int = typer.Option(1, "--repeat", min=1, max=MAX_REPEAT, metavar="N",
                               help="Profile N times, one run directory each (--out OUT: OUT/run-1 ... OUT/run-N): "
                                    "samples for `opscope baseline save` and `opscope gate`."),
) -> None:
    """Profile a model file, or an unmodified training script (`opscope profile train.py -- ARGS`), in one
    process or several (--nproc-per-node): per-op FLOPs, bytes, roofline and findings; writes a run
    directory."""
    _state["debug"] = debug
    from opscope.api import profile_file

    if repeat > 1:
        _profile_repeated(repeat, out, json_out, dict(
            target=target, entry=entry, device=device.value, dtype=dtype.value if dtype else None, mode=mode.value,
            warmup=warmup, steps=steps, threads=threads, peak_bw=peak_bw, peak_flops=list(peak_flops or []),
            compile=compile_mode.value if compile_mode is not None else None, try_swaps=try_swaps, nvtx=nvtx,
            nsys=nsys, nsys_args=nsys_args, ncu=ncu, ncu_top=ncu_top, nvtx_ops=nvtx_ops, script=script,
            script_args=list(script_args or []), step_fn=step_fn, stop_after=stop_after,
            nproc_per_node=nproc_per_node, nnodes=nnodes, node_rank=node_rank, master_addr=master_addr,
            master_port=master_port, debug=debug))
        return
    with _RichProgress(stderr) as progress:
        run = profile_file(target, entry=entry, device=device.value, dtype=dtype.value if dtype else None,
                           mode=mode.value, warmup=warmup, steps=steps, threads=threads, peak_bw=peak_bw,
                           peak_flops=list(peak_flops or []), out=out,
                           compile=compile_mode.value if compile_mode is not None else None, try_swaps=try_swaps,
                           nvtx=nvtx, nsys=nsys, nsys_args=nsys_args, ncu=ncu, ncu_top=ncu_top, nvtx_ops=nvtx_ops,
                           script=script, script_args=list(script_args or []), step_fn=step_fn,
                           stop_after=stop_after, nproc_per_node=nproc_per_node, nnodes=nnodes,
                           node_rank=node_rank, master_addr=master_addr, master_port=master_port, debug=debug,
                           progress=progress, on_written=_run_complete)
    _emit(run.internal, json_out, top)
    if try_swaps and not json_out:
        from opscope.render.console_report import swap_group
        from opscope.render.text import cleaned_run

        console = _console()
        section = swap_group(cleaned_run(run.internal), console.width)
        console.print(section if section is not None else Text("no swap candidates: no bundled kernel matches an op "
                                                               "of this model"))


def _profile_repeated(repeat: int, out: Path | None, json_out: bool, options: dict[str, Any]) -> None:
    """`profile --repeat N` (opscope.profile_repeated): one progress bar per run, one line per run (its
    directory on stdout, or its summary with --json)."""
    from rich.text import Text

    from opscope.api import profile_repeated
    from opscope.render.text import clean
    from opscope.run.model import shown_path
    from opscope.run.write import dumps

    def shown(i: int, run: ApiRun) -> None:
        assert run.dir is not None  # a profile writes its run
        if json_out:
            sys.stdout.write(dumps(run.summary) + "\n")
        else:
            sys.stdout.write(clean(shown_path(run.dir)) + "\n")
        sys.stdout.flush()
        step = run.summary.get("step_time_us_p50") or run.summary.get("step_time_us")
        noise = (run.summary.get("noise") or {}).get("verdict")
        stderr.print(Text(f"run {i}/{repeat}: {clean(shown_path(run.dir))}"
                          + (f"  step {step / 1000:.2f} ms" if isinstance(step, (int, float)) else "")
                          + (f"  ({noise})" if noise == "noisy" else "")), highlight=False)

    profile_repeated(options.pop("target"), repeat, out=out, progress=lambda i: _RichProgress(stderr),
                     on_written=_run_complete, on_run=shown, **options)


@app.command()
def analyze(
    trace: str = typer.Argument(..., help="torch.profiler Chrome trace (.json or .json.gz), an Nsight file "
                                "(.nsys-rep / nsys SQLite export, .ncu-rep / ncu CSV), or a folder of per-rank "
                                "traces or run directories to merge; a trace may be a URL (s3://, gs://, https://, "
                                "file://; needs fsspec)."),
    out: Path | None = OUT,
    json_out: bool = JSON_OUT,
    peak_bw: float | None = PEAK_BW,
    peak_flops: list[str] | None = PEAK_FLOPS,
    top: int = typer.Option(15, "--top", min=1, help="Rows of the op table to print."),
    max_trace_gb: float | None = typer.Option(
        None, "--max-trace-gb", metavar="GB", help="Refuse traces whose (decompressed) JSON is larger (default 4)."),
    capture: Path | None = typer.Option(
        None, "--capture", metavar="CAPTURE",
        parser=_user_path, help="A trace recorded while the replayed CUDA/HIP graphs were captured: maps replayed kernels to the ops "
             "and shapes that launched them."),
    nsys: Path | None = typer.Option(None, "--nsys", metavar="FILE",
                                     parser=_user_path, help="Attach an Nsight Systems report (.nsys-rep or SQLite) of the same model."),
    ncu: Path | None = typer.Option(None, "--ncu", metavar="FILE",
                                    parser=_user_path, help="Attach Nsight Compute measurements (.ncu-rep or CSV) of the same model."),
    torch_trace: Path | None = typer.Option(
        None, "--torch-trace", metavar="LOG", parser=_user_path,
        help="The same run's TORCH_TRACE log (a file, or a folder holding one): costs torch.compile's kernels from "
             "inductor's graph and places them at the user's lines and modules; compile findings."),
    inductor_cache: Path | None = typer.Option(
        None, "--inductor-cache", metavar="DIR", parser=_user_path,
        help="Inductor's cache directory of the recording machine (TORCHINDUCTOR_CACHE_DIR): its generated "
             "kernels say which buffers a Triton kernel overwrites in place."),
    workers: int | None = typer.Option(
        None, "--workers", min=1, metavar="N",
        help="A folder of ranks: ranks analyzed at once, in worker processes (default: the usable cores; 1: one "
             "after the other in this process). With --engine ray and no --address: the local Ray's CPUs."),
    engine: Engine = typer.Option(
        Engine.local, "--engine",
        help="A folder of ranks: where they are analyzed. ray: each rank a Ray task, on the cluster at --address "
             "(else a local Ray), merged here (pip install 'opscope[ray]')."),
    address: str | None = typer.Option(
        None, "--address", metavar="ADDR", help="With --engine ray: the Ray cluster's address (ray.init(address=...))."),
    debug: bool = DEBUG,
) -> None:
    """Analyze an existing torch.profiler trace (CPU, CUDA or ROCm), or Nsight results, into a run directory;
    a folder of per-rank traces (or a run's ranks/) into one merged run of the job."""
    _state["debug"] = debug
    from opscope.api import analyze as analyze_trace

    with _EventsProgress(stderr) as progress:  # events decoded (one trace), ranks done (a folder)
        run = analyze_trace(trace, out=out, peak_bw=peak_bw, peak_flops=list(peak_flops or []),
                            max_trace_gb=max_trace_gb, capture=capture, nsys=nsys, ncu=ncu, torch_trace=torch_trace,
                            inductor_cache=inductor_cache, progress=progress, workers=workers, engine=engine.value,
                            address=address, tables=False)  # nothing here reads the event tables: freed early
    _emit(run.analyzed, json_out, top)  # as analyzed, not as read back


@app.command()
def report(
    run_dir: Path | None = typer.Argument(None, parser=_user_path, help="Run directory (default: the newest under reports/)."),
    html: bool = typer.Option(False, "--html", help="Write a self-contained HTML report (default RUN_DIR/report.html)."),
    output: Path | None = typer.Option(None, "-o", "--output", metavar="FILE",
                                       parser=_user_path, help="Where --html writes the report: a new file (see --force)."),
    force: bool = typer.Option(False, "--force", help="With -o: replace FILE if it is an existing regular file."),
    baseline: Path | None = typer.Option(None, "--baseline", metavar="RUN0",
                                         parser=_user_path, help="Add the comparison with this earlier run directory."),
    top: int = typer.Option(15, "--top", min=1, help="Rows of the op table to print."),
    findings: int = typer.Option(10, "--findings", min=0, help="Findings to print."),
    tree: bool = typer.Option(False, "--tree", help="Print the inclusive module tree (modules.csv) instead."),
    fold: bool = typer.Option(True, "--fold/--no-fold",
                              help="With --tree: fold repeated blocks (h.0 ... h.11) into one line with their spread."),
    json_out: bool = JSON_OUT,
    debug: bool = DEBUG,
) -> None:
    """Print a saved run (summary, verdict, top ops, breakdowns, findings), or write it as one HTML file."""
    _state["debug"] = debug
    from opscope.api import compare as compare_runs
    from opscope.api import load
    from opscope.run.write import dumps

    if output is not None and not html:
        raise OpscopeError("-o/--output names the HTML file: use it with --html")
    if force and output is None:
        raise OpscopeError("--force lets -o replace an existing file: use it with --html -o FILE")
    loaded = load(run_dir)
    run = loaded.internal
    run_path = loaded.dir
    assert run_path is not None  # a loaded run knows its directory
    comparison = compare_runs(load(baseline), loaded) if baseline is not None else None
    if html:
        from rich.text import Text

        from opscope.render.html import default_html_path, write_html
        from opscope.render.text import clean
        from opscope.run.model import shown_path

        # the run's own report.html is rewritten by each call; any other file only with --force
        path = write_html(run, output if output is not None else default_html_path(run_path), comparison,
                          replace=force or output is None)
        _console().print(Text(f"report: {clean(shown_path(path))}"), soft_wrap=True)
        return
    if json_out:
        sys.stdout.write(dumps(run.summary if comparison is None else
                               {**run.summary, "comparison": comparison.to_json()}) + "\n")
        return
    if tree:
        from opscope.render.console_report import render_tree

        render_tree(run, _console(), fold=fold)
        return
    from opscope.render.console_report import render_report

    render_report(run, _console(), top=top, findings=findings, comparison=comparison)


@app.command()
def compare(
    run_a: Path = typer.Argument(..., parser=_user_path, help="The baseline run directory (A)."),
    run_b: Path = typer.Argument(..., parser=_user_path, help="The run to compare with it (B)."),
    fail_above: float | None = typer.Option(
        None, "--fail-above", metavar="RATIO",
        help="Exit 1 when B's step time is more than RATIO x A's (a CI regression gate, e.g. 1.10)."),
    top: int = typer.Option(15, "--top", min=1, help="Changed ops to print."),
    json_out: bool = typer.Option(False, "--json", help="Print the comparison as one JSON document on stdout."),
    debug: bool = DEBUG,
) -> None:
    """Compare two run directories op by op: time per op and in total, ops that appeared or vanished,
    findings fixed and introduced; changes inside the runs' noise are marked as such."""
    _state["debug"] = debug
    from opscope.api import compare as compare_runs
    from opscope.run.compare import regressed
    from opscope.run.write import dumps

    if fail_above is not None and not (fail_above > 0 and fail_above < float("inf")):
        raise OpscopeError(f"--fail-above must be a positive ratio such as 1.10, not {fail_above:g}")
    comparison = compare_runs(run_a, run_b)
    if fail_above is not None and comparison.step_ratio is None:
        raise OpscopeError("--fail-above needs the step time of both runs; one of them has none")
    if json_out:
        sys.stdout.write(dumps(comparison.to_json()) + "\n")
    else:
        from opscope.render.console_report import comparison_group

        console = _console()
        console.print(comparison_group(comparison, top, console.width))
    if fail_above is not None and regressed(comparison, fail_above):
        stderr.print(f"opscope: regression: B's step time is {comparison.step_ratio:.2f}x A's "
                      f"(more than --fail-above {fail_above:g})", markup=False, highlight=False)
        sys.exit(1)


@app.command()
def whatif(
    run_dir: Path = typer.Argument(..., parser=_user_path, help="Run directory (with its trace.json.gz)."),
    finding: list[str] | None = typer.Option(None, "--finding", metavar="ID",
                                              help="Apply this finding's fix (its findings.json id); repeatable."),
    all_findings: bool = typer.Option(False, "--all", help="Apply every finding's fix."),
    op_speedup: list[str] | None = typer.Option(
        None, "--op-speedup", metavar="OP=Nx",
        help="Divide an op's time by N ('aten::gelu=2x'), or everything in a module's ('module:encoder.layer.3=1.5x'); "
             "repeatable."),
    remove_gaps: bool = typer.Option(False, "--remove-gaps",
                                     help="Remove the host work CUDA graphs would replay (launch gaps)."),
    swap: list[str] | None = typer.Option(
        None, "--swap", metavar="LABEL", help="Apply a swap of the run's swap.json that passed verification (e.g. "
        "bias_gelu): the ops its kernel replaces at swap's measured time; repeatable."),
    top: int = typer.Option(10, "--top", min=1, help="Critical path segments to print."),
    json_out: bool = typer.Option(False, "--json", help="Print the what-if as one JSON document on stdout."),
    debug: bool = DEBUG,
) -> None:
    """Replay the step with fixes applied: the recorded and predicted step time, the new critical path,
    and each fix's marginal saving in the order to apply them."""
    _state["debug"] = debug
    from opscope.api import whatif as what_if
    from opscope.run.write import dumps

    result = what_if(run_dir, findings=finding or (), all=all_findings, op_speedups=op_speedup or (),
                     remove_gaps=remove_gaps, swaps=swap or ())
    if json_out:
        sys.stdout.write(dumps(result.to_json()) + "\n")
        return
    from opscope.render.whatif import render_whatif

    only_all = all_findings and not (finding or op_speedup or remove_gaps or swap)
    render_whatif(result.to_json(), _console(), top=top,
                  no_fix="no fix applied: the run has no findings (--all applies each finding's fix)" if only_all else None)


@app.command()
def calibrate(
    threads: int | None = typer.Option(None, "--threads", min=1, max=MAX_THREADS, help="Thread count to measure at."),
    json_out: bool = typer.Option(False, "--json", help="Print the measurement as JSON."),
    debug: bool = DEBUG,
) -> None:
    """Measure this machine's ceilings (memory bandwidth, GEMM FLOP/s per dtype) and cache them."""
    _state["debug"] = debug
    from opscope.machine import calibrate as cal

    stderr.print("measuring memory bandwidth and GEMM throughput (about 20 s)…")
    calibration = cal.obtain(threads, quick=False, refresh=True, progress=_warn)
    if json_out:
        sys.stdout.write(json.dumps(calibration.result.to_json(), indent=2) + "\n")
    else:
        _console().print(cal.format_report(calibration.result), markup=False, soft_wrap=True)
    if calibration.path is None:
        stderr.print("not cached: unstable (the machine was busy; see the notes); the cache keeps what it had",
                     markup=False)
    else:
        reused = "another opscope process measured it meanwhile; " if calibration.how == "reused" else ""
        stderr.print(f"{reused}cached in {calibration.path}", markup=False)


@app.command()
def kernels(
    name: str | None = typer.Argument(None, help="With --bench: only this kernel."),
    bench: bool = typer.Option(False, "--bench", help="Time the kernels against aten, eager and torch.compile."),
    tune: bool = typer.Option(False, "--tune", help="Pick each CPU kernel's grain size (--device cuda: each Triton "
                                                     "forward's launch) by measurement over its manifest's search "
                                                     "space, per shape class, and cache it (with --bench: before "
                                                     "timing each case)."),
    shape: list[str] = typer.Option([], "--shape", help="With --tune and NAME: a tensor argument's shape "
                                                       "(4096x4096), repeated in signature order; default: the "
                                                       "manifest's cases."),
    dtype: str = typer.Option("float32", "--dtype", help="With --tune --shape: the inputs' dtype."),
    repeats: int = typer.Option(15, "--repeats", min=3, help="Interleaved timed rounds per case."),
    quick: bool = typer.Option(False, "--quick", help="Shapes scaled down 16x per dim, no torch.compile (a smoke run)."),
    no_compile: bool = typer.Option(False, "--no-compile", help="Leave torch.compile out of the comparison."),
    scale: float | None = typer.Option(None, "--scale", min=0.001, max=16.0,
                                       help="Multiply every dim of the bench (or --tune) shapes (2: 4096x4096 -> 8192x8192, "
                                            "bandwidth-bound on a big GPU); --quick is 1/16."),
    device: Device = typer.Option(Device.cpu, "--device", help="With --bench: where to time; with --tune: cuda tunes "
                                                             "the Triton launches on the GPU (cuda needs a GPU)."),
    peak_bw: float | None = PEAK_BW,
    out: Path | None = typer.Option(None, "--out", parser=_user_path, help="Folder for kernels-bench.json/.csv "
                                                        "(default reports/kernels-bench-<time>)."),
    json_out: bool = typer.Option(False, "--json", help="Print the listing (or the benchmark) as JSON."),
    debug: bool = DEBUG,
) -> None:
    """List the bundled reference kernels (CPU C++, Triton, CUDA) and the backends usable here; --bench times them."""
    _state["debug"] = debug
    from opscope.kernels import listing as ks

    if name is not None:
        ks.find(name)
    if shape and not (tune and not bench):
        raise OpscopeError("--shape goes with --tune (without --bench): opscope kernels NAME --tune --shape 4096x4096")
    if tune and not bench:
        from opscope.kernels import bench as kb
        from opscope.render.kernels import tuning

        doc = kb.tune_run([name] if name else [], shape, dtype, progress=lambda m: _warn(m),
                           device="cuda" if device == Device.cuda else "cpu", scale=scale or 1.0)
        if doc["note"]:
            _warn(f"note: {doc['note']}")
        if json_out:
            sys.stdout.write(json.dumps(doc, indent=1) + "\n")
        else:
            tuning(doc, _console())
        return
    if not bench:
        doc = ks.listing()
        if json_out:
            sys.stdout.write(json.dumps(doc, indent=2) + "\n")
            return
        from opscope.render.kernels import listing

        listing(doc, _console())
        return
    import datetime as dt

    from opscope.kernels import bench as kb
    from reference_kernels import tuning as kt

    if kt.note():
        _warn(f"note: {kt.note()}")
    result = kb.run([name] if name else [], repeats=repeats, peak_gbps=peak_bw, compiled=not (quick or no_compile),
                    scale=scale if scale is not None else (1 / 16 if quick else 1.0), do_tune=tune, progress=lambda m: _warn(m),
                    device="cuda" if device == Device.cuda else "cpu")
    folder = out or Path("reports") / f"kernels-bench-{dt.datetime.now():%Y%m%d-%H%M%S}"
    jpath, _ = kb.save(result, folder)
    if json_out:
        sys.stdout.write(json.dumps(result, indent=1) + "\n")
    else:
        from opscope.render.kernels import benchmark

        benchmark(result, _console())
    stderr.print(f"results: {jpath} (and .csv)")


@app.command()
def swap(
    target: Path = typer.Argument(..., parser=_user_path, help="Python file with the model (as for `opscope profile`)."),
    kernel: list[str] | None = typer.Option(
        None, "--kernel", metavar="NAME|FILE.py:FUNC",
        help="A bundled kernel (see `opscope kernels`; a+b applies two together), `compile` (torch.compile of the "
             "whole model), or a user kernel FILE.py:FUNC with --op or --module. Repeatable. Without it: every "
             "bundled kernel that matches an op of the model's profile."),
    op: str | None = typer.Option(None, "--op", metavar="ATEN_OP",
                                  help="What a user kernel replaces: an aten op (aten::add.Tensor; aten::add for every "
                                       "overload) or torch.nn.functional.NAME."),
    module: str | None = typer.Option(None, "--module", metavar="CLASS_OR_NAME",
                                      help="What a user kernel replaces: modules by class name or qualified name "
                                           "(globs allowed); the kernel is called as FUNC(module, *args)."),
    entry: str | None = typer.Option(None, "--entry", metavar="FUNC", help="Function returning (model, inputs)."),
    device: Device = typer.Option(Device.auto, "--device", help="auto = cuda when available, else cpu."),
    dtype: DType | None = typer.Option(None, "--dtype", help="Cast model and floating inputs (default: the model's own)."),
    mode: Mode = typer.Option(Mode.inference, "--mode", help="inference: forward only; train: + loss, backward, SGD step "
                                                             "(verification compares the gradients too)."),
    warmup: int = typer.Option(2, "--warmup", min=0, max=MAX_STEPS, help="Untimed steps before profiling."),
    steps: int = typer.Option(5, "--steps", min=1, max=MAX_STEPS, help="Profiled steps."),
    repeats: int = typer.Option(15, "--repeats", min=5, max=1000, help="Most interleaved A/B rounds per timing."),
    threads: int | None = typer.Option(None, "--threads", min=1, max=MAX_THREADS,
                                       help="torch.set_num_threads for the run."),
    peak_bw: float | None = PEAK_BW,
    peak_flops: list[str] | None = PEAK_FLOPS,
    out: Path | None = OUT,
    json_out: bool = typer.Option(False, "--json", help="Print swap.json as one JSON document on stdout."),
    debug: bool = DEBUG,
) -> None:
    """Put a kernel in place of part of the model, verify the model is still right (outputs, gradients,
    the five custom-op traps), then measure the op-level and end-to-end speedup. Exit 1 when a
    verification fails or a kernel crashes."""
    _state["debug"] = debug
    from opscope.api import swap as swap_kernels

    with _RichProgress(stderr) as progress:
        swapped = swap_kernels(target, kernels=list(kernel or []), op=op, module=module, entry=entry,
                               device=device.value, dtype=dtype.value if dtype else None, mode=mode.value,
                               warmup=warmup, steps=steps, repeats=repeats, threads=threads, peak_bw=peak_bw,
                               peak_flops=list(peak_flops or []), out=out, debug=debug, progress=progress,
                               on_written=_run_complete)
    run_dir = swapped.dir
    assert run_dir is not None  # a swap writes its run
    from opscope.render.report_data import swap_results
    from opscope.render.text import clean, cleaned_run
    from opscope.run.model import shown_path
    from opscope.run.write import dumps

    run = swapped.internal
    doc = swap_results(run)
    if json_out:
        from opscope.run.swap_results import read_swap

        sys.stdout.write(dumps(read_swap(run_dir / "swap.json") or {"results": []}) + "\n")
        stderr.print(Text(f"run directory: {clean(shown_path(run_dir))}"), highlight=False)
    else:
        from opscope.render.console import summary_panel
        from opscope.render.console_report import swap_group

        console = _console()
        clean_run = cleaned_run(run)
        console.print(summary_panel(clean_run))
        section = swap_group(clean_run, console.width)
        console.print(section if section is not None else
                      Text("no swap candidates: no bundled kernel matches an op of this model (see `opscope kernels`)"))
        console.print(Text("run directory: ") + Text(clean(shown_path(run_dir)), style="bold"))
    failed = [r for r in (doc or {}).get("results", []) if r.get("status") == "failed"]
    if failed:
        stderr.print(Text(f"opscope: verification failed for {', '.join(clean(r['label']) for r in failed)}: no speedup "
                          f"reported for {'it' if len(failed) == 1 else 'them'}"), highlight=False, soft_wrap=True)
        sys.exit(1)


baseline_app = typer.Typer(no_args_is_help=True, help="Baselines for `opscope gate`: samples of runs, kept in a "
                                                       "small versioned file meant to be committed.")
app.add_typer(baseline_app, name="baseline")
BASELINE_DIR = typer.Option(Path(".opscope/baselines"), "--dir", metavar="DIR", parser=_user_path,
                            help="The folder of baselines (NAME.json in it).")


class GateFormat(str, Enum):
    console = "console"
    markdown = "markdown"
    junit = "junit"
    json = "json"


def _share(value: str) -> float:
    """'10%', '10' or '0.1' (a fraction when under 1 without %) as a fraction."""
    text = value.strip()
    try:
        if text.endswith("%"):
            return float(text[:-1]) / 100
        number = float(text)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not a share such as 10%") from None
    return number if number < 1 else number / 100


@baseline_app.command("save")
def baseline_save(
    runs: list[Path] = typer.Argument(..., parser=_user_path, help="Run directories of the same code (e.g. from "
                                                                   "`opscope profile --repeat 5`)."),
    name: str = typer.Option(..., "--name", help="The baseline's name (the file DIR/NAME.json)."),
    folder: Path = BASELINE_DIR,
    debug: bool = DEBUG,
) -> None:
    """Save the samples of runs as a baseline: each step's time, each op row's (op + line + shapes) and each
    module's time per run, the machine, its ceilings and the torch version."""
    _state["debug"] = debug
    from opscope.api import baseline_save as save
    from opscope.render.text import clean
    from opscope.run.model import shown_path

    path = save(runs, name, dir=folder)
    stderr.print(Text(f"baseline {clean(name)}: {len(runs)} run(s) in {clean(shown_path(path))}"), highlight=False)


@app.command()
def gate(
    runs: list[Path] = typer.Argument(..., parser=_user_path, help="Run directories to gate (one or more)."),
    baseline: str = typer.Option(..., "--baseline", metavar="NAME", help="The saved baseline (DIR/NAME.json)."),
    folder: Path = BASELINE_DIR,
    threshold: str = typer.Option("10%", "--threshold", metavar="SHARE",
                                  help="The smallest slowdown that fails: 10% fails what is significantly over 1.10x."),
    confidence: float = typer.Option(0.99, "--confidence", metavar="C", help="The tests' confidence (0.5 to 1)."),
    fmt: GateFormat = typer.Option(GateFormat.console, "--format", help="console, markdown ($GITHUB_STEP_SUMMARY, "
                                   "PR comments), junit (a testcase per gated item) or json."),
    output: Path | None = typer.Option(None, "--output", "-o", metavar="FILE", parser=_user_path,
                                       help="Write the report to FILE (replaced atomically) instead of stdout."),
    debug: bool = DEBUG,
) -> None:
    """Gate runs against a baseline: step time, op rows and modules tested (Mann-Whitney U past the threshold
    at the confidence), new op rows named with their line. Exit 1 on a regression, 0 otherwise, 2 on bad
    input."""
    _state["debug"] = debug
    from opscope.api import gate as gate_runs
    from opscope.gating.baseline import write_atomically
    from opscope.gating.formats import headline, render
    from opscope.render.text import clean

    result = gate_runs(runs, baseline, dir=folder, threshold=_share(threshold), confidence=confidence)
    text = render(result, fmt.value)
    if output is not None:
        write_atomically(output, text.encode("utf-8"))
        stderr.print(Text(clean(headline(result))), highlight=False, soft_wrap=True)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    if result.exit_code:
        sys.exit(result.exit_code)


@app.command()
def mcp(
    root: Path = typer.Option(..., "--root", metavar="DIR", parser=_user_path,
                              help="The folder the agent works in: model files, traces and runs; paths outside it "
                                   "are refused."),
    debug: bool = DEBUG,
) -> None:
    """Serve opscope to AI agents: a Model Context Protocol server on stdio (tools profile, analyze, top_ops,
    findings, modules, compare, swap, explain_op; runs as resources). Needs the extra: pip install
    'opscope[mcp]'."""
    _state["debug"] = debug
    try:
        from opscope.mcp.server import serve
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in ("mcp", "mcp_types"):
            raise
        raise OpscopeError("opscope mcp needs the MCP SDK: pip install 'opscope[mcp]'") from None
    serve(root, debug=debug)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"opscope {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Show the version and exit.")) -> None:
    """Which PyTorch operators make your model slow, why, and what to do about it."""


class Terminated(BaseException):
    """SIGINT, SIGTERM or SIGHUP, raised in the main thread, so that every `finally` and cleanup runs
    (temporary directories, half-written run directories, background gzip files). Not a
    KeyboardInterrupt: typer would turn that into a silent exit code."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.name = signal.Signals(signum).name


def _cleanup_on_signals() -> None:
    def stop(signum: int, frame: object) -> None:
        raise Terminated(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None:
            signal.signal(sig, stop)


def _what_was_written() -> str:
    """After an interruption: where the complete run is, if this command had put one in place."""
    from opscope.run.model import shown_path

    if _written and _written[0].is_dir():
        return (f"the run was already complete in {shown_path(_written[0])} (only printing it was cut short; "
                "`opscope report` shows it)")
    return "nothing was written"


def _fail(message: str, code: int = 2) -> None:
    from rich.text import Text

    from opscope.render.text import clean

    stderr.print(Text(f"opscope: error: {clean(message)}"), highlight=False, soft_wrap=True)
    sys.exit(code)


def main() -> None:
    """Entry point: every bad input (an OpscopeError, or a usage error such as a bad option value) is one
    line on stderr and exit 2; --debug adds the traceback."""
    keep_large_blocks_apart()  # this process's memory: a large trace's freed columns go back (opscope.heap)
    try:
        _main()
    except SystemExit as exc:
        _leave(exc.code)
    _leave(0)


def _leave(code: object) -> None:
    """Exit with `code`. After Ray ran in this process (--engine ray), without Python's shutdown: Ray's
    core worker threads can crash the interpreter's finalization (SIGSEGV, seen once in 15 Ctrl-Cs under
    load) after the command had finished and said so. Everything of ours is closed by then (run
    directories, workers, Ray itself in the engine's __exit__)."""
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"): Python prints it and exits 1
        print(code, file=sys.stderr)
        code = 1
    ray = sys.modules.get("ray")
    if ray is None:
        sys.exit(code)
    try:
        if ray.is_initialized():  # a cluster this command connected to and left connected: disconnect
            ray.shutdown()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more can be said there
                stream.flush()
        os._exit(code)


def _main() -> None:
    # typer (>= 0.16) vendors click; older releases use click itself.
    try:
        from typer._click import exceptions as click_errors
    except ImportError:
        from click import exceptions as click_errors  # type: ignore[no-redef, unused-ignore]

    if "--debug" not in sys.argv:
        # libkineto prints "USDT: profiler_start/stop" lines on every profile; 6 silences them.
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    debug = "--debug" in sys.argv
    _cleanup_on_signals()
    try:
        code = app(standalone_mode=False, prog_name="opscope")
    except OpscopeError as exc:
        if _state["debug"] or debug:
            traceback.print_exc()
        _fail(str(exc), exc.exit_code)
    except click_errors.NoArgsIsHelpError as exc:  # `opscope` alone: the help text, as before
        stderr.print(exc.ctx.get_help() if exc.ctx is not None else "", markup=False, highlight=False)
        sys.exit(2)
    except click_errors.UsageError as exc:
        if debug:
            traceback.print_exc()
        where = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
        _fail(f"{exc.format_message()}{where}", 2)
    except Terminated as exc:
        _fail(f"{'interrupted' if exc.signum == signal.SIGINT else 'stopped'} by {exc.name}; {_what_was_written()}",
              128 + exc.signum)
    except (typer.Abort, KeyboardInterrupt):
        _fail(f"interrupted; {_what_was_written()}", 130)
    except click_errors.ClickException as exc:
        _fail(exc.format_message(), exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
