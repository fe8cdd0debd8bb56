"""Findings' fixes on real CPU profiles: a `.contiguous()` copy's fix removes the copy under it (not only
aten::contiguous's own time), and a fusion finding's fix shortens its chain by the rule's own saving."""

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
def test_fusion_fix_takes_the_rules_saving_off_the_chain(runs):
    f = _finding(runs["fusion"], "fusion")
    # a CPU step is its ops back to back: the chain's saving reaches the step whole
    assert f["critical_path_saving_us"] == pytest.approx(f["est_savings_us"], rel=1e-6)
