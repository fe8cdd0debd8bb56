"""Multi-process jobs through torchrun: `opscope profile TARGET --nproc-per-node 2` with gloo on this
CPU (NCCL on GPUs takes the same code path; no GPU here). Each rank profiles itself into RUN/ranks/<r>/,
the launcher merges them; a failing rank is named and nothing is written; a signal ends every rank."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import EXAMPLES, PEAKS, assert_clean_error, run_cli, write_model
from opscope.capture.distributed import failure_message, torchrun_args
from opscope.run.read import read_run
from opscope.target.jobs import LaunchSpec

DDP_MODEL = """
    import os

    import torch


    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(32, 64)
            self.fc2 = torch.nn.Linear(64, 8)

        def forward(self, x):
            {forward}
            return self.fc2(torch.relu(self.fc1(x)))


    def get_inputs():
        torch.manual_seed(0)
        x = torch.randn(16, 32)
        with open(f"inputs-{{os.environ['RANK']}}.txt", "w") as f:
            f.write(repr(float(x.sum())))
        return [x]
"""


def _no_leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.startswith(".opscope")]


@pytest.mark.slow
def test_two_gloo_ranks_of_a_model_file_with_ddp(tmp_path):
    model = write_model(tmp_path, DDP_MODEL.format(forward="pass"))
    out = tmp_path / "run"
    proc = run_cli("profile", str(model), "--mode", "train", "--nproc-per-node", "2", "--steps", "3", "--warmup", "1",
                   "--out", str(out), *PEAKS, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Ranks (2 × 3 profiled steps, gloo" in proc.stdout
    assert "straggler: rank " in proc.stdout and "gloo:all_reduce" in proc.stdout
    run = read_run(out)
    assert run.to_pandas("ranks")["rank"].tolist() == [0, 1] and run.to_pandas("ranks")["straggler"].sum() == 1
    for r in (0, 1):
        rank_run = read_run(out / "ranks" / str(r))
        assert rank_run.meta["rank"] == r and rank_run.meta["world_size"] == 2
        assert rank_run.summary["rank"]["backend"] == "gloo"
    allreduce = run.to_pandas()[run.to_pandas()["op"] == "c10d::allreduce_"]  # DDP's gradient all-reduce, on both ranks
    assert allreduce["ranks"].tolist() == [2] and allreduce["calls"].iloc[0] >= 2 * 3
    d = run.summary["distributed"]
    assert (d["world_size"], d["backend"], d["steps_per_rank"]) == (2, "gloo", 3)
    gloo = next(c for c in d["collectives"] if c["name"] == "gloo:all_reduce")
    assert gloo["time_us"] > 0 and gloo["ranks"] == 2
    assert run.summary["steps"] == 6 and run.meta["distributed"]["ranks"] == [0, 1]
    # modules.csv of the merged run: inclusive module times over both ranks, adding up to the op time
    assert run.modules is not None and (out / "modules.csv").is_file()
    top = run.to_pandas("modules")[run.to_pandas("modules")["depth"] == 0]["time_us_total"].sum()
    assert top == pytest.approx(run.to_pandas()["time_us_total"].sum(), rel=1e-6)
    assert (run.to_pandas("modules")["depth"] > 0).any()
    # each rank drew its own inputs, although the file seeds torch with 0
    a, b = ((tmp_path / f"inputs-{r}.txt").read_text() for r in (0, 1))
    assert a != b
    assert _no_leftovers(tmp_path) == []


@pytest.mark.slow
def test_two_ranks_of_the_example_training_script(tmp_path):
    """Script mode under torchrun: the unmodified example sets up gloo DDP itself."""
    out = tmp_path / "run"
    proc = run_cli("profile", str(EXAMPLES / "train_script.py"), "--nproc-per-node", "2", "--skip-steps", "2",
                   "--steps", "2", "--out", str(out), *PEAKS, "--", "--steps", "6", "--batch-size", "16",
                   "--width", "32", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run = read_run(out)
    assert sorted(p.name for p in (out / "ranks").iterdir()) == ["0", "1"]
    assert run.summary["distributed"]["backend"] == "gloo"
    assert {"c10d::allreduce_", "gloo:all_reduce"} <= {c["name"] for c in run.summary["distributed"]["collectives"]}
    assert read_run(out / "ranks" / "1").meta["script"]["steps_from"] == "optimizer step"


CRASHES = {
    "raises": ("raise ValueError('rank one is broken')", "rank 1: the model's forward failed at model.py:"),
    "segfault": ("import ctypes; ctypes.string_at(0)", "rank 1 crashed with a segmentation fault (SIGSEGV)"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CRASHES))
def test_a_failing_rank_is_named_and_nothing_is_written(tmp_path, case):
    statement, needle = CRASHES[case]
    forward = f"if os.environ['RANK'] == '1':\n                {statement}"
    model = write_model(tmp_path, DDP_MODEL.format(forward=forward))
    out = tmp_path / "run"
    proc = run_cli("profile", str(model), "--mode", "train", "--nproc-per-node", "2", "--steps", "2",
                   "--out", str(out), *PEAKS, cwd=tmp_path)
    line = assert_clean_error(proc, needle, "the job's other ranks were stopped and opscope wrote nothing")
    assert "rank 0" not in line
    assert not out.exists() and _no_leftovers(tmp_path) == []


def test_the_first_failure_is_the_one_named(tmp_path):
    (tmp_path / ".status-0.json").write_text(json.dumps({"error": "lost peer: Connection closed by peer", "peer": True}))
    (tmp_path / ".status-2.json").write_text(json.dumps({"error": "the model's forward failed at m.py:3: KeyError: 'x'"}))
    message = failure_message({0: 1, 1: -15, 2: 1}, tmp_path)
    assert message.startswith("rank 2: the model's forward failed at m.py:3")
    assert failure_message({0: 1, 1: -11}, tmp_path / "none").startswith("rank 1 crashed with a segmentation fault")
    assert failure_message({3: 7}, tmp_path / "none").startswith("rank 3 ended with exit code 7")


def test_torchrun_command_lines(tmp_path):
    one = torchrun_args(LaunchSpec(2), tmp_path / "spec.json")
    assert one[:one.index("--no-python") + 2] == ["--nproc-per-node", "2", "--nnodes", "1", "--max-restarts", "0",
                                                  "--monitor-interval", "0.1", "--no-python", "--standalone"]
    assert one[-1] == str(tmp_path / "spec.json") and "opscope.capture.distributed" in one[-2]
    many = torchrun_args(LaunchSpec(8, 4, 2, "node0.cluster", 29400), tmp_path / "spec.json")
    joined = " ".join(many)
    assert "--nnodes 4 " in joined and "--node-rank 2 --master-addr node0.cluster --master-port 29400" in joined
    assert "--standalone" not in many


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigterm_stops_every_rank_and_leaves_nothing(tmp_path):
    slow = DDP_MODEL.format(forward="for _ in range(300):\n                x = x + torch.tanh(x)")
    model = write_model(tmp_path, slow)
    proc = subprocess.Popen([sys.executable, "-m", "opscope", "profile", str(model), "--mode", "train",
                             "--nproc-per-node", "2", "--steps", "500", *PEAKS], cwd=tmp_path,
                            env=dict(os.environ, COLUMNS="120"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    end = time.monotonic() + 120
    while time.monotonic() < end and not (tmp_path / "inputs-1.txt").exists() and proc.poll() is None:
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()
    ranks = [p for p in _processes_mentioning(str(tmp_path)) if p != proc.pid]
    assert len(ranks) == 2  # the two ranks (their spec file is in the staging folder beside the run)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1] == "opscope: error: stopped by SIGTERM; nothing was written"
    assert "Traceback" not in err
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and [p for p in ranks if p in _processes_mentioning(str(tmp_path))]:
        time.sleep(0.1)
    assert [p for p in ranks if p in _processes_mentioning(str(tmp_path))] == []
    reports = tmp_path / "reports"
    assert not reports.exists() or list(reports.iterdir()) == []
