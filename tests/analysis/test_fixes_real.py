"""Findings' fixes on real CPU profiles: a `.contiguous()` copy's fix removes the copy under it (not only
aten::contiguous's own time), a fusion finding's fix makes its chain one op moving the fused bytes at the
bandwidth ceiling, channels-last's takes the probe's measured saving off the convolutions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import EXAMPLES, PEAKS, run_cli

CONTIGUOUS = '''
import torch
import torch.nn as nn


class Proj(nn.Module):
    def __init__(self, d: int = 512) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d, d) / d**0.5)

    def forward(self, x):
        w_t = self.weight.t().contiguous()
        return torch.relu(x @ w_t)


def get_model():
    return Proj()


def get_inputs():
    return [torch.randn(16, 512)]
'''


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("fixes")
    (folder / "contiguous_model.py").write_text(CONTIGUOUS)
    out = {}
    for name, target in (("contiguous", folder / "contiguous_model.py"),
                         ("fusion", EXAMPLES / "findings" / "fused_gelu_before.py")):
        proc = run_cli("profile", str(target), "--steps", "3", "--warmup", "1", "--out", str(folder / name),
                       *PEAKS, cwd=folder)
        assert proc.returncode == 0, proc.stderr
        out[name] = folder / name
    return out


def _finding(run_dir: Path, rule: str) -> dict:
    (found,) = [f for f in json.loads((run_dir / "findings.json").read_text()) if f["rule"] == rule]
    return found


def _rows_at(run_dir: Path, line: str, op: str) -> float:
    import csv

    with open(run_dir / "ops.csv", newline="") as f:
        return sum(float(r["time_us_total"]) for r in csv.DictReader(f)
                   if r["source_location"] == line and r["op"] == op)


@pytest.mark.slow
def test_contiguous_copy_fix_removes_the_copy_below(runs):
    run = runs["contiguous"]
    f = _finding(run, "contiguous-call")
    copy_us = _rows_at(run, f["source_location"], "aten::copy_")
    assert copy_us > 0
    # the copy (its self time) is what the step loses: at least it, not aten::contiguous's few µs alone
    assert f["critical_path_saving_us"] >= 0.99 * copy_us


@pytest.mark.slow
def test_fusion_fix_is_the_chain_as_one_op_at_the_bandwidth_ceiling(runs):
    run = runs["fusion"]
    f = _finding(run, "fusion")
    import csv

    peak_bw = json.loads((run / "meta.json").read_text())["peaks"]["memory_bandwidth_gbps"]
    with open(run / "ops.csv", newline="") as fh:
        chain = [r for r in csv.DictReader(fh) if r["source_location"] in (f.get("lines") or [f["source_location"]])
                 and r["family"] not in ("matmul", "conv", "attention")]
    total_t = sum(float(r["time_us_total"]) for r in chain)
    total_b = sum(float(r["bytes_per_call"]) * float(r["calls"]) for r in chain)
    fused_t = min(total_b * (1 - f["est_savings_us"] / total_t) / (peak_bw * 1e3), total_t - f["est_savings_us"])
    # a CPU step is its ops back to back: what the chain loses reaches the step whole
    assert f["critical_path_saving_us"] == pytest.approx(total_t - fused_t, rel=1e-3)
    assert f["critical_path_saving_us"] >= f["est_savings_us"] - 0.01  # never less than the rule's estimate


@pytest.mark.slow
def test_channels_last_fix_takes_the_probes_saving_off_the_whole_op(tmp_path):
    """channels-last's saving is measured (the layout probe; stubbed here: channels_last twice as fast, so
    that the finding does not depend on this CPU's oneDNN path): its fix takes it off the convolution's
    whole time, which is in aten::convolution's children."""
    import opscope.capture.torch_profiler as tp
    from conftest import share_gates_off
    from opscope.capture.torch_profiler import profile_target
    from opscope.target.specs import ProfileOptions

    with pytest.MonkeyPatch.context() as mp, share_gates_off():
        mp.setattr(tp, "layout_probe_for", lambda device: (lambda spec: (200.0, 100.0)))
        opts = ProfileOptions(target=EXAMPLES / "findings" / "channels_last_before.py", out=tmp_path / "run",
                              steps=2, warmup=1, peak_bw=20.0, peak_flops=["1000"], mode="inference")
        run, _ = profile_target(opts)
    found = [f for f in run.findings if f["rule"] == "channels-last"]
    assert found
    for f in found:
        assert f["critical_path_saving_us"] == pytest.approx(f["est_savings_us"], abs=0.01)  # ns rounding


@pytest.mark.slow
def test_a_passed_swap_is_a_fix_at_its_measured_op_level_time(tmp_path):
    """`opscope whatif RUN --swap LABEL`: the rows a bundled kernel replaces (summary swap_candidates) take
    swap's measured op-level saving less time: (original - swapped median) x calls per step x steps. The
    swap.json here is written by hand (its numbers chosen), the run is a real CPU profile."""
    import opscope

    proc = run_cli("profile", str(EXAMPLES / "transformer_block.py"), "--steps", "2", "--warmup", "1", "--out",
                   str(tmp_path / "run"), *PEAKS, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run = opscope.load(tmp_path / "run")
    (cand,) = [c for c in run.summary["swap_candidates"] if c["kernel"] == "layer_norm"]
    rows_us = sum(run.ops[i]["time_us_total"] for i in cand["rows"])
    steps = run.summary["steps"]
    per_call_ms = rows_us / steps / 2 / 1e3  # two calls per step, as the op-level row says below
    result = {"label": "layer_norm", "status": "passed", "kernels": ["layer_norm"],
              "op_level": [{"site": "ln", "kernel": "layer_norm", "calls_per_step": 2,
                            "original": {"median_ms": per_call_ms}, "swapped": {"median_ms": per_call_ms / 4}}]}
    failed = {"label": "bias_gelu", "status": "failed", "kernels": ["bias_gelu"]}
    (tmp_path / "run" / "swap.json").write_text(json.dumps({"results": [result, failed]}))
    w = opscope.whatif(run, swaps=["layer_norm"])
    (applied,) = w.applied
    assert applied["fix"] == "swap:layer_norm"
    assert applied["saving_us"] == pytest.approx(0.75 * rows_us, rel=1e-3)  # 3/4 of the rows' time, all on the path
    with pytest.raises(opscope.OpscopeError, match="did not pass verification"):
        opscope.whatif(run, swaps=["bias_gelu"])
    proc = run_cli("whatif", str(tmp_path / "run"), "--swap", "rms_norm")
    assert proc.returncode == 2 and "no swap 'rms_norm'" in proc.stderr and proc.stderr.count("\n") == 1
