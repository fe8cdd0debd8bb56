"""`opscope analyze` of Nsight results recorded elsewhere. Torch-free.

- FILE.sqlite / FILE.nsys-rep (Nsight Systems; a .nsys-rep is exported with `nsys export` first): the
  report becomes a trace (opscope.nsight.nsys_sqlite.to_trace_data) and gets the whole analysis: rows
  from its NVTX op ranges, kernel time per op, steps, GPU busy share, findings; nsys_kernels.csv.
- FILE.csv / FILE.ncu-rep (Nsight Compute; a .ncu-rep is converted with `ncu --import ... --csv`): one
  row per kernel with its measured time, DRAM bytes, FLOPs and speed of light (no PyTorch op, so no cost
  model).
- TRACE.json[.gz] with --nsys FILE and/or --ncu FILE: the trace's analysis with the measurements
  attached to its op rows (as `opscope profile --nsys/--ncu` does).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from opscope.errors import NsightError
from opscope.nsight.commands import last_error_line, ncu_import_command, tool_for_file
from opscope.run.model import DEFAULT_REPORTS_DIR, Run
from opscope.run.schema import FORMAT_VERSION
from opscope.run.write import check_out_dir, write_csv, write_run
from opscope.table import Table, largest_first, nrows

if TYPE_CHECKING:
    from opscope.nsight.ncu_csv import NcuTable

# Only nsight_kind and check_measurement_files run on `opscope analyze TRACE` without Nsight files: the
# modules that read and attach Nsight results are imported by the functions that use them.
TRACE_SUFFIXES = (".json", ".json.gz")

NSYS_BYTES_NOTE = "NVTX op ranges record sizes, not dtypes: bytes assume 4-byte elements"
NCU_ROW_NOTE = "Nsight Compute kernel: measured counters only (no PyTorch op, so no cost model)"


def nsight_kind(path: Path) -> str | None:
    """'nsys-rep', 'sqlite', 'ncu-rep' or 'ncu-csv' for an Nsight file, None for anything else (a trace).
    Pipes are never sniffed: they can be read only once."""
    name = path.name.lower()
    if name.endswith((".nsys-rep", ".qdrep")):
        return "nsys-rep"
    if name.endswith(".ncu-rep"):
        return "ncu-rep"
    if name.endswith(".csv"):
        return "ncu-csv"
    if name.endswith((".sqlite", ".sqlite3", ".db")):
        return "sqlite"
    if name.endswith(TRACE_SUFFIXES) or not path.is_file():  # a trace by its name: not sniffed
        return None
    from opscope.nsight.nsys_sqlite import is_sqlite

    return "sqlite" if is_sqlite(path) else None


@contextmanager
def nsys_sqlite_of(path: Path) -> Iterator[Path]:
    """`path` itself for an SQLite export; for a .nsys-rep, its export in a temporary folder."""
    if nsight_kind(path) != "nsys-rep":
        yield path
        return
    from opscope.nsight.session import export_nsys_sqlite

    if not path.is_file():
        raise NsightError(f"no such file: {path}")
    nsys = tool_for_file("nsys", path, f"nsys export --type=sqlite {path.name}")
    with tempfile.TemporaryDirectory(prefix="opscope-nsys-") as tmp:
        sqlite = Path(tmp) / "report.sqlite"
        export_nsys_sqlite(nsys, path, sqlite)
        yield sqlite


def load_ncu(path: Path) -> NcuTable:
    """The kernels of an ncu CSV, or of an .ncu-rep through `ncu --import ... --csv --page raw`."""
    from opscope.nsight.ncu_csv import parse_ncu_csv, read_ncu_csv

    if not path.is_file():
        raise NsightError(f"no such file: {path}")
    if nsight_kind(path) != "ncu-rep":
        return read_ncu_csv(path)
    ncu = tool_for_file("ncu", path, f"ncu --import {path.name} --csv --page raw > {path.stem}.csv")
    proc = subprocess.run(ncu_import_command(ncu, path), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          errors="replace")
    if proc.returncode != 0:
        raise NsightError(f"`ncu --import` could not read {path} (exit code {proc.returncode}: "
                          f"{last_error_line(proc.stdout + proc.stderr)})")
    return parse_ncu_csv(proc.stdout, str(path))


def _checked(table: NcuTable, path: Path, warn: Callable[[str], None]) -> NcuTable:
    for line in table.warnings:
        warn(line)
    if not nrows(table.kernels):
        raise NsightError(f"{path} holds an Nsight Compute table without kernel rows (ncu profiled no kernels: its "
                          "filters matched nothing)")
    return table


def analyze_nsight_file(path: Path, *, out: Path | None = None, peak_bw: float | None = None,
                        peak_flops: list[str] | None = None, warn: Callable[[str], None] = lambda m: None) -> Run:
    """The run directory of an Nsight Systems or Nsight Compute file."""
    base = DEFAULT_REPORTS_DIR.absolute()
    out = out.absolute() if out is not None else None
    check_out_dir(out, base)
    stem = path.name.split(".")[0] or "nsight"
    with tempfile.TemporaryDirectory(prefix="opscope-nsight-") as tmp:
        folder = Path(tmp)
        if nsight_kind(path) in ("nsys-rep", "sqlite"):
            run, extra = _nsys_run(path, folder, peak_bw, peak_flops, warn)
        else:
            run, extra = _ncu_run(path, _checked(load_ncu(path), path, warn), folder, peak_bw, peak_flops, warn)
        write_run(run, out, stem, None, base=base, extra_files=extra)
    return run


def _nsys_run(path: Path, folder: Path, peak_bw: float | None, peak_flops: list[str] | None,
              warn: Callable[[str], None]) -> tuple[Run, dict[str, Path]]:
    from opscope.analysis.pipeline import analyze
    from opscope.analysis.trace_file import trace_device, trace_meta, trace_peaks
    from opscope.nsight.measured import attach_nsys, kernel_plan
    from opscope.nsight.nsys_sqlite import read_nsys_sqlite, to_trace_data

    with nsys_sqlite_of(path) as sqlite:
        data = read_nsys_sqlite(sqlite)
    trace = to_trace_data(data)
    for line in trace.warnings:
        warn(line)
    device = trace_device(trace)
    peaks = trace_peaks(trace, device, peak_bw, peak_flops, warn)
    meta = trace_meta(path, trace, device, peaks)
    run = analyze(trace, peaks=peaks, meta=meta, source="trace")
    meta["steps"] = run.summary["steps"]
    summary, kernels = attach_nsys(run, kernel_plan(run), data)
    run.summary["nsys"] = {"report": path.name, **summary}
    ops = run.ops
    guessed = [b > 0 and d == "" for b, d in zip(ops["bytes_per_call"], ops["input_dtypes"], strict=True)]
    if any(guessed):
        ops["note"] = [(f"{n}; {NSYS_BYTES_NOTE}" if n else NSYS_BYTES_NOTE) if g else n
                       for g, n in zip(guessed, ops["note"], strict=True)]
        warn(f"{path}: {NSYS_BYTES_NOTE} (float32); for a 16-bit model they are 2x too high")
    write_csv(kernels, folder / "nsys_kernels.csv")
    return run, {"nsys_kernels.csv": folder / "nsys_kernels.csv"}


def _ncu_run(path: Path, table: NcuTable, folder: Path, peak_bw: float | None, peak_flops: list[str] | None,
             warn: Callable[[str], None]) -> tuple[Run, dict[str, Path]]:
    """One op row per kernel (by its full name): calls, time, and the measured_* columns; FLOPs and
    bytes per call stay empty (they are the cost model's) and the bound unknown."""
    from opscope.analysis.ops_table import (
        CONTRACT_COLUMNS,
        EXTRA_COLUMNS,
        GPU_COLUMNS,
        GPU_EXTRA_COLUMNS,
        add_roofline,
    )
    from opscope.analysis.pipeline import summarize
    from opscope.machine.peaks import apply_overrides
    from opscope.nsight.measured import TIME, attach_ncu, ncu_kernels_table
    from opscope.table import NAN, pairwise_sum, take
    from opscope.trace.kernel_names import kernel_family
    from opscope.version import __version__

    meas = table.kernels
    peaks = apply_overrides(None, peak_bw, peak_flops)
    if peaks.memory_bandwidth_gbps is None:
        warn("the Nsight Compute table does not name the GPU: pass --peak-bw/--peak-flops to draw its ceilings on "
             "the roofline")
    launches: dict[str, list[int]] = {}  # kernel name -> its launches (rows of the table), in order
    for i, kernel in enumerate(meas["kernel"]):
        launches.setdefault(kernel, []).append(i)
    names = list(launches)  # one op row each, in order of first launch
    time_us = [t / 1e3 for t in meas[TIME]] if TIME in meas else [NAN] * len(meas["kernel"])
    n = len(names)
    ops: Table = {
        "op": ["kernel::" + (re.sub(r"\W", "_", meas["base"][launches[k][0]]) or "unnamed") for k in names],
        "input_dims": [""] * n, "input_dtypes": [""] * n, "input_strides": [""] * n, "concrete_inputs": [""] * n,
        "source_location": [""] * n, "calls": [len(launches[k]) for k in names],
        "time_us_total": [pairwise_sum([time_us[i] for i in launches[k]]) for k in names],  # np.nansum
        "cpu_time_us_total": [NAN] * n, "kernels": names, "flops_per_call": [NAN] * n, "bytes_per_call": [NAN] * n,
        "family": [""] * n, "dtype": [""] * n, "note": [NCU_ROW_NOTE] * n, "compiled_graph": [""] * n,
        "kernel_family": [kernel_family(k) for k in names], "launcher": [""] * n}
    total = pairwise_sum(ops["time_us_total"])
    ops["time_share"] = [t / total for t in ops["time_us_total"]] if total > 0 else [0.0] * n
    ops = add_roofline(ops, peaks, gpu=True)
    ops = {c: ops[c] for c in CONTRACT_COLUMNS + GPU_COLUMNS + EXTRA_COLUMNS + GPU_EXTRA_COLUMNS}
    order = [r for r, _ in largest_first(dict(enumerate(ops["time_us_total"])))]
    ops = take(ops, order)
    row_of = {names[old]: new for new, old in enumerate(order)}
    count = len(meas["kernel"])
    plan: Table = {"step": [0] * count, "kind": ["kernel"] * count, "name": list(meas["kernel"]),
                   "base": list(meas["base"]), "row": [row_of[k] for k in meas["kernel"]],
                   "main_thread": [True] * count}
    meta = {"format_version": FORMAT_VERSION, "opscope_version": __version__,
            "created": datetime.now().strftime("%Y-%m-%dT%H:%M:%S"), "source": "trace", "target": os.path.normpath(path),
            "torch_version": None,
            "device": {"type": "cuda", "name": "unknown GPU (the Nsight Compute table does not name it)"},
            "dtype": None, "mode": "unknown", "steps": 1, "peaks": peaks.to_json()}
    run = Run(meta=meta, ops=ops, findings=[], summary={"steps": 1})
    info = attach_ncu(run, plan, table)
    run.summary = summarize(run.ops, steps=1, step_time_us=total, n_findings=0, busy=None)
    run.summary["ncu"] = {"csv": path.name, **info}
    write_csv(ncu_kernels_table(run, table), folder / "ncu_kernels.csv")
    return run, {"ncu_kernels.csv": folder / "ncu_kernels.csv"}


def measurement_hook(nsys: Path | None, ncu: Path | None, folder: Path,
                     warn: Callable[[str], None]) -> Callable[[Run], dict[str, Path]]:
    """For `opscope analyze TRACE --nsys FILE --ncu FILE`: attaches the measurements to the analyzed
    trace's op rows and returns the files to add to the run directory (written into `folder`)."""
    from opscope.nsight.measured import (
        add_measured_findings,
        attach_ncu,
        attach_nsys,
        kernel_plan,
        ncu_kernels_table,
    )
    from opscope.nsight.nsys_sqlite import read_nsys_sqlite

    def measure(run: Run) -> dict[str, Path]:
        plan = kernel_plan(run)
        extra: dict[str, Path] = {}
        if nsys is not None:
            with nsys_sqlite_of(nsys) as sqlite:
                data = read_nsys_sqlite(sqlite)
            for line in data.warnings:
                warn(line)
            summary, kernels = attach_nsys(run, plan, data)
            run.summary["nsys"] = {"report": nsys.name, **summary}
            write_csv(kernels, folder / "nsys_kernels.csv")
            extra["nsys_kernels.csv"] = folder / "nsys_kernels.csv"
        if ncu is not None:
            table = _checked(load_ncu(ncu), ncu, warn)
            run.summary["ncu"] = {"csv": ncu.name, **attach_ncu(run, plan, table)}
            write_csv(ncu_kernels_table(run, table), folder / "ncu_kernels.csv")
            extra["ncu_kernels.csv"] = folder / "ncu_kernels.csv"
        add_measured_findings(run)
        return extra
    return measure


def check_measurement_files(nsys: Path | None, ncu: Path | None) -> None:
    """--nsys / --ncu of `opscope analyze` must name files of the right kind (before the trace is read)."""
    for path, kinds, flag in ((nsys, ("nsys-rep", "sqlite"), "--nsys"), (ncu, ("ncu-rep", "ncu-csv"), "--ncu")):
        if path is None:
            continue
        if not path.is_file():
            raise NsightError(f"{flag} {path}: no such file")
        if nsight_kind(path) not in kinds:
            want = ".nsys-rep or an nsys SQLite export" if flag == "--nsys" else ".ncu-rep or an ncu CSV"
            raise NsightError(f"{flag} {path}: expected a {want}")
