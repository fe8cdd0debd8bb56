"""`opscope profile --repeat`, `opscope baseline save` and `opscope gate` as CI runs them: real runs of a
tiny model, real files, real subprocesses. Nothing here asserts on timing: a pass is checked at a threshold
no noise reaches, a regression by a new op row written into a copy of a real run."""

from __future__ import annotations

import csv
import json
import shutil
import xml.etree.ElementTree as ET

import pytest

import opscope
from conftest import assert_clean_error, run_cli
from opscope import Progress

TINY = '''
import torch


def get_model():
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU())


def get_inputs():
    return [torch.randn(256, 64)]
'''


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("gate")
    (work / "tiny.py").write_text(TINY)
    done = run_cli("profile", str(work / "tiny.py"), "--repeat", "2", "--steps", "3", "--warmup", "1", "--threads", "1",
                   "--out", str(work / "base"), cwd=work)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["base/run-1", "base/run-2"]
    # each profiled step's time, and the top op rows' time in each step, kept as samples
    summary = json.loads((work / "base" / "run-1" / "summary.json").read_text())
    assert len(summary["step_times_us"]) == 3
    with open(work / "base" / "run-1" / "ops.csv", newline="") as f:
        totals = [float(r["time_us_total"]) for r in csv.DictReader(f)]
    kept = summary["op_step_times_us"]
    assert kept and all(len(e["times_us"]) == 3 for e in kept)
    for entry in kept:
        assert sum(entry["times_us"]) == pytest.approx(totals[entry["row"]], rel=1e-3, abs=0.01)
    return work


def _with_new_op(run, dst):
    """A copy of the run with one more op row: aten::copy_ at tiny.py:99 taking as long as the whole step."""
    shutil.copytree(run, dst)
    with open(dst / "ops.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    steps = json.loads((dst / "summary.json").read_text())["steps"]
    step = json.loads((dst / "summary.json").read_text())["step_time_us_p50"]
    extra = dict(rows[0], op="aten::copy_", source_location="tiny.py:99", time_us_total=str(step * steps), module="")
    with open(dst / "ops.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows([extra, *rows])
    summary = json.loads((dst / "summary.json").read_text())
    summary["step_times_us"] = [t * 2 for t in summary["step_times_us"]]
    (dst / "summary.json").write_text(json.dumps(summary))
    return dst


@pytest.mark.slow
def test_baseline_then_gate_pass_fail_and_bad_input(runs):
    saved = run_cli("baseline", "save", "base/run-1", "base/run-2", "--name", "main", cwd=runs)
    assert saved.returncode == 0, saved.stderr
    path = runs / ".opscope" / "baselines" / "main.json"
    doc = json.loads(path.read_text())
    assert doc["format_version"] == 1 and len(doc["samples"]["runs"]) == 2
    assert len(doc["samples"]["step_times_us"][0]) == 3  # each step kept
    assert doc["samples"]["torch_version"] and doc["samples"]["machine"]["device_type"] == "cpu"
    assert any(len(op["step_times_us"] or []) == 2 for op in doc["samples"]["ops"])

    passed = run_cli("gate", "base/run-1", "--baseline", "main", "--threshold", "1000%", cwd=runs)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert passed.stdout.startswith("opscope gate: no regression")

    _with_new_op(runs / "base" / "run-2", runs / "copied")
    failed = run_cli("gate", "copied", "--baseline", "main", "--format", "junit", "--output", "gate.xml", cwd=runs)
    assert failed.returncode == 1, failed.stderr
    assert failed.stdout == "" and "regression" in failed.stderr
    root = ET.parse(runs / "gate.xml").getroot()
    failures = [c for c in root.findall("testcase") if c.find("failure") is not None]
    assert any("tiny.py:99" in c.get("name") for c in failures)
    markdown = run_cli("gate", "copied", "--baseline", "main", "--format", "markdown", cwd=runs)
    assert markdown.returncode == 1 and "| ❌ regression | new op | aten::copy\\_ | tiny.py:99 |" in markdown.stdout

    assert_clean_error(run_cli("gate", "copied", "--baseline", "nope", cwd=runs), "no baseline 'nope'")
    assert_clean_error(run_cli("gate", "copied", "--baseline", "main", "--confidence", "2", cwd=runs), "--confidence")
    assert_clean_error(run_cli("gate", "missing", "--baseline", "main", cwd=runs), "no such run directory")
    (runs / ".opscope" / "baselines" / "bad.json").write_text("[1, 2")
    assert_clean_error(run_cli("gate", "copied", "--baseline", "bad", cwd=runs), "damaged")
    assert_clean_error(run_cli("baseline", "save", "base/run-1", "--name", "a/b", cwd=runs), "baseline name")


def test_bad_options_are_one_line_before_anything_runs(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "kept.txt").write_text("x")
    (tmp_path / "tiny.py").write_text(TINY)
    assert_clean_error(run_cli("profile", "tiny.py", "--repeat", "2", "--out", "out", cwd=tmp_path),
                       "not empty")
    assert_clean_error(run_cli("gate", "out", "--baseline", "main", "--threshold", "lots", cwd=tmp_path),
                       "not a share")
    assert_clean_error(run_cli("baseline", "save", "out", "--name", "main", cwd=tmp_path), "opscope run directory")


class _Phases(Progress):
    """A progress hook per run that records what it was shown and whether it was closed."""

    def __init__(self, log: list[str], i: int) -> None:
        self.log, self.i = log, i

    def __enter__(self) -> _Phases:
        self.log.append(f"open {self.i}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.log.append(f"close {self.i}")

    def phase(self, name: str, total: int | None = None) -> None:
        if f"phase {self.i}" not in self.log:
            self.log.append(f"phase {self.i}")


@pytest.mark.slow
def test_profile_repeated_from_python(tmp_path):
    """opscope.profile_repeated (what `profile --repeat` calls): OUT/run-1 ... OUT/run-N in order, each run
    reported as written, each with its own progress context, opened and closed around its profile."""
    (tmp_path / "tiny.py").write_text(TINY)
    log: list[str] = []
    runs = opscope.profile_repeated(tmp_path / "tiny.py", 2, out=tmp_path / "set", steps=2, warmup=1, threads=1,
                                    progress=lambda i: _Phases(log, i),
                                    on_run=lambda i, run: log.append(f"run {i} {run.dir.name}"))
    assert [r.dir for r in runs] == [tmp_path / "set" / "run-1", tmp_path / "set" / "run-2"]
    assert log == ["open 1", "phase 1", "close 1", "run 1 run-1", "open 2", "phase 2", "close 2", "run 2 run-2"]
    assert all(len(r.summary["step_times_us"]) == 2 for r in runs)


def test_profile_repeated_refuses_before_the_first_run(tmp_path):
    (tmp_path / "tiny.py").write_text(TINY)
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "kept.txt").write_text("x")
    with pytest.raises(opscope.OpscopeError, match="not empty"):
        opscope.profile_repeated(tmp_path / "tiny.py", 2, out=tmp_path / "set")
    with pytest.raises(opscope.OpscopeError, match="at least 1"):
        opscope.profile_repeated(tmp_path / "tiny.py", 0)
    assert not (tmp_path / "set" / "run-1").exists()
