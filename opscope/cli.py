"""The `opscope` command line: parse, call, print. Bad input raises OpscopeError, caught once in main()
and printed as one line on stderr with exit code 2 (the traceback only with --debug)."""

from __future__ import annotations

import json
import os
import sys
import traceback
from enum import Enum
from pathlib import Path

import typer
from rich.console import Console

from opscope import __version__
from opscope.errors import NotAvailableError, OpscopeError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Which PyTorch operators make your model slow, why, and what to do about it.",
)
stderr = Console(stderr=True, highlight=False)
_state = {"debug": False}


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


PEAK_BW = typer.Option(None, "--peak-bw", metavar="GBPS", help="Override the memory-bandwidth ceiling (GB/s).")
PEAK_FLOPS = typer.Option(
    None, "--peak-flops", metavar="[DTYPE=]GFLOPS",
    help="Override a FLOP/s ceiling (GFLOP/s); DTYPE one of float32, tfloat32, bfloat16, float16, float8. "
         "Without DTYPE it applies to every dtype. Repeatable.")
OUT = typer.Option(None, "--out", help="Run directory to create (must not exist or be empty).")
JSON_OUT = typer.Option(False, "--json", help="Print the run summary as one JSON document on stdout.")
DEBUG = typer.Option(False, "--debug", help="Show Python tracebacks for errors.")


def _warn(message: str, console: Console | None = None) -> None:
    from rich.text import Text

    text = Text("opscope: ", style="yellow") + Text(message.removeprefix("opscope: "))
    (console or stderr).print(text, highlight=False, soft_wrap=True)


class _RichProgress:
    """Phase progress on stderr. Never refreshes on its own: nothing runs during timed steps."""

    def __init__(self, console: Console) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = console
        self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=console, auto_refresh=False, transient=True)
        self.task = None

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


def _emit(run, json_out: bool, top: int) -> None:  # noqa: ANN001
    from opscope.run import dumps

    if json_out:
        sys.stdout.write(dumps(run.summary) + "\n")
        sys.stdout.flush()
        stderr.print(f"run directory: {run.path}")
        return
    from opscope.render.console import render_run

    render_run(run, Console(highlight=False), top=top)


@app.command()
def profile(
    target: Path = typer.Argument(..., help="Python file with the model (see README: accepted shapes)."),
    entry: str | None = typer.Option(None, "--entry", metavar="FUNC", help="Function returning (model, inputs)."),
    device: Device = typer.Option(Device.auto, "--device", help="auto = cuda when available, else cpu."),
    dtype: DType | None = typer.Option(None, "--dtype", help="Cast model and floating inputs (default: the model's own)."),
    mode: Mode = typer.Option(Mode.inference, "--mode", help="inference: forward only; train: + loss, backward, SGD step."),
    warmup: int = typer.Option(2, "--warmup", min=0, help="Untimed steps before profiling."),
    steps: int = typer.Option(5, "--steps", min=1, help="Profiled steps."),
    threads: int | None = typer.Option(None, "--threads", min=1, help="torch.set_num_threads for the run."),
    peak_bw: float | None = PEAK_BW,
    peak_flops: list[str] | None = PEAK_FLOPS,
    out: Path | None = OUT,
    top: int = typer.Option(15, "--top", min=1, help="Rows of the op table to print."),
    json_out: bool = JSON_OUT,
    debug: bool = DEBUG,
) -> None:
    """Profile a model file: per-op FLOPs, bytes, roofline and findings; writes a run directory."""
    _state["debug"] = debug
    from opscope.capture.torch_profiler import ProfileOptions, profile_target

    opts = ProfileOptions(target=target, entry=entry, device=device.value, dtype=dtype.value if dtype else None,
                          mode=mode.value, warmup=warmup, steps=steps, threads=threads, peak_bw=peak_bw,
                          peak_flops=list(peak_flops or []), out=out)
    with _RichProgress(stderr) as progress:
        run, _ = profile_target(opts, progress)
    _emit(run, json_out, top)


@app.command()
def analyze(
    trace: Path = typer.Argument(..., help="torch.profiler Chrome trace (.json or .json.gz)."),
    out: Path | None = OUT,
    json_out: bool = JSON_OUT,
    peak_bw: float | None = PEAK_BW,
    peak_flops: list[str] | None = PEAK_FLOPS,
    top: int = typer.Option(15, "--top", min=1, help="Rows of the op table to print."),
    debug: bool = DEBUG,
) -> None:
    """Analyze an existing torch.profiler trace (CPU, CUDA or ROCm) into a run directory."""
    _state["debug"] = debug
    from opscope.analysis.trace_file import analyze_trace_file

    run = analyze_trace_file(trace, out=out, peak_bw=peak_bw, peak_flops=list(peak_flops or []),
                             warn=_warn)
    _emit(run, json_out, top)


@app.command()
def report(
    run_dir: Path | None = typer.Argument(None, help="Run directory (default: the newest under reports/)."),
    html: bool = typer.Option(False, "--html", help="Write a self-contained HTML report (not available yet)."),
    top: int = typer.Option(15, "--top", min=1, help="Rows of the op table to print."),
    findings: int = typer.Option(10, "--findings", min=0, help="Findings to print."),
    json_out: bool = JSON_OUT,
    debug: bool = DEBUG,
) -> None:
    """Print a saved run: summary, top ops and findings."""
    _state["debug"] = debug
    if html:
        raise NotAvailableError("`opscope report --html` is not available yet: the HTML report arrives in a later release")
    from opscope.render.console import render_run
    from opscope.run import dumps, find_latest_run, read_run

    run = read_run(run_dir if run_dir is not None else find_latest_run())
    if json_out:
        sys.stdout.write(dumps(run.summary) + "\n")
        return
    render_run(run, Console(highlight=False), top=top, findings=findings)


@app.command()
def calibrate(
    threads: int | None = typer.Option(None, "--threads", min=1, help="Thread count to measure at."),
    json_out: bool = typer.Option(False, "--json", help="Print the measurement as JSON."),
    debug: bool = DEBUG,
) -> None:
    """Measure this machine's ceilings (memory bandwidth, GEMM FLOP/s per dtype) and cache them."""
    _state["debug"] = debug
    from opscope import calibrate as cal

    stderr.print("measuring memory bandwidth and GEMM throughput (about 20 s)…")
    calibration = cal.obtain(threads, quick=False, refresh=True, progress=_warn)
    if json_out:
        sys.stdout.write(json.dumps(calibration.result.to_json(), indent=2) + "\n")
    else:
        Console(highlight=False).print(cal.format_report(calibration.result), markup=False, soft_wrap=True)
    if calibration.path is None:
        stderr.print("not cached: unstable (the machine was busy; see the notes); the cache keeps what it had",
                     markup=False)
    else:
        reused = "another opscope process measured it meanwhile; " if calibration.how == "reused" else ""
        stderr.print(f"{reused}cached in {calibration.path}", markup=False)


_LATER = {
    "swap": "drops a bundled optimized kernel into your model, checks correctness and measures the speedup",
    "kernels": "lists the bundled CPU/Triton/CUDA kernels",
    "compare": "compares two run directories op by op",
}


def _not_yet(name: str):  # noqa: ANN202
    def command(ctx: typer.Context) -> None:
        raise NotAvailableError(f"`opscope {name}` is not available yet (it {_LATER[name]}); it arrives in a later release")

    command.__doc__ = f"Not available yet: {_LATER[name]}."
    return command


for _name in _LATER:
    app.command(_name, context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(_not_yet(_name))


def _version(value: bool) -> None:
    if value:
        typer.echo(f"opscope {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Show the version and exit.")) -> None:
    """Which PyTorch operators make your model slow, why, and what to do about it."""


def main() -> None:
    if "--debug" not in sys.argv:
        # libkineto prints "USDT: profiler_start/stop" lines on every profile; 6 silences them.
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    try:
        app()
    except OpscopeError as exc:
        if _state["debug"] or "--debug" in sys.argv:
            traceback.print_exc()
        message = str(exc).replace("\n", " ")
        stderr.print(f"opscope: error: {message}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
