"""`opscope profile --nsys/--ncu` and `opscope analyze` of Nsight files through the real CLI. This machine
has no NVIDIA GPU and no Nsight tools: the Nsight options must fail with one actionable line, exit 2,
before anything runs and with nothing written; Nsight files are read from fixtures."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest

from conftest import EXAMPLES, TESTS, TRACES, run_cli, torch_sees_cuda
from nsight_fixtures import GEMM, build_nsys_sqlite

FIXTURES = TESTS / "fixtures" / "nsight"
MLP = str(EXAMPLES / "mlp.py")


def nothing_written(folder: Path) -> bool:
    return not [p for p in folder.iterdir() if p.name != "bin"]  # bin: the test's own PATH folder


def one_error_line(proc) -> str:  # noqa: ANN001
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("opscope: error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


@pytest.fixture
def bare_path(tmp_path, monkeypatch):
    """PATH without nsys and ncu (this machine has neither; a developer's might)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(Path(os.sys.executable), bin_dir / "python")
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    return bin_dir


@pytest.mark.parametrize("flags, tool", [(["--nsys"], "nsys"), (["--ncu", "--ncu-top", "3"], "ncu"),
                                         (["--nsys", "--ncu"], "nsys")])
def test_profile_with_nsight_fails_cleanly_without_gpu_or_tools(tmp_path, bare_path, flags, tool):
    work = tmp_path / "work"
    work.mkdir()
    proc = run_cli("profile", MLP, *flags, "--out", str(work / "run"), cwd=work)
    line = one_error_line(proc)
    assert f"`{tool}` is not on PATH" in line and "CUDA Toolkit" in line and "Nothing was run" in line
    if not torch_sees_cuda():
        assert "no NVIDIA GPU" in line
    assert nothing_written(work)  # no run, no reports/, no staging folder


def test_the_gpu_is_named_even_when_the_tools_are_there(tmp_path, bare_path):
    for tool in ("nsys", "ncu"):
        fake = bare_path / tool
        fake.write_text("#!/bin/sh\nexit 0\n")
        fake.chmod(0o755)
    proc = run_cli("profile", MLP, "--nsys", "--ncu", cwd=tmp_path)
    if not Path("/proc/driver/nvidia/gpus").is_dir():
        line = one_error_line(proc)
        assert "no NVIDIA GPU" in line and "not on PATH" not in line
        assert nothing_written(tmp_path)


@pytest.mark.parametrize("flags, message", [
    (["--nsys", "--device", "cpu"], "cannot run with --device cpu"),
    (["--nvtx-ops"], "use it with --nsys"),
    (["--nsys-args", "--sample=none"], "use it with --nsys"),
    (["--nsys", "--nsys-args", "-o elsewhere"], "may not set -o"),
    (["--nsys", "--nsys-args", "'unclosed"], "cannot be split"),
    (["--ncu", "--ncu-top", "0"], "--ncu-top"),
])
def test_bad_nsight_options_are_one_line(tmp_path, flags, message):
    proc = run_cli("profile", MLP, *flags, cwd=tmp_path)
    assert message in one_error_line(proc)
    assert nothing_written(tmp_path)


@pytest.mark.parametrize("name, tool, hint", [("r.nsys-rep", "nsys", "nsys export --type=sqlite r.nsys-rep"),
                                              ("r.ncu-rep", "ncu", "ncu --import r.ncu-rep --csv --page raw > r.csv")])
def test_reports_need_their_tool(tmp_path, bare_path, name, tool, hint):
    report = tmp_path / name
    report.write_bytes(b"\x00binary report")
    proc = run_cli("analyze", str(report), cwd=tmp_path)
    line = one_error_line(proc)
    assert f"needs `{tool}`, which is not on PATH" in line and hint in line
    assert {p.name for p in tmp_path.iterdir()} == {name, "bin"}


def test_analyze_an_ncu_csv_alone(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("analyze", str(FIXTURES / "h100_bert-small_ncu_raw.csv"), "--out", str(out), "--json",
                   "--peak-bw", "3350", "--peak-flops", "989000", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["ncu"]["kernels_profiled"] == 26 and summary["steps"] == 1
    ops = pd.read_csv(out / "ops.csv", keep_default_na=False)
    assert len(ops) == 4 and set(ops["op"]) == {"kernel::Kernel2", "kernel::flash_fwd_kernel"}  # one row per name
    assert ops["calls"].sum() == 26 and (ops["bound"] == "unknown").all()
    assert (ops["flops_per_call"] == "").all() and (ops["measured_dram_bytes_per_call"] != "").all()
    assert ops["time_us_total"].is_monotonic_decreasing
    meta = json.loads((out / "meta.json").read_text())
    assert meta["source"] == "trace" and meta["peaks"]["origin"]["memory_bandwidth"] == "user"


def test_analyze_an_nsys_export_in_a_pipeline(tmp_path):
    export = build_nsys_sqlite(tmp_path / "profile.sqlite")
    proc = run_cli("analyze", str(export), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run = next((tmp_path / "reports").iterdir())
    kernels = pd.read_csv(run / "nsys_kernels.csv", keep_default_na=False)
    assert GEMM in set(kernels["name"])
    assert "measured: Nsight Systems: 2 step(s)" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--nsys", "missing.sqlite"], "--nsys missing.sqlite: no such file"),
    (["--ncu", "TRACE"], "expected a .ncu-rep or an ncu CSV"),
])
def test_measurement_files_of_analyze_are_checked_first(tmp_path, args, message):
    args = [str(TRACES / "h100_bert-small_bf16.json.gz") if a == "TRACE" else a for a in args]
    proc = run_cli("analyze", str(TRACES / "h100_bert-small_bf16.json.gz"), *args, cwd=tmp_path)
    assert message in one_error_line(proc)
    assert nothing_written(tmp_path)


def test_an_nsight_file_cannot_take_another(tmp_path):
    export = build_nsys_sqlite(tmp_path / "r.sqlite")
    proc = run_cli("analyze", str(export), "--ncu", str(FIXTURES / "h100_bert-small_ncu_raw.csv"), cwd=tmp_path)
    assert "is itself an Nsight file" in one_error_line(proc)


def test_not_an_ncu_csv(tmp_path):
    bad = tmp_path / "numbers.csv"
    bad.write_text("a,b\n1,2\n")
    proc = run_cli("analyze", str(bad), cwd=tmp_path)
    assert "holds no Nsight Compute table" in one_error_line(proc)
    assert [p.name for p in tmp_path.iterdir()] == ["numbers.csv"]


@pytest.mark.slow
def test_profile_with_nvtx_runs_on_a_cpu(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("profile", MLP, "--nvtx", "--steps", "2", "--warmup", "1", "--out", str(out), "--json",
                   "--peak-bw", "20", "--peak-flops", "100", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["steps"] == 2 and (out / "ops.csv").is_file()
