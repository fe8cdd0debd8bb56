"""The public Python API used as a notebook would: a model object profiled in-process, a block of code
under opscope.profiling(), a run loaded back and compared, a shared trace analyzed; and the CLI's numbers
on the same model are the API's."""

from __future__ import annotations

import html
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import opscope
from conftest import EXAMPLES, PEAKS, REPO, TRACES, run_cli

PEAK_KW = {"peak_bw": 20.0, "peak_flops": "100"}  # PEAKS: no calibration, identical ceilings in every run
COST_KEY = ("op", "input_dims", "input_dtypes", "source_location", "module", "calls", "flops_per_call",
            "bytes_per_call", "bound")


def _example(name: str):
    """An example model file imported as a module (as a notebook would import the user's model code)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 128)
        self.norm = torch.nn.LayerNorm(128)
        self.fc2 = torch.nn.Linear(128, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.fc1(x))
        return self.fc2(self.norm(h))


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    torch.manual_seed(0)
    model = Net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    run = opscope.profile(model, [torch.randn(16, 64)], mode="train", steps=3, warmup=1,
                          out=tmp_path_factory.mktemp("api") / "run", **PEAK_KW)
    return model, before, run


def test_profile_returns_a_run_with_rows_findings_and_html(profiled, tmp_path):
    model, before, run = profiled
    assert isinstance(run, opscope.Run) and run.dir is not None and (run.dir / "ops.csv").is_file()
    assert run.meta["api"] == "profile" and run.meta["target"] == "Net" and run.meta["mode"] == "train"
    assert run.summary["steps"] == 3 and run.step_time_us and run.step_time_us > 0
    rows = list(run.ops)
    assert len(rows) == len(run.ops) > 0 and rows[0] == run.ops[0] and run.ops[-1] == rows[-1]
    assert run.ops["op"] == [r["op"] for r in rows]
    # forward ops at this file's lines, in the model's modules
    this_file = Path(__file__).name
    fc1 = [r for r in rows if r["op"] == "aten::addmm" and r["module"] == "fc1"]
    assert fc1 and all(r["source_location"].split(":")[0].endswith(this_file) for r in fc1), fc1
    assert fc1[0]["flops_per_call"] == 2 * 16 * 64 * 128  # addmm: 2*M*N*K
    frame = run.to_pandas()
    assert list(frame["op"]) == run.ops["op"]
    assert run.ops.to_pandas().shape == (len(run.ops), len(run.ops.columns))
    assert run.modules is not None and "fc1" in run.modules["module"]
    # findings are typed, the same as findings.json
    on_disk = json.loads((run.dir / "findings.json").read_text())
    assert [f.to_dict() for f in run.findings] == on_disk
    for f in run.findings:
        assert isinstance(f, opscope.Finding) and f.severity in ("high", "medium", "low") and f.message
    # the caller's model is as it was: weights, gradients, train/eval flag
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters()) and model.training
    # the HTML report: written beside the run, and in a notebook as a sandboxed frame holding it
    path = run.html()
    assert path == run.dir / "report.html" and path.read_text().startswith("<!DOCTYPE html>")
    assert run.html() == path  # the run's own report is rewritten
    view = run._repr_html_()
    assert view.startswith('<iframe sandbox="allow-scripts" srcdoc="') and "<script" not in view
    document = html.unescape(view.split('srcdoc="', 1)[1].split('" style=', 1)[0])
    assert document == path.read_text()
    other = tmp_path / "other.html"
    assert run.html(other) == other
    with pytest.raises(opscope.OpscopeError, match="exists"):
        run.html(other)
    assert run.html(other, force=True) == other


def test_print_and_load_round_trip(profiled, capsys):
    _, _, run = profiled
    loaded = opscope.load(run.dir)
    assert loaded.summary == run.summary and loaded.meta == run.meta
    assert loaded.findings == run.findings
    assert loaded.ops.to_records() == run.ops.to_records()  # NaN aside: pandas' equality below
    assert loaded.to_pandas().equals(run.to_pandas())
    loaded.print(top=5, width=160)
    out = capsys.readouterr().out
    assert "Top 5 ops" in out and "verdict" in out and "run directory" in out
    comparison = opscope.compare(run, run.dir)
    assert comparison.step_ratio == pytest.approx(1.0) and comparison.findings_introduced == []


def test_profiling_block_with_three_steps(tmp_path):
    model = Net()
    x = torch.randn(8, 64)
    with opscope.profiling(out=tmp_path / "block", **PEAK_KW) as session:
        for _ in range(3):
            model(x).sum().backward()
            session.step()
        with pytest.raises(opscope.OpscopeError, match="block has ended"):
            session.run  # noqa: B018
    run = session.run
    assert run.summary["steps"] == 3 and run.meta["steps"] == 3 and run.meta["api"] == "profiling"
    assert run.meta["mode"] == "train"  # a backward ran
    assert sum(r["calls"] for r in run.ops if r["op"] == "aten::addmm") == 2 * 3  # fc1 and fc2, three steps: nothing after the last step() counted
    lines = {r["source_location"] for r in run.ops if r["op"] == "aten::addmm"}
    assert lines and all(line.split(":")[0].endswith(Path(__file__).name) for line in lines), lines


def test_profiling_without_step_is_one_step_and_errors_pass_through(tmp_path):
    x = torch.randn(32, 32)
    with opscope.profiling(out=tmp_path / "one", **PEAK_KW) as session:
        (x @ x).relu()
    assert session.run.summary["steps"] == 1
    with pytest.raises(ZeroDivisionError), opscope.profiling(out=tmp_path / "failed", **PEAK_KW):
        x @ x
        1 / 0  # noqa: B018
    assert not (tmp_path / "failed").exists()  # nothing written


def test_analyze_a_shared_trace(tmp_path):
    run = opscope.analyze(TRACES / "h100_bert-small_bf16.json.gz", out=tmp_path / "bert")
    assert run.meta["device"]["type"] == "cuda" and len(run.ops) > 10 and run.findings
    top = run.ops[0]
    assert top["time_us_total"] == max(run.ops["time_us_total"])
    assert opscope.load(tmp_path / "bert").summary == run.summary


def test_comparison_and_whatif_print_as_a_line(tmp_path):
    """A notebook shows their repr: a line each (a comparison's dataclass repr ran to 200 KB, a what-if's
    listed every critical-path segment); the data stays on the objects."""
    run = opscope.analyze(TRACES / "h100_bert-small_bf16.json.gz", out=tmp_path / "bert")
    same = opscope.compare(run, run)
    assert repr(same) == ("<opscope.Comparison bert against bert: step 4.43 ms → 4.43 ms (1.00x, within noise); "
                          "op rows: none changed; findings 0 fixed, 0 introduced>")
    fixed = opscope.whatif(run, all=True)
    text = repr(fixed)
    assert "\n" not in text and len(text) < 300 and fixed.critical_path
    assert text.startswith(f"<opscope.WhatIf step 4.43 ms recorded, 674 µs predicted with {len(fixed.applied)} fixes (")
    assert fixed.applied[0]["fix"] in text and text.endswith(f"critical path {len(fixed.critical_path)} segments>")


def test_bad_input_is_one_opscope_error(tmp_path):
    with pytest.raises(opscope.OpscopeError, match="no such run directory"):
        opscope.load(tmp_path / "missing")
    with pytest.raises(opscope.OpscopeError, match="Protocol not known"):
        opscope.analyze("nosuchscheme://example.com/trace.json.gz")
    with pytest.raises(opscope.OpscopeError, match="mode must be"):
        opscope.profile(Net(), [torch.randn(2, 64)], mode="training")
    with pytest.raises(opscope.OpscopeError, match="nn.Module"):
        opscope.profile(lambda x: x, [torch.randn(2)])
    with pytest.raises(opscope.OpscopeError, match="without inputs"):
        opscope.profile(EXAMPLES / "mlp.py", [torch.randn(2)])


@pytest.mark.slow
def test_api_and_cli_give_the_same_ops_flops_and_bytes(tmp_path):
    """The same model file through the CLI (a child process) and through the API, in-process from the model
    object and as a path: the same op rows, lines, modules, FLOPs and bytes."""
    proc = run_cli("profile", str(EXAMPLES / "transformer_block.py"), "--steps", "2", "--warmup", "1", "--out",
                   str(tmp_path / "cli"), *PEAKS, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    cli = opscope.load(tmp_path / "cli")
    example = _example("transformer_block")
    model, inputs = example.get_model(), example.get_inputs()
    in_process = opscope.profile(model, inputs, steps=2, warmup=1, out=tmp_path / "api", **PEAK_KW)
    by_path = opscope.profile(EXAMPLES / "transformer_block.py", steps=2, warmup=1, out=tmp_path / "path", **PEAK_KW)

    def costs(run: opscope.Run) -> list[tuple]:
        # a source path is shown relative to the working directory: the CLI ran in another one
        return sorted(tuple(str(r[k]) if k != "source_location" else Path(r[k]).name for k in COST_KEY)
                      for r in run.ops)

    assert costs(cli) == costs(by_path)
    # in-process, the model was built outside opscope: ops the user's code does not issue (inside torch's
    # own modules) are placed by the user frame above them, as in the CLI for this model
    assert costs(in_process) == costs(cli)
    assert len(cli.ops) > 5


def test_import_opscope_is_cheap_and_imports_no_torch():
    code = ("import sys, time; t = time.perf_counter(); import opscope; t = time.perf_counter() - t; "
            "assert 'torch' not in sys.modules and 'pandas' not in sys.modules and 'mcp' not in sys.modules; "
            "opscope.Run; opscope.analyze; assert 'torch' not in sys.modules; print(t)")
    best = min(float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                     cwd=REPO, env={**os.environ, "PYTHONDONTWRITEBYTECODE": ""}).stdout)
               for _ in range(3))
    assert best < 0.3
    assert set(opscope.__all__) <= set(dir(opscope))
    for name in opscope.__all__:
        assert getattr(opscope, name).__doc__ or name == "__version__", name
