"""Runs from files: analyze a trace (or Nsight file, or a folder of rank traces), load a run directory,
compare two runs. No torch, no pandas (the Nsight readers import pandas when an Nsight file is given)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from opscope.api.run import Run
from opscope.capture.options import Progress
from opscope.errors import OpscopeError
from opscope.limits import bounded, path_problem
from opscope.run.compare import Comparison
from opscope.trace.location import Url, local_path, url_of

PathLike = str | os.PathLike[str]


def user_path(value: PathLike | None, what: str = "") -> Path | None:
    """A path given by the user, refused in one line (OpscopeError) where the OS would refuse it. A
    file:// URL is the local path it names; other URLs are refused (only `analyze` reads them)."""
    location = _location(value)
    if isinstance(location, Url):
        raise OpscopeError(f"{location.shown}: reading {what or 'files'} from a URL is not supported; "
                           "copy it to a local file first")
    return location


def _location(value: PathLike | None) -> Path | Url | None:
    """A local path or a URL (opscope.trace.location), refused in one line where the OS would refuse
    the path."""
    if value is None:
        return None
    text = os.fspath(value)
    url = url_of(text)
    if url is not None:
        return url
    text = local_path(text)
    problem = path_problem(text)
    if problem is not None:
        raise OpscopeError(f"{bounded(text, 80)}: {problem}")
    return Path(text)


class KeptProgress(Progress):
    """Passes every call on to the caller's progress hook (if any) and keeps the warnings for the Run."""

    def __init__(self, inner: Progress | None = None) -> None:
        self.inner = inner or Progress()
        self.warnings: list[str] = []

    def phase(self, name: str, total: int | None = None) -> None:
        self.inner.phase(name, total)

    def advance(self, n: int = 1) -> None:
        self.inner.advance(n)

    def warn(self, message: str) -> None:
        self.warnings.append(message)
        self.inner.warn(message)


class _EventCounter:
    """Turns the reader's running count of decoded events into progress steps."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.seen = 0

    def __call__(self, n: int) -> None:
        self.progress.advance(n - self.seen)
        self.seen = n


def load(run_dir: PathLike | None = None) -> Run:
    """The run directory `run_dir` read back (default: the newest run under ./reports). Anything damaged
    is an OpscopeError naming the file."""
    from opscope.run.read import find_latest_run, read_run

    path = user_path(run_dir)
    return Run(read_run(path if path is not None else find_latest_run()))

def analyze(trace: PathLike, *, out: PathLike | None = None, peak_bw: float | None = None,
            peak_flops: Sequence[str] | str | None = None, max_trace_gb: float | None = None,
            capture: PathLike | None = None, nsys: PathLike | None = None, ncu: PathLike | None = None,
            torch_trace: PathLike | None = None, inductor_cache: PathLike | None = None,
            progress: Progress | None = None, workers: int | None = None, engine: str = "local",
            address: str | None = None, tables: bool = True) -> Run:
    """Analyzes a torch.profiler Chrome trace (.json/.json.gz; CPU, CUDA or ROCm), an Nsight file, or a
    folder of per-rank traces or run directories (merged into one run of the job), and writes the run
    directory (`out`, default a new folder under ./reports). As `opscope analyze`; the keyword arguments
    are its options (`peak_flops`: "GFLOPS" or "DTYPE=GFLOPS", one or a list).

    `capture`: a trace recorded while CUDA/HIP graphs were captured; `nsys`/`ncu`: Nsight measurements of
    the same model; `torch_trace`: the same run's TORCH_TRACE log (torch.compile's kernels costed and
    placed); `inductor_cache`: inductor's cache directory of the recording machine. `progress` receives
    the warnings as they come (they are also in `run.warnings`) and, for a folder, a phase "ranks" with
    one step per rank done.

    A folder's ranks: `workers` analyzed at once in worker processes (default: the usable cores, at most
    one per rank; 1: in this process); `engine="ray"`: each rank a Ray task (`pip install
    'opscope[ray]'`), on the cluster at `address` (else a local Ray of `workers` CPUs), a rank that fails
    twice named in the merged run's summary ("distributed" "failed_ranks"). The run is the same
    whichever.

    `tables`: a trace's run keeps its event and kernel tables in memory (`run.to_pandas("events")`,
    `"kernels"`); False frees them as the analysis goes, for less memory on a large trace (what `opscope
    analyze` does). The run directory is the same either way."""
    path = _location(trace)
    assert path is not None
    if isinstance(path, Url):
        from opscope.trace.location import url_info

        if url_info(path)[0] != "directory":
            if workers is not None or engine != "local" or address is not None:
                raise OpscopeError(f"{path.shown}: --workers/--engine/--address apply to a folder of ranks, "
                                   "not to one trace")
            return _analyze_url(path, out=user_path(out), peak_bw=peak_bw, peak_flops=peak_flops,
                                max_trace_gb=max_trace_gb, progress=progress, tables=tables,
                                others=(capture, nsys, ncu, torch_trace, inductor_cache))
    out_dir = user_path(out)
    capture_path, nsys_path, ncu_path = user_path(capture), user_path(nsys), user_path(ncu)
    torch_trace_path, cache_path = user_path(torch_trace), user_path(inductor_cache)
    flops = [peak_flops] if isinstance(peak_flops, str) else list(peak_flops or [])
    kept = KeptProgress(progress)
    warn = kept.warn
    if isinstance(path, Url) or path.is_dir():
        from opscope.analysis.ranks import analyze_rank_folder

        given = [f for f, v in (("capture", capture_path), ("nsys", nsys_path), ("ncu", ncu_path),
                                ("torch_trace", torch_trace_path), ("inductor_cache", cache_path)) if v is not None]
        if given:
            raise OpscopeError(f"--{'/--'.join(g.replace('_', '-') for g in given)} "
                               f"appl{'ies' if len(given) == 1 else 'y'} to one trace, not to a folder of ranks")
        if address is not None and engine != "ray":
            raise OpscopeError("--address is a Ray cluster's: it goes with --engine ray")
        if address is not None and workers is not None:
            raise OpscopeError("--workers sets a local Ray's CPUs; a Ray cluster (--address) uses its own")

        def ranks_done(done: int, total: int) -> None:
            if done == 0:
                kept.phase("ranks", total)
            else:
                kept.advance()

        return Run.written(analyze_rank_folder(path, out=out_dir, peak_bw=peak_bw, peak_flops=flops, warn=warn,
                                               max_trace_gb=max_trace_gb, workers=workers, engine=engine,
                                               address=address, on_rank=ranks_done), kept.warnings)
    if workers is not None or engine != "local" or address is not None:
        raise OpscopeError("--workers/--engine/--address apply to a folder of ranks, not to one trace")
    kept.phase("analyzing")
    # A plain trace imports neither pandas nor numpy (the Nsight modules do: imported only when used).
    from opscope.nsight.imports import check_measurement_files, nsight_kind

    if nsight_kind(path) is not None:
        from opscope.nsight.imports import analyze_nsight_file

        if any(v is not None for v in (nsys_path, ncu_path, capture_path, torch_trace_path, cache_path)):
            raise OpscopeError(f"--nsys/--ncu/--capture/--torch-trace/--inductor-cache go with a torch.profiler "
                               f"trace; {path} is itself an Nsight file (analyze each on its own)")
        return Run.written(analyze_nsight_file(path, out=out_dir, peak_bw=peak_bw, peak_flops=flops, warn=warn),
                   kept.warnings)
    check_measurement_files(nsys_path, ncu_path)
    if cache_path is not None and not cache_path.is_dir():
        raise OpscopeError(f"--inductor-cache {cache_path}: not a directory")
    from opscope.analysis.trace_file import analyze_trace_file

    with tempfile.TemporaryDirectory(prefix="opscope-nsight-") as tmp:
        measure = None
        if nsys_path is not None or ncu_path is not None:
            from opscope.nsight.imports import measurement_hook

            measure = measurement_hook(nsys_path, ncu_path, Path(tmp), warn)
        kept.phase("decoding events")
        data = analyze_trace_file(path, out=out_dir, peak_bw=peak_bw, peak_flops=flops, warn=warn,
                                  max_trace_gb=max_trace_gb, capture=capture_path, measure=measure,
                                  torch_trace=torch_trace_path, inductor_cache=cache_path,
                                  on_events=_EventCounter(kept), keep_tables=tables)
    return Run.written(data, kept.warnings)

def _analyze_url(url: Url, *, out: Path | None, peak_bw: float | None, peak_flops: Sequence[str] | str | None,
                 max_trace_gb: float | None, progress: Progress | None, others: tuple[PathLike | None, ...],
                 tables: bool = True) -> Run:
    """analyze() of a trace given by URL: streamed through fsspec (opscope.trace.location)."""
    if any(v is not None for v in others):
        raise OpscopeError(f"{url.shown}: --capture/--nsys/--ncu/--torch-trace/--inductor-cache go with a local trace; "
                           "copy the trace to a local file to use them")
    if url.name.endswith(_NSIGHT_SUFFIXES):
        raise OpscopeError(f"{url.shown}: Nsight files are read from local paths only; copy it to a local file first")
    flops = [peak_flops] if isinstance(peak_flops, str) else list(peak_flops or [])
    kept = KeptProgress(progress)
    kept.phase("decoding events")
    from opscope.analysis.trace_file import analyze_trace_file

    return Run.written(analyze_trace_file(url, out=out, peak_bw=peak_bw, peak_flops=flops, warn=kept.warn,
                                          max_trace_gb=max_trace_gb, on_events=_EventCounter(kept),
                                          keep_tables=tables), kept.warnings)


# Nsight's files, by name (a URL is not sniffed before it is read)
_NSIGHT_SUFFIXES = (".nsys-rep", ".qdrep", ".ncu-rep", ".sqlite")


def compare(a: Run | PathLike, b: Run | PathLike) -> Comparison:
    """Compares run B with the baseline A op by op (runs or run directories): step and op time, ops that
    appeared or vanished, modules, findings fixed and introduced; changes inside the runs' noise are
    marked as such. As `opscope compare`; `.to_json()` gives its JSON."""
    from opscope.run.compare import compare_runs

    return compare_runs(_run_of(a).internal, _run_of(b).internal)

def _run_of(value: Run | PathLike) -> Run:
    return value if isinstance(value, Run) else load(value)
