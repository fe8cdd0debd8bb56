"""The run directory (CONTRACT.md): meta.json, ops.csv, findings.json, summary.json, trace.json.gz, and
modules.csv when the run has module paths (README, "Run directory format").

Written atomically: everything goes into a hidden temporary sibling which is renamed into place at the
end, so an interrupted run never leaves a directory that looks complete, and an existing run is never
overwritten.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opscope.errors import OpscopeError, OutputError
from opscope.table import Table, as_table, from_frame, nrows, to_frame

if TYPE_CHECKING:
    import pandas as pd

FORMAT_VERSION = 1
RUN_FILES = ("meta.json", "ops.csv", "findings.json", "summary.json", "trace.json.gz")
RANKS_FILE = "ranks.csv"  # merged runs of multi-process jobs only (opscope.analysis.ranks)
DEFAULT_REPORTS_DIR = Path("reports")
STAGING_PREFIX = ".opscope-run-"  # + pid + "-": a run being written, renamed into place when complete
# The working directory when opscope started: a model's code may change it, and paths are shown
# relative to where the user ran the command.
_START_CWD = Path.cwd()


def shown_path(path: Path) -> str:
    """`path` as the user should see it: relative to the starting directory when inside it."""
    path = Path(path)
    if not path.is_absolute():
        return str(path)
    try:
        return str(path.relative_to(_START_CWD))
    except ValueError:
        return str(path)


class _Tabular:
    """A table of a Run (ops, modules, ranks, events, kernels), held as given: an opscope.table Table, a
    pandas DataFrame or None. Reading the attribute gives a DataFrame, built from the Table on first
    access and kept: from then on the DataFrame is the run's table (callers edit run.ops in place, e.g.
    Nsight's measured columns). `<name>_table` (Run.table) gives a Table without importing pandas while
    no DataFrame was built."""

    def __init__(self, *, required: bool = False) -> None:
        self.required = required

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        self.slot = f"_{name}"

    def __get__(self, run: Run | None, owner: type | None = None) -> Any:
        if run is None:  # the dataclass asks for the field's default
            if self.required:
                raise AttributeError(self.name)
            return None
        held = run.__dict__.get(self.slot)
        if isinstance(held, dict):
            held = run.__dict__[self.slot] = to_frame(held)
        return held

    def __set__(self, run: Run, value: Any) -> None:
        run.__dict__[self.slot] = value


@dataclass(repr=False, eq=False)
class Run:
    """One run: what the run directory holds (and, in memory, the events and kernels it came from).
    ops, modules, ranks, events and kernels may be given as Tables (the analysis) or DataFrames (a run
    read back); run.ops etc. are DataFrames (_Tabular), run.ops_table etc. Tables."""

    meta: dict[str, Any]
    ops: pd.DataFrame = _Tabular(required=True)
    findings: list[dict[str, Any]]
    summary: dict[str, Any]
    path: Path | None = None
    events: pd.DataFrame | None = _Tabular()  # in-memory only; not written
    modules: pd.DataFrame | None = _Tabular()  # modules.csv (analysis.modules); None when the run has no modules
    # A run merged from the ranks of a multi-process job (opscope.analysis.ranks): ranks.csv, one row per
    # rank; None for a one-process run.
    ranks: pd.DataFrame | None = _Tabular()
    # in-memory only: the trace's kernels/memcpy/memset with the event that launched each ("op")
    kernels: pd.DataFrame | None = _Tabular()

    def table(self, name: str) -> Table | None:
        """The table `name` (ops, modules, ranks, events, kernels) as a Table: the one given, or the
        DataFrame's current content once one was built (opscope.table.from_frame). None when absent."""
        held = self.held(name)
        return None if held is None else as_table(held)

    def held(self, name: str) -> Table | pd.DataFrame | None:
        """The table `name` as held now (a Table or a DataFrame), converting nothing."""
        if name not in TABLES:
            raise KeyError(name)
        return self.__dict__.get(f"_{name}")

    @property
    def ops_table(self) -> Table:
        return self.table("ops")

    @property
    def modules_table(self) -> Table | None:
        return self.table("modules")

    @property
    def ranks_table(self) -> Table | None:
        return self.table("ranks")

    @property
    def events_table(self) -> Table | None:
        return self.table("events")

    @property
    def kernels_table(self) -> Table | None:
        return self.table("kernels")

    def copy_with(self, **changes: Any) -> Run:
        """A shallow copy with `changes` (as dataclasses.replace, but the tables are passed as held: no
        DataFrame is built for them)."""
        fields = {"meta": self.meta, "findings": self.findings, "summary": self.summary, "path": self.path,
                  **{name: self.held(name) for name in TABLES}}
        return Run(**{**fields, **changes})

    def __repr__(self) -> str:
        sizes = ", ".join(f"{name}={_rows(self.held(name))}" for name in TABLES if self.held(name) is not None)
        return f"Run(path={self.path!r}, {sizes}, findings={len(self.findings)})"


TABLES = ("ops", "modules", "ranks", "events", "kernels")


def _rows(held: Table | pd.DataFrame) -> str:
    return f"<{nrows(held) if isinstance(held, dict) else len(held)} rows>"


def check_out_dir(out: Path | None, base: Path | None = None) -> None:
    """Fails early (before any profiling or analysis) if the run cannot be written: `out` (or, without
    it, the reports folder `base`) must be creatable and writable, not inside a file, not a symlink
    that points nowhere, and (for `out`) empty and not a mount point. One OutputError line each."""
    if out is None:
        _check_writable_folder(base if base is not None else DEFAULT_REPORTS_DIR, "the reports folder")
        return
    if out.is_symlink() and not out.exists():
        raise OutputError(f"--out {out} is a symlink to nothing ({os.readlink(out)})")
    if out.exists():
        if not out.is_dir():
            raise OutputError(f"--out {out} exists and is not a directory")
        try:
            entries = any(out.iterdir())
        except OSError as exc:
            raise OutputError(f"--out {out} cannot be read: {exc.strerror or exc}") from exc
        if entries:
            raise OutputError(f"--out {out} already exists and is not empty; opscope never overwrites a run")
        if os.path.ismount(out):
            raise OutputError(f"--out {out} is a mount point: opscope builds a run beside its final place and "
                              "renames it in, which a mount point cannot take; give a directory inside it")
    _check_writable_folder(out.absolute().parent, f"--out {out}: its parent folder")


def _check_writable_folder(folder: Path, what: str) -> None:
    """The nearest existing ancestor of `folder` must be a directory we can create entries in; checked by
    creating (and removing) a probe directory, which also catches read-only file systems."""
    folder = folder.absolute()
    existing = folder
    while not existing.exists():
        if existing.is_symlink():
            raise OutputError(f"{what} {folder} goes through a symlink to nothing ({existing})")
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        raise OutputError(f"{what} {folder} cannot be created: {existing} is a file, not a folder")
    try:
        probe = tempfile.mkdtemp(prefix=".opscope-probe-", dir=existing)
        os.rmdir(probe)
    except OSError as exc:
        raise OutputError(f"{what} {folder} is not writable: {exc.strerror or exc}") from exc


def default_run_dir(stem: str, base: Path = DEFAULT_REPORTS_DIR, now: datetime | None = None) -> Path:
    """reports/<YYYYmmdd-HHMMSS>-<stem>/, with -2, -3, ... appended if taken. Only a suggestion: a
    concurrent run may take it first; write_run reserves the final name atomically."""
    return next(_run_dir_candidates(stem, base, now))


def _run_dir_candidates(stem: str, base: Path, now: datetime | None = None):
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in stem).lstrip(".") or "run"
    candidate = base / f"{stamp}-{safe}"
    k = 2
    while True:
        if not candidate.exists() and not candidate.is_symlink():
            yield candidate
        candidate = base / f"{stamp}-{safe}-{k}"
        k += 1


def _reserve(stem: str, base: Path) -> Path:
    """Creates the first free default run directory (empty) and returns it. mkdir is atomic, so two
    runs started in the same second get distinct names (-2, -3, ...)."""
    for candidate in _run_dir_candidates(stem, base):
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
    raise AssertionError("unreachable")


def _clean(value: Any) -> Any:
    """JSON-safe: NaN/inf -> null, numpy scalars -> Python."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


json_safe = _clean  # for other writers of JSON


def dumps(obj: Any) -> str:
    return json.dumps(_clean(obj), indent=2)


class TraceCompressor:
    """Gzips an uncompressed trace into `folder` on a background thread while analysis runs (zlib
    releases the GIL, so on a multi-core machine this costs no wall time). A gzipped regular file is
    copied as it is by write_run. A trace that is not a regular file (a pipe, /dev/stdin) can be read
    only once: pass its bytes as `data` and they are gzipped from memory."""

    def __init__(self, src: Path, folder: Path, data: bytes | bytearray | None = None) -> None:
        self.src = src
        self.data = data
        self.path: Path | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._made_folder: Path | None = None
        self._discarded = False
        if data is None:
            with open(src, "rb") as f:
                if f.read(2) == b"\x1f\x8b":
                    return
        if not folder.exists():
            self._made_folder = folder  # removed again by discard() if the run never lands there
        folder.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".trace-", suffix=".json.gz", dir=folder)
        self.path = Path(name)
        try:
            os.close(fd)
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        except BaseException:  # e.g. a signal right here: leave no temporary file
            self.discard()
            raise

    def _run(self) -> None:
        if self._discarded:  # discard() came while start() was still waiting for this thread
            return
        try:
            if self.data is not None:
                _gzip_bytes(self.data, self.path)
            else:
                _gzip_file(self.src, self.path)
        except BaseException as exc:  # re-raised in result()
            self._error = exc

    def result(self) -> tuple[Path, bool]:
        """(file to put in the run directory, whether it may be moved rather than copied)."""
        if self._thread is None:
            return self.src, False
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self.path, True

    def discard(self) -> None:
        """Removes the temporary file (and the folder this created, if still empty). Safe to interrupt:
        a signal during the join still removes the file (the thread may keep writing to the unlinked
        file until it ends)."""
        self._discarded = True
        try:
            if self._thread is not None:
                # RuntimeError: a signal interrupted start() before the thread ran; it is not running yet,
                # and when it does, _run sees _discarded and writes nothing
                with contextlib.suppress(RuntimeError):
                    self._thread.join()
        finally:
            if self.path is not None:
                with contextlib.suppress(OSError):
                    self.path.unlink()
            if self._made_folder is not None:
                with contextlib.suppress(OSError):
                    self._made_folder.rmdir()  # only if still empty: a failed run leaves no empty reports/


def _gzip_file(src: Path, dst: Path) -> None:
    import gzip

    level = 1 if src.stat().st_size > (64 << 20) else 6  # big traces: speed over a few % of size
    with open(src, "rb") as fi, gzip.open(dst, "wb", compresslevel=level) as fo:
        shutil.copyfileobj(fi, fo, 8 << 20)


def _gzip_bytes(data: bytes | bytearray, dst: Path) -> None:
    import gzip

    level = 1 if len(data) > (64 << 20) else 6
    with gzip.open(dst, "wb", compresslevel=level) as fo:
        view = memoryview(data)
        for i in range(0, len(view), 8 << 20):
            fo.write(view[i:i + (8 << 20)])


def write_csv(table: Table | pd.DataFrame, path: Path) -> None:
    """The table as CSV, byte for byte what `DataFrame.to_csv(path, index=False)` wrote (opscope's format
    before tables), without pandas: floats by repr, NaN and None empty, bools True/False, minimal
    quoting. A DataFrame is written through opscope.table.from_frame."""
    if not isinstance(table, dict):
        table = from_frame(table)
    columns = [[v if type(v) is str else _csv_cell(v) for v in values] for values in table.values()]
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow([str(c) for c in table])
        w.writerows(zip(*columns, strict=True))


def _csv_cell(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, float):  # np.float64 too; float.__repr__ keeps numpy's scalar repr out
        return "" if v != v else float.__repr__(v)
    pandas = sys.modules.get("pandas")  # pd.NA can only come from a DataFrame, so pandas is loaded then
    if pandas is not None and v is pandas.NA:
        return ""
    return v  # int, bool: csv writes str(v), as pandas did


def write_run(run: Run, out: Path | None, stem: str, trace_file: Path | None,
              compressor: TraceCompressor | None = None, base: Path | None = None,
              extra_files: dict[str, Path] | None = None, extra: Callable[[Path], None] | None = None,
              extra_texts: dict[str, str] | None = None) -> Path:
    """Writes the run directory atomically and returns its path. `trace_file` is copied (gzipped if it
    is not already) as trace.json.gz; a `compressor` already gzipping it takes its place. `extra_files`
    ({name in the run: source file}) are copied in too, `extra_texts` ({name: text}, e.g. swap.json)
    written, and `extra(folder)` adds files to the run while it is still hidden (a merged run's ranks/).
    Without `out` the run gets a fresh default name under `base` (default: ./reports). Any OSError (disk
    full, read-only file system, ...) is one OutputError line, with nothing left under the final name."""
    base = base if base is not None else DEFAULT_REPORTS_DIR
    if out is not None and out.is_symlink() and out.exists():
        out = out.resolve()  # a symlink to an empty directory: the run goes where it points
    folder = (out.absolute().parent if out is not None else base.absolute())
    tmp: Path | None = None
    reserved: Path | None = None
    try:
        if out is not None:
            check_out_dir(out)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-", dir=folder))
        (tmp / "meta.json").write_text(dumps(run.meta) + "\n")
        write_csv(run.ops_table, tmp / "ops.csv")
        modules = run.modules_table
        if modules is not None:
            write_csv(modules, tmp / "modules.csv")
        (tmp / "findings.json").write_text(dumps(run.findings) + "\n")
        (tmp / "summary.json").write_text(dumps(run.summary) + "\n")
        ranks = run.ranks_table
        if ranks is not None:
            write_csv(ranks, tmp / RANKS_FILE)
        for name, text in (extra_texts or {}).items():
            (tmp / name).write_text(text)
        if compressor is not None:
            src, movable = compressor.result()
            if movable:
                os.replace(src, tmp / "trace.json.gz")
            else:
                _copy_trace(src, tmp / "trace.json.gz")
        elif trace_file is not None:
            _copy_trace(trace_file, tmp / "trace.json.gz")
        for name, src in (extra_files or {}).items():
            shutil.copyfile(src, tmp / name)
        if extra is not None:
            extra(tmp)
        if out is not None:
            target = out
        else:
            target = reserved = _reserve(stem, folder)
        # rename(2) over an empty directory replaces it atomically: the run appears whole or not at all.
        os.replace(tmp, target)
        tmp = None
    except OSError as exc:
        _discard(tmp, reserved)
        where = out if out is not None else folder
        raise OutputError(f"cannot write the run directory under {where}: {exc.strerror or exc}") from exc
    except BaseException:
        _discard(tmp, reserved)
        raise
    run.path = target
    return target


def discard_staging(folders: list[Path], pid: int) -> None:
    """Removes what a killed process `pid` left while writing a run: its hidden staging directories."""
    for folder in folders:
        with contextlib.suppress(OSError):
            for path in folder.glob(f"{STAGING_PREFIX}{pid}-*"):
                shutil.rmtree(path, ignore_errors=True)


def _discard(tmp: Path | None, reserved: Path | None) -> None:
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
    if reserved is not None:
        with contextlib.suppress(OSError):
            reserved.rmdir()


def _copy_trace(src: Path, dst: Path) -> None:
    with open(src, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    if gz:
        shutil.copyfile(src, dst)
    else:
        _gzip_file(src, dst)


def find_latest_run(base: Path = DEFAULT_REPORTS_DIR) -> Path:
    try:
        runs = [p for p in base.glob("*") if p.is_dir() and not p.name.startswith(".") and (p / "summary.json").exists()]
        if not runs:
            raise OpscopeError(f"no runs under {base}/; run `opscope profile` or `opscope analyze` first")
        return max(runs, key=lambda p: (p / "summary.json").stat().st_mtime)
    except OSError as exc:
        raise OpscopeError(f"cannot read {base}/: {exc.strerror or exc}") from exc


def read_run(path: Path) -> Run:
    """Reads a run directory back, checking what the renderers rely on; anything damaged or of the wrong
    shape is one OpscopeError naming the file and what is wrong."""
    if not path.exists():
        raise OpscopeError(f"no such run directory: {path}")
    if not path.is_dir():
        raise OpscopeError(f"{path} is not a directory")
    missing = [f for f in RUN_FILES[:4] if not (path / f).is_file()]
    if missing:
        raise OpscopeError(f"{path} is not an opscope run directory (missing {', '.join(missing)})")
    meta = _read_json(path / "meta.json", dict)
    summary = _read_json(path / "summary.json", dict)
    findings = _read_json(path / "findings.json", list)
    _check_meta(path / "meta.json", meta)
    _check_summary(path / "summary.json", summary)
    _check_findings(path / "findings.json", findings)
    ops = read_ops_csv(path / "ops.csv")
    modules = read_modules_csv(path / "modules.csv")
    ranks = read_ranks_csv(path / RANKS_FILE) if (path / RANKS_FILE).is_file() else None
    return Run(meta=meta, ops=ops, findings=findings, summary=summary, path=path, modules=modules, ranks=ranks)


def _read_json(path: Path, kind: type) -> Any:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise OpscopeError(f"{path} is damaged: {_reason(exc)}") from exc
    if not isinstance(value, kind):
        raise OpscopeError(f"{path} is damaged: expected a JSON {'object' if kind is dict else 'list'}, "
                           f"got {type(value).__name__}")
    return value


def _reason(exc: BaseException) -> str:
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return text.splitlines()[0][:200]


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check(path: Path, ok: bool, what: str) -> None:
    if not ok:
        raise OpscopeError(f"{path} is damaged: {what}")


def _check_meta(path: Path, meta: dict[str, Any]) -> None:
    for key in ("target", "source"):
        _check(path, isinstance(meta.get(key, ""), str), f"{key!r} must be text")
    for key in ("mode", "dtype", "torch_version"):
        _check(path, meta.get(key) is None or isinstance(meta.get(key), str), f"{key!r} must be text or null")
    device = meta.get("device", {})
    _check(path, isinstance(device, dict) and all(isinstance(device.get(k, ""), str) for k in ("type", "name")),
           "'device' must be an object with text 'type' and 'name'")
    peaks = meta.get("peaks", {})
    _check(path, isinstance(peaks, dict), "'peaks' must be an object")
    bw = peaks.get("memory_bandwidth_gbps")
    _check(path, bw is None or (_is_num(bw) and bw > 0), "'peaks.memory_bandwidth_gbps' must be a positive number")
    flops = peaks.get("flops_gflops", {})
    _check(path, isinstance(flops, dict) and all(isinstance(k, str) and _is_num(v) and v > 0 for k, v in flops.items()),
           "'peaks.flops_gflops' must map dtype names to positive numbers")
    origin = peaks.get("origin", {})
    _check(path, isinstance(origin, dict) and all(isinstance(v, str) for v in origin.values()),
           "'peaks.origin' must map to text")
    calibration = meta.get("calibration")
    _check(path, calibration is None or (isinstance(calibration, dict) and all(
        isinstance(v, bool) for v in calibration.values())), "'calibration' must be an object of true/false")


def _check_summary(path: Path, summary: dict[str, Any]) -> None:
    steps = summary.get("steps", 1)
    _check(path, isinstance(steps, int) and not isinstance(steps, bool) and steps >= 0, "'steps' must be a whole number")
    for key in ("total_time_us", "step_time_us", "ops_covered_time_share", "step_time_us_p50",
                "step_time_us_max", "step_time_cv"):
        v = summary.get(key)
        _check(path, v is None or _is_num(v), f"{key!r} must be a number")
    noise = summary.get("noise")
    _check(path, noise is None or (
        isinstance(noise, dict) and _opt_num(noise.get("other_cpu_share"))
        and (noise.get("other_cpu_share") is None or 0 <= noise["other_cpu_share"] <= 1)
        and all(noise.get(k) is None or isinstance(noise.get(k), str) for k in ("verdict", "reason"))
        and all(_opt_num(noise.get(k)) for k in ("cores", "threads", "window_s"))),
        "'noise' must be an object with 'other_cpu_share' a share (0-1) or null and 'verdict', 'reason' text")
    busy = summary.get("device_busy_share")
    _check(path, busy is None or _is_num(busy), "'device_busy_share' must be a number")
    shares = summary.get("bound_time_share", {})
    _check(path, isinstance(shares, dict) and all(v is None or _is_num(v) for v in shares.values()),
           "'bound_time_share' must map bound classes to numbers")
    _check_gpu_summary(path, summary)


def _opt_num(v: Any) -> bool:
    return v is None or _is_num(v)


def _records(v: Any, numbers: tuple[str, ...], texts: tuple[str, ...]) -> bool:
    """A list of objects whose `numbers` keys are numbers (or null) and `texts` keys text (or null)."""
    return isinstance(v, list) and all(
        isinstance(r, dict) and all(_opt_num(r.get(k)) for k in numbers)
        and all(r.get(k) is None or isinstance(r.get(k), str) for k in texts) for r in v)


def _check_gpu_summary(path: Path, summary: dict[str, Any]) -> None:
    """The GPU timeline keys (opscope.analysis.gpu_timeline) the console reads."""
    for key in ("unattributed_time_share", "kernel_families_cover_share", "comm_compute_overlap_share"):
        _check(path, _opt_num(summary.get(key)), f"{key!r} must be a number or null")
    families = summary.get("kernel_family_time_share")
    _check(path, families is None or (isinstance(families, dict) and all(_opt_num(v) for v in families.values())),
           "'kernel_family_time_share' must map kernel families to numbers")
    graph = summary.get("graph_replay")
    launchers = graph.get("launchers") if isinstance(graph, dict) else None
    _check(path, graph is None or (
        isinstance(graph, dict)
        and all(_opt_num(graph.get(k)) for k in ("launches", "kernels", "kernel_time_share", "captured_time_share"))
        and (launchers is None or (isinstance(launchers, list) and all(isinstance(x, str) for x in launchers)))),
        "'graph_replay' must be an object of counts, shares and launcher names")
    streams = summary.get("streams")
    _check(path, streams is None or _records(streams, ("stream", "busy_us", "busy_share", "kernels"), ()),
           "'streams' must be a list of objects with numbers")
    gaps = summary.get("idle_gaps")
    _check(path, gaps is None or _records(gaps, ("start_us", "duration_us"),
                                          ("kernel_before", "kernel_after", "cpu_op", "cpu_source_location")),
           "'idle_gaps' must be a list of objects (times as numbers, names as text)")


def _check_findings(path: Path, findings: list[Any]) -> None:
    for i, f in enumerate(findings):
        _check(path, isinstance(f, dict), f"finding {i} is not an object")
        for key in ("rule", "severity", "message", "suggestion"):
            _check(path, isinstance(f.get(key), str), f"finding {i}: {key!r} must be text")
        for key in ("op", "source_location"):
            _check(path, f.get(key) is None or isinstance(f.get(key), str), f"finding {i}: {key!r} must be text")
        saving = f.get("est_savings_us")
        _check(path, saving is None or _is_num(saving), f"finding {i}: 'est_savings_us' must be a number or null")


TEXT_COLUMNS = ("op", "input_dims", "input_dtypes", "input_strides", "concrete_inputs", "source_location",
                "bound", "kernels", "family", "dtype", "ceiling", "note", "kernel_family", "launcher",
                "measured_kernels", "module", "module_class")
# The columns the renderers read as numbers; anything else in them makes the file damaged.
NUMBER_COLUMNS = ("calls", "time_us_total", "time_share", "flops_per_call", "bytes_per_call",
                  "arithmetic_intensity", "achieved_gflops", "achieved_gbps", "pct_peak_flops",
                  "pct_peak_bandwidth", "cpu_time_us_total", "time_us_per_call", "alloc_bytes_per_call",
                  "freed_bytes_per_call")
REQUIRED_COLUMNS = ("op", "calls", "time_us_total", "time_share")


def read_ops_csv(path: Path) -> pd.DataFrame:
    import pandas as pd

    try:
        head = pd.read_csv(path, nrows=0).columns
        dtypes = {c: str for c in TEXT_COLUMNS if c in head}
        df = pd.read_csv(path, dtype=dtypes, keep_default_na=False,
                         na_values={c: [""] for c in head if c not in dtypes})
    except (OSError, UnicodeDecodeError, ValueError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise OpscopeError(f"{path} is damaged: {_reason(exc)}") from exc
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    _check(path, not missing, f"missing column(s) {', '.join(missing)}")
    _numbers(path, df, NUMBER_COLUMNS)
    calls = df["calls"]
    _check(path, bool((calls.abs() < math.inf).all() and (calls >= 0).all()), "column 'calls' must hold counts")
    return df


# ranks.csv: text columns, and the columns the renderers read as numbers (README, "Run directory format").
RANKS_TEXT_COLUMNS = ("device", "run")
RANKS_NUMBER_COLUMNS = ("rank", "steps", "step_time_us", "op_time_us", "collective_time_us", "compute_time_us",
                        "idle_time_us", "comm_compute_overlap_share", "straggler")


def read_ranks_csv(path: Path) -> pd.DataFrame:
    """ranks.csv of a merged run, checked like ops.csv: damaged is one OpscopeError naming the file."""
    import pandas as pd

    try:
        df = pd.read_csv(path, dtype={c: str for c in RANKS_TEXT_COLUMNS}, keep_default_na=False,
                         na_values={c: [""] for c in RANKS_NUMBER_COLUMNS})
    except (OSError, UnicodeDecodeError, ValueError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise OpscopeError(f"{path} is damaged: {_reason(exc)}") from exc
    _check(path, "rank" in df.columns, "missing column 'rank'")
    _numbers(path, df, RANKS_NUMBER_COLUMNS)
    _check(path, bool(df["rank"].notna().all()), "column 'rank' must hold rank numbers")
    return df


def _numbers(path: Path, df: pd.DataFrame, columns: tuple[str, ...]) -> None:
    """Converts `columns` (those present) to floats in place; anything else in them makes the file damaged."""
    import pandas as pd

    for col in columns:
        if col in df.columns:
            values = pd.to_numeric(df[col], errors="coerce")
            bad = values.isna() & df[col].notna()
            _check(path, not bad.any(), f"column {col!r} holds non-numbers (row {int(bad.to_numpy().argmax()) + 1})")
            df[col] = values.astype(float)


MODULE_TEXT_COLUMNS = ("module", "module_class", "bound")
MODULE_NUMBER_COLUMNS = ("depth", "time_us_total", "time_share", "self_time_us", "flops_total", "bytes_total",
                         "findings")


def read_modules_csv(path: Path) -> pd.DataFrame | None:
    """modules.csv (analysis.modules.COLUMNS), or None when the run has none. It is derived from ops.csv
    and findings.json, so a damaged one is left out (the report shows everything else), not an error."""
    import pandas as pd

    if not path.is_file():
        return None
    try:
        head = pd.read_csv(path, nrows=0).columns
        dtypes = {c: str for c in MODULE_TEXT_COLUMNS if c in head}
        df = pd.read_csv(path, dtype=dtypes, keep_default_na=False,
                         na_values={c: [""] for c in head if c not in dtypes})
    except (OSError, UnicodeDecodeError, ValueError, pd.errors.ParserError, pd.errors.EmptyDataError):
        return None
    if any(c not in df.columns for c in MODULE_TEXT_COLUMNS + MODULE_NUMBER_COLUMNS):
        return None
    for col in MODULE_NUMBER_COLUMNS:
        values = pd.to_numeric(df[col], errors="coerce")
        if (values.isna() & df[col].notna()).any():
            return None
        df[col] = values.astype(float)
    return df
