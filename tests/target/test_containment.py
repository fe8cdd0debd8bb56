"""User code is contained: whatever the model's code does to its process (print from Python or C,
exit, crash, change directory or sys.path, shadow the standard library, raise a BaseException) cannot
change opscope's contract. `opscope profile` runs it in a supervised child process."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from conftest import PEAKS, assert_clean_error, run_cli, write_model

NOISY = """
    import ctypes
    import os
    import sys

    import torch

    libc = ctypes.CDLL(None)
    print("print at import")
    libc.puts(b"C puts at import")
    os.write(1, b"fd 1 write at import\\n")

    class Model(torch.nn.Module):
        def forward(self, x):
            print("print in forward")
            libc.puts(b"C puts in forward")
            libc.fflush(None)
            sys.stdout.write("sys.stdout in forward\\n")
            return torch.relu(x @ x)

    def get_inputs():
        return [torch.randn(32, 32)]
"""


def _no_runs(folder: Path) -> bool:
    reports = folder / "reports"
    return not reports.exists() or not any(reports.iterdir())


def test_json_stdout_is_one_document_even_when_the_model_prints(tmp_path):
    model = write_model(tmp_path, NOISY)
    proc = run_cli("profile", str(model), "--json", "--steps", "2", *PEAKS, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)  # exactly one document: json.loads rejects anything after it
    assert summary["steps"] == 2
    for text in ("print at import", "C puts at import", "fd 1 write at import", "print in forward",
                 "C puts in forward"):
        assert text in proc.stderr and text not in proc.stdout


EXITS = {
    "sys.exit(3) in forward": ("import sys\n", "sys.exit(3)", "sys.exit(3) at model.py"),
    "sys.exit(0) in forward": ("import sys\n", "sys.exit(0)", "sys.exit(0) at model.py"),
    "os._exit(0) in forward": ("import os\n", "os._exit(0)", "ended the process (exit code 0) during warmup"),
    "segfault in forward": ("import ctypes\n", "ctypes.string_at(0)", "segmentation fault (SIGSEGV) during warmup"),
    "SIGKILL to itself": ("import os, signal\n", "os.kill(os.getpid(), signal.SIGKILL)", "killed by SIGKILL"),
    "KeyboardInterrupt raised": ("", "raise KeyboardInterrupt", "raised KeyboardInterrupt at model.py"),
    "a custom BaseException": ("class Stop(BaseException):\n    pass\n", "raise Stop('no')", "raised Stop: no at model.py"),
}


@pytest.mark.parametrize("case", list(EXITS))
def test_an_exit_or_crash_in_user_code_is_one_line_exit_2(tmp_path, case):
    imports, statement, needle = EXITS[case]
    model = write_model(tmp_path, "import torch\n" + imports + f"""
class Model(torch.nn.Module):
    def forward(self, x):
        {statement}
        return x

def get_inputs():
    return [torch.randn(2, 2)]
""")
    proc = run_cli("profile", str(model), "--json", *PEAKS, cwd=tmp_path)
    assert_clean_error(proc, needle)
    assert _no_runs(tmp_path)


def test_sys_exit_at_import_names_the_line(tmp_path):
    model = write_model(tmp_path, """
        import sys
        sys.exit(5)
    """)
    proc = run_cli("profile", str(model), *PEAKS, cwd=tmp_path)
    assert_clean_error(proc, "sys.exit(5) at model.py:2")
    assert _no_runs(tmp_path)


def test_a_model_that_changes_sys_path_and_torch_settings_does_not_affect_the_run(tmp_path):
    model = write_model(tmp_path, """
        import sys
        import torch
        sys.path.insert(0, "/nonexistent")
        torch.set_default_dtype(torch.float64)

        class Model(torch.nn.Module):
            def forward(self, x):
                sys.path.clear()
                return x * 2

        def get_inputs():
            return [torch.randn(8, 8, dtype=torch.float32)]
    """)
    proc = run_cli("profile", str(model), "--json", *PEAKS, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["steps"] == 5


@pytest.mark.parametrize("shadow", ["tempfile", "gzip", "json", "inspect"])
def test_a_neighbour_named_like_a_stdlib_module_shadows_nothing(tmp_path, shadow):
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / f"{shadow}.py").write_text("raise ImportError('the shadowing neighbour was imported')\n")
    (folder / "helpers.py").write_text("SCALE = 3\n")
    model = write_model(folder, """
        import torch
        from helpers import SCALE  # neighbours stay importable

        class Model(torch.nn.Module):
            def forward(self, x):
                return x * SCALE

        def get_inputs():
            return [torch.randn(8, 8)]
    """)
    for cwd in (tmp_path, folder):  # the model's folder, and the working directory too
        proc = run_cli("profile", str(model), "--json", "--out", str(tmp_path / f"run-{cwd.name}"), *PEAKS, cwd=cwd)
        assert proc.returncode == 0, proc.stderr
        assert "shadowing neighbour" not in proc.stderr


def test_torch_is_not_imported_for_errors_that_need_no_model(tmp_path):
    """A missing target or an unusable --out is reported before the child (and torch) start."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import sys\n"
        "sys.argv = ['opscope', 'profile', 'missing.py']\n"
        "from opscope.cli.app import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules)\n")
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(probe)], cwd=tmp_path, capture_output=True, text=True)
    assert out.stdout.strip() == "False", out
    assert "no such file" in out.stderr


@pytest.mark.parametrize("where,needle", [
    ("inputs", "input tensor 0"),
    ("model", "the model's weight is on the meta device"),
])
def test_meta_device_tensors_are_one_line(tmp_path, where, needle):
    model_device, input_device = ("meta", "cpu") if where == "model" else ("cpu", "meta")
    model = write_model(tmp_path, f"""
        import torch
        def get_model():
            return torch.nn.Linear(8, 8, device="{model_device}")
        def get_inputs():
            return [torch.randn(4, 8, device="{input_device}")]
    """)
    proc = run_cli("profile", str(model), *PEAKS, cwd=tmp_path)
    assert_clean_error(proc, needle, "meta device")
    assert _no_runs(tmp_path)


@pytest.mark.slow
def test_two_profiles_started_together_get_two_runs(tmp_path):
    import os
    import subprocess
    import sys

    model = write_model(tmp_path, """
        import torch
        def get_model():
            return torch.nn.Linear(16, 16)
        def get_inputs():
            return [torch.randn(8, 16)]
    """)
    env = dict(os.environ, COLUMNS="120")
    procs = [subprocess.Popen([sys.executable, "-m", "opscope", "profile", str(model), "--json", "--steps", "1",
                               "--warmup", "0", *PEAKS], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outs]
    runs = sorted((tmp_path / "reports").iterdir())
    assert len(runs) == 2 and all((r / "summary.json").exists() for r in runs)


# --- user code that does not let go (issue 23, item 8) ------------------------------------------------

LINGERING_THREAD = """
    import threading, time
    import torch

    threading.Thread(target=time.sleep, args=(3600,), name="user-thread").start()  # not a daemon

    def get_model():
        return torch.nn.Linear(16, 16)

    def get_inputs():
        return [torch.randn(4, 16)]
"""

# A fork sleeping in the background, a subprocess in a session of its own, and a daemon that double-forks
# (its parent exits, so it is nobody's child): each writes its pid to PIDS.
FORKS = """
    import os, subprocess, sys, time
    import torch

    PIDS = {pids!r}

    def _note(pid):
        with open(PIDS, "a") as f:
            f.write(f"{{pid}}\\n")

    pid = os.fork()
    if pid == 0:
        time.sleep(3600)
        os._exit(0)
    _note(pid)
    _note(subprocess.Popen(["sleep", "3601"], start_new_session=True).pid)
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            _note(os.getpid())
            time.sleep(3600)
        os._exit(0)

    def get_model():
        return torch.nn.Linear(16, 16)

    def get_inputs():
        return [torch.randn(4, 16)]
"""


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting to be reaped does not count)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != b"Z"


def test_a_thread_the_model_leaves_running_does_not_keep_profile_waiting(tmp_path):
    model = write_model(tmp_path, LINGERING_THREAD)
    proc = run_cli("profile", str(model), "--steps", "1", "--warmup", "0", *PEAKS, cwd=tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert "run directory:" in proc.stdout


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc to find the processes")
def test_processes_the_models_code_starts_are_ended_when_profile_is_done(tmp_path):
    pids_file = tmp_path / "pids.txt"
    model = write_model(tmp_path, FORKS.format(pids=str(pids_file)))
    proc = run_cli("profile", str(model), "--steps", "1", "--warmup", "0", *PEAKS, cwd=tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stderr
    pids = [int(line) for line in pids_file.read_text().split()]
    assert len(pids) == 3
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if _alive(p)], "processes the model started outlived opscope"


# After its result is sent, opscope's child lists /proc (to end what the model started): this audit hook
# ends the process there with exit code 3, as a crashing exit handler or a thread of the user's would.
ENDS_AFTER_THE_RUN = """
    import os, sys, torch

    def _end_after_the_result(event, args):
        if event == "os.listdir" and args and args[0] == "/proc":
            os._exit(3)

    sys.addaudithook(_end_after_the_result)

    def get_model():
        return torch.nn.Linear(8, 8)

    def get_inputs():
        return [torch.randn(4, 8)]
"""


def test_a_child_that_fails_after_the_run_is_written_keeps_the_run_and_says_so(tmp_path):
    model = write_model(tmp_path, ENDS_AFTER_THE_RUN)
    out = tmp_path / "run"
    proc = run_cli("profile", str(model), "--steps", "1", "--warmup", "0", "--out", str(out), "--json", *PEAKS,
                   cwd=tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert "wrote nothing" not in proc.stderr
    assert "ended the process with exit code 3 after the run was written" in proc.stderr
    assert json.loads(proc.stdout)["steps"] == 1 and (out / "ops.csv").is_file()
