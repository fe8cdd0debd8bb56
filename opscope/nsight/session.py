"""`opscope profile --nsys / --ncu`: the usual profile, then the same model again under nsys and/or ncu,
then one run directory with all of it.

This runs in the parent CLI process (torch-free). Every pass is a supervised worker (opscope.target.supervise):
1. the profile itself, whose worker leaves the analyzed run, its kernel plan and trace in a private
   folder instead of writing the run directory;
2. with --nsys, the measured pass launched by `nsys profile ...` (capture range: the steps), then
   `nsys export --type=sqlite`, read and attributed (opscope.nsight.nsys_sqlite);
3. with --ncu, the measured pass launched by `ncu ...`, restricted to the kernels of the profile's
   --ncu-top heaviest op rows, one step of them; its CSV read (opscope.nsight.ncu_csv);
4. the measurements attached to the op rows (opscope.nsight.measured), the excess-traffic rule, and the
   run directory written once, atomically, with the tools' files in it.
Anything failing on the way leaves nothing behind (the private folder goes, no run directory appears).
"""

from __future__ import annotations

import pickle
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from opscope.capture.options import STEP_RANGE
from opscope.errors import NsightError
from opscope.nsight.commands import (
    diagnose,
    last_error_line,
    ncu_profile_command,
    no_kernels_message,
    nsys_export_command,
    nsys_profile_command,
    require_tools,
)
from opscope.run.model import Run
from opscope.run.write import write_csv, write_run
from opscope.table import Table, nrows
from opscope.target.specs import HoldRun, MeasureSteps, NsightPass, ProfileOptions
from opscope.target.supervise import Listener, ToolFailed, run_worker

# The CLI imports this module for every `opscope profile` (NsightRequest, check_request): the modules that
# read and attach measurements are imported by the passes that use them.

WORKER = "opscope.nsight.worker"


@dataclass
class NsightRequest:
    nsys: bool = False
    nsys_args: list[str] = field(default_factory=list)
    ncu: bool = False
    ncu_top: int = 10
    nvtx_ops: bool = False

    @property
    def wanted(self) -> bool:
        return self.nsys or self.ncu


def check_request(req: NsightRequest, device: str) -> dict[str, str]:
    """Everything about --nsys/--ncu that can be checked before anything runs; {tool: path}."""
    if req.nvtx_ops and not req.nsys:
        raise NsightError("--nvtx-ops records NVTX op ranges in the --nsys pass (torch.profiler's own pass cannot "
                          "record them at the same time): use it with --nsys")
    if not req.wanted:
        return {}
    flags = " and ".join(f for f, on in (("--nsys", req.nsys), ("--ncu", req.ncu)) if on)
    if device == "cpu":
        both = req.nsys and req.ncu
        raise NsightError(f"{flags} measure{'' if both else 's'} CUDA kernels, so {'they' if both else 'it'} "
                          "cannot run with --device cpu")
    if req.nsys:
        nsys_profile_command("nsys", Path("nsys"), req.nsys_args)  # refuses options opscope owns
    return require_tools(req.nsys, req.ncu)


def export_nsys_sqlite(nsys: str, report: Path, sqlite: Path) -> None:
    """`nsys export --type=sqlite`, or one NsightError line with nsys' reason."""
    proc = subprocess.run(nsys_export_command(nsys, report, sqlite), stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, errors="replace")
    if proc.returncode != 0 or not sqlite.is_file():
        raise NsightError(f"`nsys export` could not convert {report.name} to SQLite (exit code {proc.returncode}: "
                          f"{last_error_line(proc.stdout + proc.stderr)})")


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _tool_failure(tool: str, exc: ToolFailed, text: str, filters: str = "") -> NsightError:
    why = diagnose(tool, text, filters)
    return NsightError(why or f"{exc} ({last_error_line(text)})")


def profile_with_nsight(options: ProfileOptions, req: NsightRequest, tools: dict[str, str], listener: Listener,
                        *, out: Path | None, reports: Path, stem: str,
                        on_abort: Callable[[int], None] | None = None) -> Path:
    """Runs the passes and writes the run directory; returns its path."""
    from opscope.nsight.measured import add_measured_findings

    private = Path(tempfile.mkdtemp(prefix="opscope-nsight-"))
    try:
        held = private / "held"
        held.mkdir()
        run_worker(WORKER, NsightPass(options=options, task=HoldRun(folder=held)), listener, on_abort=on_abort)
        with open(held / "held.pkl", "rb") as f:  # written by our own worker (opscope.nsight.worker.hold_run)
            loaded = pickle.load(f)
        run: Run = loaded["run"]
        plan: Table = loaded["plan"]
        extra: dict[str, Path] = {}
        measured = msgspec.structs.replace(options, out=None)  # the measured passes write no run
        if req.nsys:
            _nsys_pass(run, plan, req, tools["nsys"],
                       NsightPass(options=measured, task=MeasureSteps(tool="nsys", nvtx_ops=req.nvtx_ops)),
                       listener, private, extra)
        if req.ncu:
            _ncu_pass(run, plan, req, tools["ncu"], NsightPass(options=measured, task=MeasureSteps(tool="ncu")),
                      listener, private, extra)
        add_measured_findings(run)
        return write_run(run, out, stem, held / "trace.json", base=reports, extra_files=extra)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _nsys_pass(run: Run, plan: Table, req: NsightRequest, nsys: str, job: NsightPass,
               listener: Listener, private: Path, extra: dict[str, Path]) -> None:
    from opscope.nsight.measured import attach_nsys
    from opscope.nsight.nsys_sqlite import read_nsys_sqlite

    cmd = nsys_profile_command(nsys, private / "nsys", req.nsys_args)
    for note in cmd.notes:
        listener.warn(note)
    log = private / "nsys.log"
    try:
        run_worker(WORKER, job, listener, what="the model's code (under nsys)", wrapper=cmd.prefix,
                   wrapper_env=cmd.env, tool_log=log)
    except ToolFailed as exc:
        raise _tool_failure("nsys", exc, _read(log)) from exc
    report = private / "nsys.nsys-rep"
    if not report.is_file():
        raise NsightError(f"nsys wrote no report ({last_error_line(_read(log))})")
    sqlite = private / "nsys.sqlite"
    listener.phase("exporting the nsys report", None)
    export_nsys_sqlite(nsys, report, sqlite)
    data = read_nsys_sqlite(sqlite)
    for line in data.warnings:
        listener.warn(line)
    if not nrows(data.activities):
        hint = ("; with --capture-range=nvtx nsys matches only the range you named, and (unless "
                "NSYS_NVTX_PROFILER_REGISTER_ONLY=0, which opscope sets when it is unset) only registered NVTX "
                "strings" if cmd.nvtx_capture else
                "; the capture range is the steps, between torch.cuda.profiler.start() and stop()")
        raise NsightError(f"nsys recorded no GPU work{hint}")
    summary, kernels = attach_nsys(run, plan, data)
    run.summary["nsys"] = {"report": "nsys.nsys-rep", **summary}
    write_csv(kernels, private / "nsys_kernels.csv")
    extra["nsys.nsys-rep"] = report
    extra["nsys_kernels.csv"] = private / "nsys_kernels.csv"


def _ncu_pass(run: Run, plan: Table, req: NsightRequest, ncu: str, job: NsightPass,
              listener: Listener, private: Path, extra: dict[str, Path]) -> None:
    from opscope.nsight.measured import attach_ncu, ncu_kernels_table, ncu_selection
    from opscope.nsight.ncu_csv import parse_ncu_csv

    bases, count, rows = ncu_selection(run, plan, req.ncu_top)
    if not bases:
        raise NsightError("--ncu: the profile recorded no kernels launched by the steps (inside the NVTX step "
                          "range), so there is nothing for ncu to measure")
    csv_log = private / "ncu.csv"
    out_log = private / "ncu-output.log"
    cmd = ncu_profile_command(ncu, kernel_bases=bases, count=count, log_file=csv_log)
    filters = f"NVTX range {STEP_RANGE}/, kernels {cmd[cmd.index('-k') + 1]}, -c {count}"
    try:
        run_worker(WORKER, job, listener, what="the model's code (under ncu)", wrapper=cmd, tool_log=out_log)
    except ToolFailed as exc:
        raise _tool_failure("ncu", exc, _read(csv_log) + "\n" + _read(out_log), filters) from exc
    text = _read(csv_log)
    if '"Kernel Name"' not in text:  # an ncu that ignored --log-file printed the table with the model's output
        text = f"{text}\n{_read(out_log)}"
        csv_log.write_text(text)
    output = f"{text}\n{_read(out_log)}"
    why = diagnose("ncu", output, filters)
    if why and ("ERR_NVGPUCTRPERM" in output or '"Kernel Name"' not in text):
        raise NsightError(why)
    table = parse_ncu_csv(text, "ncu's output")
    for line in table.warnings:
        listener.warn(line)
    if not nrows(table.kernels):
        raise NsightError(why or no_kernels_message(filters))
    info = attach_ncu(run, plan, table, bases)
    run.summary["ncu"] = {"csv": "ncu.csv", "rows_selected": len(rows), "kernels_requested": count, **info}
    if info["kernels_matched"] < info["kernels_profiled"]:
        listener.warn(f"ncu: {info['kernels_profiled'] - info['kernels_matched']} of {info['kernels_profiled']} "
                      "measured kernels did not line up with the profile's kernels (ncu_kernels.csv, ops_row -1)")
    write_csv(ncu_kernels_table(run, table), private / "ncu_kernels.csv")
    extra["ncu.csv"] = csv_log
    extra["ncu_kernels.csv"] = private / "ncu_kernels.csv"
