"""`opscope compare`: the matching rule, the noise band, findings fixed/introduced, per-step times, the
--fail-above gate, and real before/after runs of an example fix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from conftest import EXAMPLES, PEAKS, line_of, run_cli, write_model
from opscope.run.compare import (
    APPEARED,
    DEFAULT_BAND,
    FASTER,
    MIN_BAND,
    NOISY_BAND,
    SAME,
    SLOWER,
    VANISHED,
    compare_runs,
    match_findings,
    match_ops,
    noise_band,
    verdict,
)
from opscope.run.model import Run
from opscope.table import from_frame

COLUMNS = ["op", "input_dims", "input_dtypes", "input_strides", "source_location", "calls", "time_us_total"]


def make_run(rows: list[tuple], steps: int = 1, findings: list[dict] | None = None, **summary) -> Run:
    ops = pd.DataFrame(rows, columns=COLUMNS[: len(rows[0])] if rows else COLUMNS)
    return Run(meta={"target": "m.py", "device": {"type": "cpu", "name": "x"}}, ops=from_frame(ops), findings=findings or [],
               summary={"steps": steps, "step_time_us": 1000.0, **summary})


def test_verdict_band_edges():
    assert verdict(100, 110, 0.10) == SAME  # exactly 1 + band: inside
    assert verdict(100, 110.01, 0.10) == SLOWER
    assert verdict(110, 100, 0.10) == SAME  # 1 / (1 + band) is inside too
    assert verdict(110.01, 100, 0.10) == FASTER
    assert verdict(0, 0, 0.10) == SAME and verdict(0, 5, 0.10) == SLOWER


def test_noise_band_from_the_runs():
    quiet = make_run([], step_time_cv=0.03)
    assert noise_band(make_run([]), make_run([]))[0] == DEFAULT_BAND
    assert noise_band(quiet, make_run([], step_time_cv=0.07))[0] == pytest.approx(0.14)  # 2 x the larger CV
    assert noise_band(make_run([], step_time_cv=0.001), quiet)[0] == pytest.approx(0.06)
    assert noise_band(make_run([], step_time_cv=0.001), make_run([], step_time_cv=0.002))[0] == MIN_BAND
    noisy = make_run([], step_time_cv=0.01, noise={"other_cpu_share": 0.5, "verdict": "noisy"})
    band, reason = noise_band(quiet, noisy)
    assert band == NOISY_BAND and "B" in reason
    assert noise_band(make_run([], step_time_cv="x"), make_run([]))[0] == DEFAULT_BAND  # junk is ignored


def test_ops_match_by_inputs_across_moved_lines_then_by_line():
    a = make_run([
        ("aten::mm", "[[8, 8], [8, 8]]", '["float"]', "[[8, 1], [8, 1]]", "m.py:10", 2, 200.0),
        ("aten::mm", "[[8, 8], [8, 8]]", '["float"]', "[[8, 1], [8, 1]]", "m.py:12", 2, 100.0),  # same inputs
        ("aten::add", "[[8, 8], [8, 8]]", '["float"]', "[[1, 8], [8, 1]]", "m.py:20", 2, 50.0),  # strided
        ("aten::clone", "[[8, 8]]", '["float"]', "[[1, 8]]", "m.py:30", 2, 40.0),
    ], steps=2)
    b = make_run([
        ("aten::mm", "[[8, 8], [8, 8]]", '["float"]', "[[8, 1], [8, 1]]", "m.py:7", 1, 100.0),  # lines moved
        ("aten::add", "[[8, 8], [8, 8]]", '["float"]', "[[8, 1], [8, 1]]", "m.py:20", 1, 10.0),  # now contiguous
        ("aten::relu", "[[8, 8]]", '["float"]', "[[8, 1]]", "m.py:40", 1, 5.0),
    ], steps=1)
    changes = {c.op: c for c in match_ops(a, b, 0.10)}
    mm = changes["aten::mm"]  # A: 300 us over 2 steps = 150 per step; B: 100 per step
    assert (mm.matched_by, mm.time_a_us, mm.time_b_us, mm.verdict) == ("inputs", 150.0, 100.0, FASTER)
    assert (mm.calls_a, mm.calls_b) == (2.0, 1.0)
    assert mm.source_a == "m.py:10" and mm.source_b == "m.py:7"
    add = changes["aten::add"]  # strides changed: paired by op + line
    assert (add.matched_by, add.time_a_us, add.time_b_us, add.verdict) == ("line", 25.0, 10.0, FASTER)
    assert add.ratio == pytest.approx(0.4) and add.delta_us == pytest.approx(-15.0)
    assert changes["aten::clone"].verdict == VANISHED and changes["aten::clone"].time_a_us == 20.0
    assert changes["aten::relu"].verdict == APPEARED and changes["aten::relu"].time_b_us == 5.0
    assert [c.op for c in match_ops(a, b, 0.1)][0] == "aten::mm"  # largest change first


def test_module_is_part_of_the_key():
    rows = [("aten::mm", "[[2, 2]]", "[]", "[]", "m.py:1", 1, 10.0)]
    a, b = make_run(rows), make_run(rows)
    a.ops["module"], b.ops["module"] = ["lm_head"], ["encoder"]
    changes = match_ops(a, b, 0.1)
    assert [c.matched_by for c in changes] == ["line"]  # not by inputs: the module differs
    b.ops["module"] = ["lm_head"]
    assert [c.matched_by for c in match_ops(a, b, 0.1)] == ["inputs"]


def _finding(rule: str, loc: str, op: str = "aten::clone") -> dict:
    return {"rule": rule, "severity": "medium", "op": op, "source_location": loc, "message": "m", "suggestion": "s",
            "est_savings_us": 1.0}


def test_findings_fixed_introduced_and_moved():
    a = make_run([], findings=[_finding("implicit-copy", "m.py:19"), _finding("implicit-copy", "m.py:20"),
                               _finding("fusion", "m.py:30", "aten::add")])
    b = make_run([], findings=[_finding("fusion", "m.py:28", "aten::add"), _finding("low-bandwidth", "m.py:5")])
    fixed, introduced, kept = match_findings(a, b)
    assert [f.source_location for f in fixed] == ["m.py:19", "m.py:20"]
    assert [f.rule for f in introduced] == ["low-bandwidth"]
    assert kept == 1  # the fusion finding moved two lines up with an edit


def test_totals_and_notes():
    a = make_run([("aten::mm", "[]", "[]", "[]", "m.py:1", 1, 300.0)], steps=3)
    b = make_run([("aten::mm", "[]", "[]", "[]", "m.py:1", 1, 300.0)], steps=1)
    b.summary["step_time_us"] = 1500.0
    b.meta["device"] = {"type": "cuda", "name": "y"}
    c = compare_runs(a, b)
    assert (c.op_time_a_us, c.op_time_b_us) == (100.0, 300.0)
    assert c.step_ratio == 1.5 and c.step_verdict == SLOWER
    assert any("different devices" in n for n in c.notes)
    doc = c.to_json()
    assert doc["step_ratio"] == 1.5 and doc["ops"][0]["ratio"] == 3.0
    a.summary["step_time_us_p50"], b.summary["step_time_us_p50"] = 900.0, 990.0  # medians when both have them
    c = compare_runs(a, b)
    assert c.step_time_key == "step_time_us_p50" and c.step_ratio == pytest.approx(1.1)


# --- the CLI on real runs -------------------------------------------------------------------------

WORK = """
import torch
import torch.nn as nn

REPS = {reps}


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(256, 256) / 16)

    def forward(self, x):
        for _ in range(REPS):
            x = torch.tanh(x @ self.w)
        return x


def get_inputs():
    return [torch.randn(256, 256)]
"""


@pytest.fixture(scope="module")
def work_runs(tmp_path_factory) -> dict[str, Path]:
    """A: 4 matmul+tanh per step; B: the same model with 25x the work (100 per step). No timing noise on
    a loaded machine brings B within 1.10x of A: A's steps would have to be slowed 20-fold while B's
    were not."""
    folder = tmp_path_factory.mktemp("compare")
    runs = {}
    for name, reps in (("a", 4), ("b", 100)):
        model = write_model(folder, WORK.format(reps=reps), f"work_{name}.py")
        proc = run_cli("profile", str(model), "--steps", "3", "--warmup", "1", "--threads", "1", "--out",
                       str(folder / name), *PEAKS, cwd=folder)
        assert proc.returncode == 0, proc.stderr
        runs[name] = folder / name
    shutil.copytree(runs["a"], folder / "a_copy")
    runs["a_copy"] = folder / "a_copy"
    return runs


@pytest.mark.slow
def test_fail_above_passes_identical_runs(work_runs):
    proc = run_cli("compare", str(work_runs["a"]), str(work_runs["a_copy"]), "--fail-above", "1.5")
    assert proc.returncode == 0, proc.stderr
    assert "1.00x" in proc.stdout and "No op changed beyond the noise band" in proc.stdout


@pytest.mark.slow
def test_fail_above_catches_a_slower_run(work_runs):
    proc = run_cli("compare", str(work_runs["a"]), str(work_runs["b"]), "--fail-above", "1.10", "--json")
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["step_ratio"] > 1.10 and doc["step_verdict"] == SLOWER
    assert "regression" in proc.stderr and "--fail-above 1.1" in proc.stderr
    mm = next(c for c in doc["ops"] if c["op"] == "aten::mm")
    assert mm["calls_b"] == 25 * mm["calls_a"]
    # The same pair the other way round is an improvement, and passes the gate.
    assert run_cli("compare", str(work_runs["b"]), str(work_runs["a"]), "--fail-above", "1.10").returncode == 0


def test_bad_input_is_exit_2(tmp_path, work_runs):
    proc = run_cli("compare", str(tmp_path / "nope"), str(work_runs["a"]))
    assert proc.returncode == 2 and "no such run directory" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_cli("compare", str(work_runs["a"]), str(work_runs["a"]), "--fail-above", "0")
    assert proc.returncode == 2 and "positive ratio" in proc.stderr
    no_step = tmp_path / "no_step"
    shutil.copytree(work_runs["a"], no_step)
    summary = json.loads((no_step / "summary.json").read_text())
    summary.pop("step_time_us")
    summary.pop("step_time_us_p50", None)  # profile runs also carry the median
    (no_step / "summary.json").write_text(json.dumps(summary))
    proc = run_cli("compare", str(work_runs["a"]), str(no_step), "--fail-above", "1.1")
    assert proc.returncode == 2 and "step time" in proc.stderr


@pytest.mark.slow
def test_before_and_after_a_fix(tmp_path):
    """transpose_copy_before.py copies q, k and v (transpose + reshape); the after file passes strided
    views to SDPA. The comparison names the copies as gone and the implicit-copy findings as fixed."""
    for name in ("before", "after"):
        proc = run_cli("profile", str(EXAMPLES / "findings" / f"transpose_copy_{name}.py"), "--steps", "2",
                       "--warmup", "1", "--out", str(tmp_path / name), *PEAKS, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    proc = run_cli("compare", str(tmp_path / "before"), str(tmp_path / "after"), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    before = EXAMPLES / "findings" / "transpose_copy_before.py"
    lines = {f"{before.name}:{line_of(before, f'{x} = {x}.transpose(1, 2).reshape')}" for x in "qkv"}
    copies = [c for c in doc["ops"] if c["op"] in ("aten::clone", "aten::copy_")
              and any(c["source_a"].endswith(line) for line in lines)]
    assert {c["op"] for c in copies} == {"aten::clone", "aten::copy_"}
    assert all(c["verdict"] == VANISHED for c in copies), copies
    assert any(c["op"] == "aten::bmm" and c["verdict"] == VANISHED for c in doc["ops"])
    assert any("scaled_dot_product" in c["op"] and c["verdict"] == APPEARED for c in doc["ops"])
    assert {f["rule"] for f in doc["findings_fixed"]} >= {"implicit-copy"}
    assert not any(f["rule"] == "implicit-copy" for f in doc["findings_introduced"])
    text = run_cli("compare", str(tmp_path / "before"), str(tmp_path / "after")).stdout
    assert "Findings fixed" in text and "implicit-copy" in text and "vanished" in text


def test_modules_match_across_torch_compiles_wrapper():
    # eager: Block at the root; compiled: an OptimizedModule whose `_orig_mod` is the Block
    eager = make_run([("aten::addmm", "[]", "[]", "[]", "m.py:10", 2, 400.0)], steps=2)
    eager.modules = {"module": ["", "fc1", "ln"], "module_class": ["Block", "Linear", "LayerNorm"],
                     "time_us_total": [1000.0, 400.0, 300.0]}
    eager.ops["module"] = ["fc1"]
    compiled = make_run([("graph_0_cpp_fused_gelu_0", "[]", "[]", "[]", "m.py:10", 2, 100.0),
                         ("aten::addmm", "[]", "[]", "[]", "m.py:10", 2, 380.0)], steps=2)
    compiled.modules = {"module": ["", "_orig_mod", "_orig_mod.fc1", "_orig_mod.act"],
                        "module_class": ["OptimizedModule", "Block", "Linear", "GELU"],
                        "time_us_total": [600.0, 600.0, 380.0, 100.0]}
    compiled.ops["module"] = ["_orig_mod.act", "_orig_mod.fc1"]
    c = compare_runs(eager, compiled)
    by = {m.module: m for m in c.modules}
    assert set(by) == {"", "fc1", "ln", "act"}
    assert (by[""].module_class, by[""].time_a_us, by[""].time_b_us) == ("Block", 500.0, 300.0)
    assert by[""].verdict == FASTER and by["fc1"].verdict == SAME
    assert by["ln"].verdict == VANISHED and by["act"].verdict == APPEARED  # ln's ops fused into another's kernel
    assert (by["fc1"].rows_a, by["fc1"].rows_b) == (1, 1) and by["act"].rows_b == 1
    assert c.to_json()["modules"][0]["module"] == ""


@pytest.mark.parametrize("width", [120, 140])
def test_the_changed_ops_source_keeps_its_line_number(width):
    """The source column gives way on narrow terminals from the left: "…ock.py:28", never "transformer_bl…"."""
    import io

    from rich.console import Console

    from opscope.render.console_report import comparison_group

    where = "examples/a_rather_long_directory_name/transformer_block.py:28"
    a = make_run([("aten::addmm", "[[1024], [512, 256], [256, 1024]]", '["float"]', "[[1], [256, 1], [1, 256]]",
                   where, 1, 1000.0)])
    b = make_run([("aten::addmm", "[[1024], [512, 256], [256, 1024]]", '["float"]', "[[1], [256, 1], [1, 256]]",
                   where, 1, 3000.0)])
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(comparison_group(compare_runs(a, b), width=width))
    (row,) = [ln for ln in out.getvalue().splitlines() if ln.lstrip().startswith("addmm")]
    assert len(row.rstrip()) <= width and row.rstrip().endswith(":28"), row
