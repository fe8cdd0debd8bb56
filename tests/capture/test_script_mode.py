"""Script mode: `opscope profile train.py -- ARGS` runs an unmodified script as __main__ and profiles the
chosen window of its steps (optimizer steps, or calls of --step-fn) only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import EXAMPLES, PEAKS, assert_clean_error, line_of, run_cli, write_model
from opscope.errors import OpscopeError
from opscope.run.read import read_run
from opscope.target.jobs import is_model_file, launch_spec, script_spec

# Step i trains on a batch of 8 + i rows, so the shapes in ops.csv say exactly which steps were profiled.
GROWING = """
    import argparse
    import sys

    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10)
    args = parser.parse_args()
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)


    def step(i):
        x = torch.randn(8 + i, 16)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()


    for i in range(args.n):
        step(i)
    print("script finished", file=sys.stderr)
"""


def _batches(run_dir: Path, op: str = "aten::addmm") -> set[int]:
    ops = read_run(run_dir).to_pandas()
    return {json.loads(d)[1][0] for d in ops.loc[ops["op"] == op, "input_dims"]}


@pytest.mark.slow
def test_example_training_script_profiles_the_chosen_window_only(tmp_path):
    """examples/train_script.py, unmodified, with its own argparse arguments: 7 steps run, steps 3-5 are
    profiled (--skip-steps 2 --steps 3), every step's ops have exactly 3 calls, at the script's lines."""
    script = EXAMPLES / "train_script.py"
    out = tmp_path / "run"
    proc = run_cli("profile", str(script), "--skip-steps", "2", "--steps", "3", "--out", str(out), *PEAKS,
                   "--", "--steps", "7", "--batch-size", "24", "--width", "40", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "step 0 loss" in proc.stderr  # the script ran as itself (its prints go to stderr)
    run = read_run(out)
    assert run.summary["steps"] == 3 and run.meta["mode"] == "train"
    assert run.meta["script"]["args"] == ["--steps", "7", "--batch-size", "24", "--width", "40"]
    ops = run.to_pandas()
    fc1 = ops[(ops["op"] == "aten::addmm") & ops["input_dims"].str.startswith("[[160], [24, 40]")]
    assert fc1["calls"].tolist() == [3]  # the arguments reached the script; one call per profiled step
    assert fc1["source_location"].iloc[0].endswith(f"train_script.py:{line_of(script, 'x = x + self.fc2')}")
    randn = ops[ops["op"] == "aten::normal_"]
    assert randn["calls"].sum() == 3 * 1  # the batch drawn in each profiled step; none from the others
    assert (ops["calls"] % 3 == 0).all(), ops.loc[ops["calls"] % 3 != 0, ["op", "calls"]]
    # the trace keeps the line step's lines and modules: analyzing it again gives the run's rows, and the
    # what-if replays the fixes the run predicted (without them no finding's fix had ops: 0 µs each)
    again = run_cli("analyze", str(out / "trace.json.gz"), "--out", str(tmp_path / "again"), *PEAKS)
    assert again.returncode == 0, again.stderr
    assert "using the exact source lines, modules and memory it embedded" in again.stderr
    assert (tmp_path / "again" / "ops.csv").read_text() == (out / "ops.csv").read_text()
    predicted = run.summary.get("whatif")
    if predicted:
        replay = run_cli("whatif", str(out), "--all", "--json")
        assert replay.returncode == 0, replay.stderr
        doc = json.loads(replay.stdout)
        assert doc["predicted_step_time_us"] == pytest.approx(predicted["predicted_step_time_us"], rel=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("how", [[], ["--step-fn", "model:step"], ["--stop-after"]])
def test_the_window_is_exactly_the_chosen_steps(tmp_path, how):
    script = write_model(tmp_path, GROWING)
    out = tmp_path / "run"
    proc = run_cli("profile", str(script), "--skip-steps", "2", "--steps", "3", "--out", str(out), *PEAKS,
                   *how, "--", "--n", "7", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert _batches(out) == {10, 11, 12}  # steps 2, 3 and 4 (0-based) of 7
    stopped = "--stop-after" in how
    assert ("script finished" in proc.stderr) is not stopped
    run = read_run(out)
    assert run.meta["script"]["steps_from"] == ("model:step" if how[:1] == ["--step-fn"] else "optimizer step")
    assert run.meta["script"]["source_lines"] == "next step"
    loc = run.to_pandas().loc[run.to_pandas()["op"] == "aten::addmm", "source_location"]
    assert set(loc) == {f"model.py:{line_of(script, 'loss = model(x)')}"}  # exact lines, from the next step


@pytest.mark.slow
def test_a_script_ending_right_after_the_window_has_no_lines_and_says_so(tmp_path):
    script = write_model(tmp_path, GROWING)
    proc = run_cli("profile", str(script), "--skip-steps", "1", "--steps", "2", "--out", str(tmp_path / "r"),
                   *PEAKS, "--", "--n", "3", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "no step followed the profiled window" in proc.stderr
    run = read_run(tmp_path / "r")
    assert run.meta["script"]["source_lines"] == "none"
    assert _batches(tmp_path / "r") == {9, 10}


@pytest.mark.slow
def test_a_script_ending_with_os_exit_0_keeps_its_run_and_says_so(tmp_path):
    """`os._exit(0)` at the end of a training script (it skips interpreter teardown) used to end opscope's
    process before the run was written."""
    script = write_model(tmp_path, GROWING + "    import os\n    os._exit(0)\n")
    out = tmp_path / "r"
    proc = run_cli("profile", str(script), "--skip-steps", "1", "--steps", "2", "--out", str(out), *PEAKS,
                   "--", "--n", "5", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"the script ended itself with os._exit(0) at model.py:{line_of(script, 'os._exit(0)')}" in proc.stderr
    assert "wrote nothing" not in proc.stderr
    assert _batches(out) == {9, 10}


@pytest.mark.slow
def test_piped_stdin_reaches_the_script(tmp_path):
    script = write_model(tmp_path, GROWING.replace("args = parser.parse_args()",
                                                   "args = parser.parse_args()\n    print('stdin:', sys.stdin.read().strip(), "
                                                   "file=sys.stderr)"))
    env = dict(os.environ, COLUMNS="160")
    proc = subprocess.run([sys.executable, "-m", "opscope", "profile", str(script), "--out", str(tmp_path / "r"), *PEAKS],
                          cwd=tmp_path, env=env, input="tokens 1 2 3\n", capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "stdin: tokens 1 2 3" in proc.stderr


# The script profiles its own first 3 steps (and prints its table), then trains on.
OWN_PROFILER = GROWING.replace("""    for i in range(args.n):
        step(i)
""", """    with torch.profiler.profile() as prof:
        for i in range(3):
            step(i)
    print(prof.key_averages().table(row_limit=50), file=sys.stderr)
    for i in range(3, args.n):
        step(i)
""")


@pytest.mark.slow
def test_a_scripts_own_profiler_runs_and_opscope_profiles_the_steps_after_it(tmp_path):
    """opscope's profiler used to run through the script's, which then printed an empty table."""
    script = write_model(tmp_path, OWN_PROFILER)
    out = tmp_path / "r"
    proc = run_cli("profile", str(script), "--skip-steps", "1", "--steps", "2", "--out", str(out), *PEAKS,
                   "--", "--n", "8", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "aten::addmm" in proc.stderr  # the script's own table has its rows
    assert (f"the script runs its own torch.profiler (started at model.py:{line_of(script, 'torch.profiler.profile()')})"
            in proc.stderr)
    assert _batches(out) == {12, 13}  # steps 3 (skipped), 4 and 5: after the script's profiler


@pytest.mark.slow
def test_a_script_profiling_every_step_itself_is_one_line_saying_why(tmp_path):
    script = write_model(tmp_path, OWN_PROFILER.replace("range(3, args.n)", "range(0)").replace("range(3)", "range(args.n)"))
    proc = run_cli("profile", str(script), "--out", str(tmp_path / "r"), *PEAKS, "--", "--n", "6", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "aten::addmm" in proc.stderr  # the script's profiler ran, and its table has its rows
    last = proc.stderr.strip().splitlines()[-1]
    for needle in ("opscope: error: the script runs its own torch.profiler", "torch runs one profiler at a time",
                   "6 of the script's 6 steps ran under it"):
        assert needle in last, last
    assert not (tmp_path / "r").exists()


# A model with submodules and a loss module: two roots of the forward (the model, then the loss).
TWO_ROOTS = """
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(16, 32)
            self.head = torch.nn.Linear(32, 4)

        def forward(self, x):
            return self.head(torch.relu(self.fc1(x)))

    model, loss_fn = Net(), torch.nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(6):
        loss = loss_fn(model(torch.randn(8, 16)), torch.randint(0, 4, (8,)))
        loss.backward()
        opt.step()
        opt.zero_grad()
"""


@pytest.mark.slow
def test_a_script_run_has_the_noise_line_step_times_and_module_paths_of_a_model_file(tmp_path):
    script = write_model(tmp_path, TWO_ROOTS)
    out = tmp_path / "r"
    proc = run_cli("profile", str(script), "--skip-steps", "1", "--steps", "3", "--out", str(out), *PEAKS, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run = read_run(out)
    noise = run.summary["noise"]
    assert "recorded elsewhere" not in noise["reason"] and noise["verdict"] in ("quiet", "noisy"), noise
    assert noise["threads"] >= 1 and noise["cores"] >= 1
    assert run.summary["step_time_cv"] is not None  # each of the 3 steps timed
    ops = run.to_pandas()
    addmm = ops[ops["op"] == "aten::addmm"]
    assert set(addmm["module"]) == {"fc1", "head"} and set(addmm["module_class"]) == {"Linear"}
    assert "CrossEntropyLoss" in set(ops["module_class"])  # the loss module, a root of its own
    modules = (out / "modules.csv").read_text()
    assert "fc1,Linear" in modules and "head,Linear" in modules
    assert "noise " in proc.stdout  # the header's noise line


FAILING = {
    "raises": ("raise ValueError('bad batch')", "the script raised ValueError: bad batch at model.py:"),
    "exits": ("sys.exit(3)", "the script exited with sys.exit(3) at model.py:"),
    "os_exits": ("import os; os._exit(3)", "the script exited with os._exit(3) at model.py:"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(FAILING))
def test_script_failures_name_the_scripts_own_line(tmp_path, case):
    statement, needle = FAILING[case]
    script = write_model(tmp_path, GROWING.replace("        opt.zero_grad()\n", f"        opt.zero_grad()\n        if i == 3:\n            {statement}\n"))
    proc = run_cli("profile", str(script), "--out", str(tmp_path / "r"), *PEAKS, cwd=tmp_path)
    line = assert_clean_error(proc, needle)
    assert line.split("model.py:")[1].startswith(str(line_of(script, statement)))
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_too_few_steps_and_no_steps_are_one_line(tmp_path):
    script = write_model(tmp_path, GROWING.replace('print("script finished", file=sys.stderr)', ""))
    proc = run_cli("profile", str(script), "--skip-steps", "2", "--steps", "5", *PEAKS, "--", "--n", "4", cwd=tmp_path)
    assert_clean_error(proc, "the script ended after 4 optimizer steps", "(--skip-steps 2 + --steps 5 = 7)")
    no_opt = write_model(tmp_path, "import torch\ntorch.ones(3).sum()\n", "plain.py")
    assert_clean_error(run_cli("profile", str(no_opt), *PEAKS, cwd=tmp_path), "never called optimizer.step()")
    proc = run_cli("profile", str(script), "--step-fn", "model:missing", *PEAKS, cwd=tmp_path)
    assert_clean_error(proc, "--step-fn model:missing: the script never defined missing")


def test_script_options_are_checked_before_anything_runs(tmp_path):
    script = write_model(tmp_path, GROWING)
    for args, needle in (
        (["--entry", "f", "--", "--n", "2"], "--entry names a model function"),
        (["--step-fn", "no colon"], "--step-fn must be MODULE:FUNC"),
        (["--dtype", "bfloat16", "--script"], "--dtype does not apply to a script"),
        (["--nnodes", "2"], "need --nproc-per-node"),
        (["--nproc-per-node", "2", "--nnodes", "2"], "--nnodes above 1 needs --master-addr"),
        (["--nproc-per-node", "0"], "--nproc-per-node must be between 1"),
        (["--nproc-per-node", "2", "--node-rank", "1"], "--node-rank must be between 0 and --nnodes - 1 (0)"),
        (["--nsys"], "--nsys applies to a model file"),
        (["--ncu", "--nvtx"], "--ncu/--nvtx apply to a model file"),
    ):
        assert_clean_error(run_cli("profile", str(script), *args, cwd=tmp_path), needle)
    # the Nsight passes launch one process: not torchrun's ranks (checked before the GPU and the tools are)
    proc = run_cli("profile", str(EXAMPLES / "mlp.py"), "--nproc-per-node", "2", "--nsys", "--ncu", cwd=tmp_path)
    assert_clean_error(proc, "--nsys/--ncu measure one process and do not apply to --nproc-per-node")
    assert [p.name for p in tmp_path.iterdir()] == ["model.py"]


def test_which_files_are_scripts():
    assert is_model_file(EXAMPLES / "mlp.py") and not is_model_file(EXAMPLES / "train_script.py")
    base = {"script": False, "entry": None, "args": [], "step_fn": None, "stop_after": False, "dtype": None,
            "mode": "inference"}
    assert script_spec(EXAMPLES / "mlp.py", **base) is None
    assert script_spec(EXAMPLES / "mlp.py", **{**base, "script": True}).args == []
    assert script_spec(EXAMPLES / "train_script.py", **{**base, "args": ["--lr", "1"]}).args == ["--lr", "1"]
    with pytest.raises(OpscopeError):
        script_spec(EXAMPLES / "train_script.py", **{**base, "mode": "train"})
    assert launch_spec(None, 1, 0, None, None) is None
    assert launch_spec(4, 2, 1, "node0", 29500).nnodes == 2
