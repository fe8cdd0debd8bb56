"""The supervised worker started by a tool, as `profile --nsys/--ncu` starts it under nsys and ncu: the
exact command the tool gets, progress through the file control channel, the tool's failures, and the
whole `profile --nsys` flow with a stand-in nsys (a script: there is no Nsight or GPU here), on CPU."""

from __future__ import annotations

import json
import sys
import tempfile
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from conftest import write_model
from nsight_fixtures import GEMM, GPU, build_nsys_sqlite
from opscope.errors import NsightError
from opscope.nsight.session import NsightRequest, profile_with_nsight
from opscope.target.specs import MeasureSteps, NsightPass, ProfileOptions
from opscope.target.supervise import Listener, ToolFailed, WorkerCrashed, run_worker

pytestmark = pytest.mark.slow

MODEL = """
import os
import torch

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 8)

    def forward(self, x):
        print("the model prints")
        if os.environ.get("CRASH_IN_FORWARD"):
            os._exit(7)
        return torch.relu(self.fc(x))

def get_inputs():
    return [torch.randn(4, 16)]
"""

# A stand-in for a tool that launches a program: records its arguments, runs what follows "--", then
# exits with --exit (default: the program's status); as nsys, it writes --report (a copy of $FAKE_REPORT).
FAKE_TOOL = """#!{python}
import os, shutil, subprocess, sys
args = sys.argv[1:]
cut = args.index("--")
opts, program = args[:cut], args[cut + 1:]
with open(opts[opts.index("--record") + 1], "w") as f:
    f.write("\\n".join(sys.argv))
print("fake tool: launching", flush=True)
status = subprocess.run(program).returncode
if "--report" in opts:
    shutil.copyfile(os.environ["FAKE_REPORT"], opts[opts.index("--report") + 1])
sys.exit(int(opts[opts.index("--exit") + 1]) if "--exit" in opts else status)
"""

# nsys' own command line, understood well enough to run the program and write the report and its export.
FAKE_NSYS = """#!{python}
import os, shutil, subprocess, sys
args = sys.argv[1:]
if args[0] == "export":
    shutil.copyfile(args[-1], next(a.split("=", 1)[1] for a in args if a.startswith("--output=")))
    sys.exit(0)
with open(os.environ["FAKE_RECORD"], "w") as f:
    f.write("\\n".join(sys.argv))
i, base = 1, None
while args[i].startswith("-"):
    if "=" in args[i]:
        i += 1
        continue
    base = args[i + 1] if args[i] == "-o" else base
    i += 2
status = subprocess.run(args[i:]).returncode
shutil.copyfile(os.environ["FAKE_REPORT"], base + ".nsys-rep")
sys.exit(status)
"""


def script(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text.format(python=sys.executable)).lstrip())
    path.chmod(0o755)
    return path


def options(model: Path, out: Path | None = None) -> ProfileOptions:
    return ProfileOptions(target=model, device="cpu", warmup=1, steps=2, threads=1, peak_bw=20.0, peak_flops=["100"],
                          out=out, nvtx=True)


def measure(model: Path, tool: str) -> NsightPass:
    """The job of a measured pass that `tool` launches."""
    return NsightPass(options=options(model), task=MeasureSteps(tool=tool))


@pytest.fixture
def model(tmp_path):
    return write_model(tmp_path, MODEL)


def test_the_tool_launches_the_supervised_worker(tmp_path, model):
    tool = script(tmp_path, "fake-tool", FAKE_TOOL)
    record = tmp_path / "argv.txt"
    phases = []
    log = tmp_path / "tool.log"
    result = run_worker("opscope.nsight.worker", measure(model, "fake"),
                        Listener(phase=lambda name, total: phases.append(name)),
                        wrapper=[str(tool), "--record", str(record), "--"], tool_log=log)
    assert result == {"steps": 2}
    assert phases == ["fake: loading model", "fake: warmup", "fake: measuring 2 steps"]
    argv = record.read_text().splitlines()
    assert argv[:4] == [str(tool), "--record", str(record), "--"]
    assert argv[4:6] == [sys.executable, "-c"] and "from opscope.nsight.worker import main" in argv[6]
    assert argv[7].endswith("spec.json") and len(argv) == 8
    output = log.read_text()
    assert "fake tool: launching" in output and "the model prints" in output  # both go to the tool's log


def test_a_tool_failing_before_the_model_starts(tmp_path, model):
    tool = script(tmp_path, "broken-tool", "#!/bin/sh\necho 'broken-tool: unrecognized option' >&2\nexit 3\n")
    with pytest.raises(ToolFailed) as err:
        run_worker("opscope.nsight.worker", measure(model, ""), wrapper=[str(tool)],
                   tool_log=tmp_path / "log")
    assert err.value.code == 3 and not err.value.started and "before the model's code started" in str(err.value)
    assert "unrecognized option" in (tmp_path / "log").read_text()


def test_a_tool_failing_after_the_model_finished(tmp_path, model):
    tool = script(tmp_path, "fake-tool", FAKE_TOOL)
    with pytest.raises(ToolFailed) as err:
        run_worker("opscope.nsight.worker", measure(model, ""),
                   wrapper=[str(tool), "--record", str(tmp_path / "r"), "--exit", "5", "--"])
    assert err.value.code == 5 and err.value.started


def test_a_model_crashing_under_the_tool(tmp_path, model, monkeypatch):
    tool = script(tmp_path, "fake-tool", FAKE_TOOL)
    monkeypatch.setenv("CRASH_IN_FORWARD", "1")
    with pytest.raises(WorkerCrashed, match=r"ended the process \(exit code 7\) during warmup.*\(under fake-tool\)"):
        run_worker("opscope.nsight.worker", measure(model, ""),
                   wrapper=[str(tool), "--record", str(tmp_path / "r"), "--"])


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """tempfile's folder for this test, to see that nothing is left in it."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def leftovers(folder: Path) -> list[str]:
    """What a run left in the temporary folder (torch.compile's cache folder is kept on purpose)."""
    return [p.name for p in folder.iterdir() if not p.name.startswith("torchinductor_")]


def test_profile_with_a_stand_in_nsys(tmp_path, model, monkeypatch, private_tmp):
    nsys = script(tmp_path, "nsys", FAKE_NSYS)
    monkeypatch.setenv("FAKE_REPORT", str(build_nsys_sqlite(tmp_path / "recorded.sqlite")))
    monkeypatch.setenv("FAKE_RECORD", str(tmp_path / "nsys-argv.txt"))
    out = tmp_path / "run"
    reports = tmp_path / "reports"
    path = profile_with_nsight(options(model, out), NsightRequest(nsys=True, nsys_args=["--sample=none"]),
                               {"nsys": str(nsys)}, Listener(), out=out, reports=reports, stem="model")
    assert path == out
    assert sorted(p.name for p in out.iterdir()) == ["findings.json", "meta.json", "modules.csv",
                                                    "nsys.nsys-rep", "nsys_kernels.csv", "ops.csv", "summary.json",
                                                    "timeline.json", "trace.json.gz", "whatif.json"]
    argv = (tmp_path / "nsys-argv.txt").read_text().splitlines()
    assert argv[1:11] == ["profile", "-t", "cuda,nvtx,osrt,cublas,cudnn", "--capture-range=cudaProfilerApi",
                          "--capture-range-end=stop", "-o", argv[7], "-f", "true", "--sample=none"]
    assert argv[11] == sys.executable and argv[7].endswith("/nsys")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["nsys"]["report"] == "nsys.nsys-rep" and summary["nsys"]["gpu"] == GPU
    assert summary["nsys"]["steps"] == 2 and summary["nsys"]["matched_time_share"] == 0.0  # a CPU profile: no kernels
    ops = pd.read_csv(out / "ops.csv")
    assert ops.columns[-1] == "nsys_time_us_total" and ops["nsys_time_us_total"].isna().all()
    kernels = pd.read_csv(out / "nsys_kernels.csv", keep_default_na=False)
    assert GEMM in set(kernels["name"]) and (kernels["ops_row"] == -1).all()
    assert not reports.exists() and leftovers(private_tmp) == []


def test_profile_with_ncu_and_nothing_to_measure_leaves_nothing(tmp_path, model, private_tmp):
    ncu = script(tmp_path, "ncu", "#!/bin/sh\nexit 99\n")
    out = tmp_path / "run"
    with pytest.raises(NsightError, match="nothing for ncu to measure"):
        profile_with_nsight(options(model, out), NsightRequest(ncu=True), {"ncu": str(ncu)}, Listener(),
                            out=out, reports=tmp_path / "reports", stem="model")
    assert not out.exists() and not (tmp_path / "reports").exists() and leftovers(private_tmp) == []


# ncu's command line, understood well enough to run the program and leave its table in --log-file:
# FAKE_NCU=ok (the BERT fixture), perm (counters refused, exit 1), none (nothing matched the filters).
FAKE_NCU = """#!{python}
import os, shutil, subprocess, sys
args = sys.argv[1:]
with open(os.environ["FAKE_RECORD"], "w") as f:
    f.write("\\n".join(sys.argv))
log = args[args.index("--log-file") + 1]
status = subprocess.run(args[args.index(sys.executable):]).returncode
mode = os.environ["FAKE_NCU"]
if mode == "ok":
    shutil.copyfile(os.environ["FAKE_REPORT"], log)
elif mode == "perm":
    open(log, "w").write("==PROF== Connected to process 1 (python)\\n==ERROR== ERR_NVGPUCTRPERM - The user does not "
                         "have permission to access NVIDIA GPU Performance Counters on the target device 0.\\n")
    sys.exit(1)
else:
    open(log, "w").write("==PROF== Connected to process 1 (python)\\n==PROF== Disconnected from process 1\\n"
                         "==WARNING== No kernels were profiled.\\n")
sys.exit(status)
"""


@pytest.mark.parametrize("mode", ["ok", "perm", "none"])
def test_the_ncu_pass_with_a_stand_in_ncu(tmp_path, model, monkeypatch, mode):
    from nsight_fixtures import BERT, RAW, VOCAB
    from opscope.analysis.pipeline import analyze
    from opscope.analysis.trace_file import trace_device, trace_meta, trace_peaks
    from opscope.nsight.measured import kernel_plan
    from opscope.nsight.session import _ncu_pass
    from opscope.trace.reader import load_trace

    trace = load_trace(BERT)
    device = trace_device(trace)
    peaks = trace_peaks(trace, device, None, None, lambda m: None)
    run = analyze(trace, peaks=peaks, meta=trace_meta(BERT, trace, device, peaks), source="trace")
    ncu = script(tmp_path, "ncu", FAKE_NCU)
    monkeypatch.setenv("FAKE_NCU", mode)
    monkeypatch.setenv("FAKE_REPORT", str(RAW))
    monkeypatch.setenv("FAKE_RECORD", str(tmp_path / "argv.txt"))
    private = tmp_path / "private"
    private.mkdir()
    extra: dict[str, Path] = {}
    job = measure(model, "ncu")
    if mode == "perm":
        with pytest.raises(NsightError, match="ERR_NVGPUCTRPERM.*NVreg_RestrictProfilingToAdminUsers=0"):
            _ncu_pass(run, kernel_plan(run), NsightRequest(ncu=True, ncu_top=3), str(ncu), job, Listener(),
                      private, extra)
        return
    if mode == "none":
        with pytest.raises(NsightError, match=r"ncu profiled no kernels: its filters matched nothing \(NVTX range "
                                              r"opscope_step/, kernels regex:.*Kernel2\|flash_fwd_kernel.*-c 26\)"):
            _ncu_pass(run, kernel_plan(run), NsightRequest(ncu=True, ncu_top=3), str(ncu), job, Listener(),
                      private, extra)
        return
    _ncu_pass(run, kernel_plan(run), NsightRequest(ncu=True, ncu_top=3), str(ncu), job, Listener(), private, extra)
    argv = (tmp_path / "argv.txt").read_text().splitlines()
    assert argv[1:8] == ["--target-processes", "all", "--nvtx", "--nvtx-include", "opscope_step/", "-k",
                         "regex:^(?:.*::)?(?:Kernel2|flash_fwd_kernel)$"]
    assert argv[8:10] == ["-c", "26"] and argv[-4] == sys.executable
    assert run.summary["ncu"] == {"csv": "ncu.csv", "rows_selected": 3, "kernels_requested": 26,
                                  "kernels_profiled": 26, "kernels_matched": 26, "rows_measured": 26}
    assert sorted(extra) == ["ncu.csv", "ncu_kernels.csv"]
    vocab = run.to_pandas()[run.to_pandas()["source_location"] == VOCAB].iloc[0]
    assert vocab["measured_bytes_ratio"] == pytest.approx(3.09, rel=1e-5)


def test_nsys_failures_are_one_line(tmp_path, model, monkeypatch):
    from opscope.nsight.session import _nsys_pass

    run = None  # the failures come before the run is touched
    job = measure(model, "nsys")
    broken = script(tmp_path, "nsys", "#!/bin/sh\necho \"unrecognised option '--bogus'\" >&2\nexit 1\n")
    private = tmp_path / "private"
    private.mkdir()
    with pytest.raises(NsightError, match=r"^nsys exited with code 1 before the model's code \(under nsys\) started "
                                          r"\(unrecognised option '--bogus'\)$"):
        _nsys_pass(run, {}, NsightRequest(nsys=True, nsys_args=["--bogus"]), str(broken), job,
                   Listener(), private, {})
    # a report without GPU work (the capture range never saw a kernel)
    empty = build_nsys_sqlite(tmp_path / "empty.sqlite", {"StringIds": []}, drop_tables=("CUPTI_ACTIVITY_KIND_KERNEL",))
    nsys = script(tmp_path, "nsys2", FAKE_NSYS)
    monkeypatch.setenv("FAKE_REPORT", str(empty))
    monkeypatch.setenv("FAKE_RECORD", str(tmp_path / "argv.txt"))
    with pytest.raises(NsightError, match="nsys recorded no GPU work; with --capture-range=nvtx .*REGISTER_ONLY=0"):
        _nsys_pass(run, {}, NsightRequest(nsys=True, nsys_args=["--capture-range=nvtx"]), str(nsys),
                   job, Listener(), private, {})
