"""Output locations are checked before any work, every write failure is one line with nothing left
under the final name, and default run names are unique under concurrency."""

from __future__ import annotations

import errno
import gzip
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import opscope.run.write
from conftest import TRACES, assert_clean_error, run_cli, write_model
from opscope.errors import OutputError
from opscope.run.model import Run
from opscope.run.write import check_out_dir, write_run

BERT = TRACES / "h100_bert-small_bf16.json.gz"
GPU_PEAKS = ["--peak-bw", "3350", "--peak-flops", "989000"]


def _tiny_run() -> Run:
    return Run(meta={"format_version": 1}, ops={"op": ["aten::mm"], "calls": [1]}, findings=[],
               summary={"format_version": 1})


def _complete(run_dir: Path) -> bool:
    return all((run_dir / f).exists() for f in ("meta.json", "ops.csv", "findings.json", "summary.json"))


def test_ten_concurrent_analyzes_get_ten_distinct_complete_runs(tmp_path):
    env = dict(os.environ, COLUMNS="120")
    procs = [subprocess.Popen([sys.executable, "-m", "opscope", "analyze", str(BERT), "--json", *GPU_PEAKS],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(10)]
    results = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0] * 10, [err for _, err in results]
    runs = sorted(p for p in (tmp_path / "reports").iterdir())
    assert len(runs) == 10 and all(_complete(r) for r in runs), runs
    assert len({r.name for r in runs}) == 10
    printed = {err.strip().removeprefix("run directory: ") for _, err in results}
    assert printed == {str(r.relative_to(tmp_path)) for r in runs}
    assert not [p for p in (tmp_path / "reports").iterdir() if p.name.startswith(".")]


def test_concurrent_writes_in_one_second_take_the_next_number(tmp_path):
    paths: list[Path] = []
    lock = threading.Lock()

    def write() -> None:
        path = write_run(_tiny_run(), None, "m", None, base=tmp_path)
        with lock:
            paths.append(path)

    threads = [threading.Thread(target=write) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(paths)) == 8 and all(_complete(p) for p in paths)
    stems = {p.name.rsplit("-m", 1)[0] for p in paths}
    assert all(p.name.endswith("-m") or p.name.split("-m-")[-1].isdigit() for p in paths), stems


def test_out_symlink_to_an_empty_dir_receives_the_run(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    proc = run_cli("analyze", str(BERT), "--out", str(link), *GPU_PEAKS)
    assert proc.returncode == 0, proc.stderr
    assert _complete(real) and link.is_symlink()


@pytest.mark.parametrize("case,needle", [
    ("dangling symlink", "symlink to nothing"),
    ("under a file", "is a file, not a folder"),
    ("a file", "not a directory"),
    ("not empty", "not empty"),
])
def test_unusable_out_is_one_line_before_any_work(tmp_path, case, needle):
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    out = {
        "dangling symlink": tmp_path / "dangling",
        "under a file": blocker / "run",
        "a file": blocker,
        "not empty": tmp_path,
    }[case]
    if case == "dangling symlink":
        out.symlink_to(tmp_path / "missing")
    proc = run_cli("analyze", str(BERT), "--out", str(out), *GPU_PEAKS, cwd=tmp_path)
    assert_clean_error(proc, needle)
    assert not (tmp_path / "reports").exists()


def test_profile_checks_out_before_loading_the_model(tmp_path):
    model = write_model(tmp_path, """
        import torch
        print("MODEL LOADED")
        def get_model(): return torch.nn.Linear(4, 4)
        def get_inputs(): return [torch.randn(2, 4)]
    """)
    (tmp_path / "file.txt").write_text("x")
    proc = run_cli("profile", str(model), "--out", str(tmp_path / "file.txt" / "run"))
    assert_clean_error(proc, "is a file, not a folder")
    assert "MODEL LOADED" not in proc.stdout + proc.stderr


def test_an_empty_mount_point_is_refused(tmp_path, monkeypatch):
    out = tmp_path / "mnt"
    out.mkdir()
    monkeypatch.setattr(os.path, "ismount", lambda p: Path(p) == out)
    with pytest.raises(OutputError, match="mount point"):
        check_out_dir(out)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_a_write_failure_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, code):
    def failing(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(opscope.run.write, "write_csv", failing)  # the disk fails while ops.csv is written
    with pytest.raises(OutputError, match=os.strerror(code)) as info:
        write_run(_tiny_run(), None, "m", None, base=tmp_path / "reports")
    assert "\n" not in str(info.value)
    assert list((tmp_path / "reports").iterdir()) == []
    with pytest.raises(OutputError):
        write_run(_tiny_run(), tmp_path / "out", "m", None)
    assert not (tmp_path / "out").exists()


def test_a_read_only_reports_folder_is_refused_before_work(tmp_path, monkeypatch):
    import tempfile

    real = tempfile.mkdtemp

    def read_only(*args, **kwargs):
        if kwargs.get("prefix") == ".opscope-probe-":
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real(*args, **kwargs)

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    with pytest.raises(OutputError, match="not writable"):
        check_out_dir(None, tmp_path / "reports")


def test_a_failed_analyze_leaves_no_empty_reports_folder(tmp_path):
    doc = json.loads(gzip.decompress(BERT.read_bytes()))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") not in ("cpu_op", "kernel", "gpu_memcpy",
                                                                             "gpu_memset")]
    trace = tmp_path / "no_ops.json"
    trace.write_text(json.dumps(doc))  # plain JSON: opscope gzips it into the run as it analyzes
    proc = run_cli("analyze", str(trace), *GPU_PEAKS, cwd=tmp_path)
    assert_clean_error(proc, "no operator")
    assert not (tmp_path / "reports").exists()


def test_a_model_that_changes_directory_still_writes_where_it_was_started(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    model = write_model(tmp_path, f"""
        import os
        import torch
        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(8, 8)
            def forward(self, x):
                os.chdir({str(elsewhere)!r})
                return self.lin(x)
        def get_model(): return M()
        def get_inputs(): return [torch.randn(4, 8)]
    """)
    proc = run_cli("profile", str(model), "--json", "--steps", "1", "--warmup", "0", "--peak-bw", "20",
                   "--peak-flops", "100", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = (tmp_path / "reports").iterdir()
    assert _complete(run_dir)
    assert not (elsewhere / "reports").exists()
    assert f"run directory: reports/{run_dir.name}" in proc.stderr


def test_paths_are_shown_normalised(tmp_path):
    """`work/../x` printed as given: the trace in the header, the run directory at the end."""
    (tmp_path / "work").mkdir()
    trace = tmp_path / "t.json.gz"
    trace.write_bytes((TRACES.parent / "cpu_traces" / "avx2_channels_last_after_train.json.gz").read_bytes())
    proc = run_cli("analyze", "work/../t.json.gz", "--out", "work/../run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "work/.." not in proc.stdout
    assert "run directory: run" in proc.stdout and "│ t.json.gz  (trace" in proc.stdout
    assert json.loads((tmp_path / "run" / "meta.json").read_text())["target"] == "t.json.gz"


def test_a_profiled_model_path_is_shown_normalised(tmp_path):
    (tmp_path / "work").mkdir()
    write_model(tmp_path, """
        import torch

        class Model(torch.nn.Module):
            def forward(self, x):
                return torch.relu(x * 2)

        def get_inputs():
            return [torch.randn(16, 16)]
    """)
    proc = run_cli("profile", "work/../model.py", "--steps", "1", "--warmup", "0", "--peak-bw", "20",
                   "--peak-flops", "100", "--out", "work/../run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "work/.." not in proc.stdout and "run directory: run" in proc.stdout
    assert json.loads((tmp_path / "run" / "meta.json").read_text())["target"] == str(tmp_path / "model.py")


def test_a_compile_log_is_kept_gzipped_and_a_failed_copy_leaves_nothing(tmp_path):
    """write_run(torch_trace=LOG): torch.compile's structured log lands as torch_trace.log.gz, gzipped
    (a log already gzipped is copied as it is); a log that cannot be read is one line, nothing written."""
    log = tmp_path / "dedicated_log_torch_trace_x.log"
    log.write_text('V1205 12:00:00.000000 1 torch/_dynamo/x.py:1] {"dynamo_start": {}}\n')
    run_dir = write_run(_tiny_run(), tmp_path / "run", "m", None, torch_trace=log)
    assert gzip.decompress((run_dir / "torch_trace.log.gz").read_bytes()) == log.read_bytes()
    packed = tmp_path / "log.gz"
    packed.write_bytes(gzip.compress(log.read_bytes()))
    again = write_run(_tiny_run(), tmp_path / "run2", "m", None, torch_trace=packed)
    assert (again / "torch_trace.log.gz").read_bytes() == packed.read_bytes()
    with pytest.raises(OutputError) as info:
        write_run(_tiny_run(), tmp_path / "run3", "m", None, torch_trace=tmp_path / "gone.log")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "run3").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dedicated_log_torch_trace_x.log", "log.gz", "run", "run2"]
