"""A stand-in for the public API (opscope.api: analyze, load, compare, profile, swap) with only what the
MCP server uses, until that API is in this branch: each function keeps the API's name and arguments, and
its Run the attributes the server reads (internal, dir, swap, warnings). When opscope.api lands, the
server imports it instead and this file goes."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opscope.capture.options import Progress
from opscope.errors import OpscopeError
from opscope.run.compare import Comparison, compare_runs
from opscope.run.model import DEFAULT_REPORTS_DIR
from opscope.run.model import Run as TableRun
from opscope.run.read import read_run
from opscope.run.swap_results import read_swap


@dataclass
class Run:
    internal: TableRun
    warnings: list[str] = field(default_factory=list)

    @property
    def dir(self) -> Path | None:
        return self.internal.path

    @property
    def swap(self) -> dict[str, Any] | None:
        return read_swap(self.internal.path / "swap.json") if self.internal.path is not None else None


def load(run_dir: str | os.PathLike[str]) -> Run:
    return Run(read_run(Path(run_dir)))


def compare(a: Run | str | os.PathLike[str], b: Run | str | os.PathLike[str]) -> Comparison:
    return compare_runs(_table_run(a), _table_run(b))


def _table_run(run: Run | str | os.PathLike[str]) -> TableRun:
    return run.internal if isinstance(run, Run) else read_run(Path(run))


def analyze(trace: str | os.PathLike[str], *, out: str | os.PathLike[str] | None = None, peak_bw: float | None = None,
            peak_flops: list[str] | None = None, max_trace_gb: float | None = None,
            capture: str | os.PathLike[str] | None = None, torch_trace: str | os.PathLike[str] | None = None,
            inductor_cache: str | os.PathLike[str] | None = None, progress: Progress | None = None) -> Run:
    from opscope.analysis.trace_file import analyze_trace_file

    progress = progress or Progress()
    path = Path(trace)
    if path.is_dir():
        raise OpscopeError(f"{trace}: a folder of ranks is not analyzed here yet; give one trace file")
    warnings: list[str] = []

    def warn(message: str) -> None:
        warnings.append(message)
        progress.warn(message)

    progress.phase("analyze")
    run = analyze_trace_file(path, out=Path(out) if out else None, peak_bw=peak_bw, peak_flops=list(peak_flops or []),
                             warn=warn, max_trace_gb=max_trace_gb, capture=Path(capture) if capture else None,
                             torch_trace=Path(torch_trace) if torch_trace else None,
                             inductor_cache=Path(inductor_cache) if inductor_cache else None)
    assert run.path is not None  # a written run knows its directory
    return Run(read_run(run.path), warnings)


def _options(target: str | os.PathLike[str], *, entry: str | None, device: str, dtype: str | None, mode: str,
             warmup: int, steps: int, threads: int | None, peak_bw: float | None, peak_flops: list[str] | None,
             out: str | os.PathLike[str] | None, compile: str | None = None) -> Any:
    from opscope.machine.peaks import apply_overrides
    from opscope.run.write import check_out_dir
    from opscope.target.model_file import check_target_file
    from opscope.target.specs import ProfileOptions

    path = Path(target).absolute()
    out_path = Path(out).absolute() if out else None
    check_target_file(path)
    check_out_dir(out_path, DEFAULT_REPORTS_DIR.absolute())
    apply_overrides(None, peak_bw, list(peak_flops or []))
    return ProfileOptions(target=path, entry=entry, device=device, dtype=dtype, mode=mode, warmup=warmup, steps=steps,
                          threads=threads, peak_bw=peak_bw, peak_flops=list(peak_flops or []), out=out_path,
                          compile=compile)


def _supervised(module: str, job: Any, out: Path | None, progress: Progress | None, what: str) -> Run:
    from opscope.run.write import discard_staging
    from opscope.target.supervise import Listener, run_worker

    progress = progress or Progress()
    warnings: list[str] = []

    def warn(message: str) -> None:
        warnings.append(message)
        progress.warn(message)

    folders = [out.parent if out else DEFAULT_REPORTS_DIR.absolute()]
    listener = Listener(phase=progress.phase, advance=progress.advance, warn=warn)
    result = run_worker(module, job, listener, what=what, on_abort=lambda pid: discard_staging(folders, pid),
                        torch_trace=module == "opscope.capture.worker")
    return Run(read_run(Path(result["run_dir"])), warnings)


def profile(model_or_path: str | os.PathLike[str], inputs: Any = None, *, mode: str = "inference", steps: int = 5,
            warmup: int = 2, device: str = "auto", dtype: str | None = None, out: str | os.PathLike[str] | None = None,
            entry: str | None = None, compile: str | None = None, threads: int | None = None,
            peak_bw: float | None = None, peak_flops: list[str] | None = None,
            progress: Progress | None = None) -> Run:
    from opscope.target.specs import ProfileJob

    options = _options(model_or_path, entry=entry, device=device, dtype=dtype, mode=mode, warmup=warmup, steps=steps,
                       threads=threads, peak_bw=peak_bw, peak_flops=peak_flops, out=out, compile=compile)
    return _supervised("opscope.capture.worker", ProfileJob(options=options), options.out, progress,
                       "the model's code")


def swap(target_path: str | os.PathLike[str], *, kernels: list[str] | None = None, op: str | None = None,
         module: str | None = None, entry: str | None = None, device: str = "auto", dtype: str | None = None,
         mode: str = "inference", warmup: int = 2, steps: int = 5, repeats: int = 15, threads: int | None = None,
         out: str | os.PathLike[str] | None = None, progress: Progress | None = None) -> Run:
    from opscope.kernels.catalog import parse_requests
    from opscope.target.specs import SwapJob, SwapSpec

    if not kernels and (op is not None or module is not None):
        raise OpscopeError("op and module say what a user kernel replaces: give it as a kernel FILE.py:FUNC")
    requests = parse_requests(list(kernels), op, module) if kernels else None
    options = _options(target_path, entry=entry, device=device, dtype=dtype, mode=mode, warmup=warmup, steps=steps,
                       threads=threads, peak_bw=None, peak_flops=None, out=out)
    spec = SwapSpec(requests=[r.to_json() for r in requests] if requests is not None else None, repeats=repeats)
    return _supervised("opscope.swap.worker", SwapJob(options=options, swap=spec), options.out, progress,
                       "the code under test")
