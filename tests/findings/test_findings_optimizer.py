"""optimizer-loop on a real training script (script mode): a per-parameter AdamW step is one finding at its
step() line naming fused=True / foreach=True, once; multi-tensor and fused steps are not reported; the
fusion and low-bandwidth rules leave the loop's ops alone. Fusion chains name each source line once."""

from __future__ import annotations

from collections import Counter

import pytest

from conftest import PEAKS, line_of, run_cli, write_model
from opscope.findings.fusion import chain_text
from opscope.findings.optimizer_loop import passes, saving, suggestion_for
from opscope.run.read import read_run

# Three AdamW optimizers over three 12-layer MLPs: a per-parameter loop, a multi-tensor and a fused one.
# The first optimizer to step marks the profiled steps.
TRAIN = """
    import torch

    def mlp():
        return torch.nn.Sequential(*[torch.nn.Linear(128, 128) for _ in range(12)])

    a, b, c = mlp(), mlp(), mlp()
    opt_loop = torch.optim.AdamW(a.parameters(), lr=1e-3, foreach=False)
    opt_foreach = torch.optim.AdamW(b.parameters(), lr=1e-3, foreach=True)
    opt_fused = torch.optim.AdamW(c.parameters(), lr=1e-3, fused=True)
    for i in range(5):
        x = torch.randn(16, 128)
        (a(x).square().mean() + b(x).square().mean() + c(x).square().mean()).backward()
        opt_loop.step()  # LOOP
        opt_foreach.step()  # FOREACH
        opt_fused.step()  # FUSED
        for opt in (opt_loop, opt_foreach, opt_fused):
            opt.zero_grad()
"""


@pytest.fixture(scope="module")
def adamw_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("optim")
    script = write_model(folder, TRAIN, name="train.py")
    out = folder / "run"
    proc = run_cli("profile", str(script), "--skip-steps", "1", "--steps", "2", "--out", str(out), *PEAKS,
                   "--threads", "1", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    return script, read_run(out)


def _at(findings: list[dict], script, tag: str) -> list[dict]:
    where = f"{script.name}:{line_of(script, tag)}"
    return [f for f in findings if f["source_location"].endswith(where)]


@pytest.mark.slow
def test_a_per_parameter_adamw_step_is_one_optimizer_finding(adamw_run):
    script, run = adamw_run
    hits = _at(run.findings, script, "# LOOP")
    assert [f["rule"] for f in hits] == ["optimizer-loop"], hits  # not fusion, not low-bandwidth
    f = hits[0]
    assert f["message"].startswith("AdamW.step() updates the parameters one tensor at a time")
    # 24 parameters (12 weights, 12 biases), several ops each, in each of the 2 profiled steps
    n = int(f["message"].split("): ")[1].split(" ops per step")[0])
    k = float(f["message"].split("), ")[1].split(" per parameter")[0])
    assert n >= 24 * 4 and k == n / 24, f["message"]
    assert "fused=True" in f["suggestion"] and "foreach=True" in f["suggestion"]
    assert "torch.compile" not in f["suggestion"] and f["est_savings_us"] > 0
    # the step's line is said once, as the finding's location, not once per op in a message
    line = f"{script.name}:{line_of(script, '# LOOP')}"
    assert not [g for g in run.findings if line in g["message"]]


@pytest.mark.slow
def test_multi_tensor_and_fused_steps_are_not_reported(adamw_run):
    script, run = adamw_run
    for tag in ("# FOREACH", "# FUSED"):  # (on CPU, foreach ops loop per tensor inside: not torch.compile's)
        assert not [f for f in _at(run.findings, script, tag) if f["rule"] in ("optimizer-loop", "fusion")]
    assert [f["rule"] for f in run.findings].count("optimizer-loop") == 1


def test_passes_per_parameter_and_the_saving_follow_from_the_op_counts():
    adamw = {"optimizer": "AdamW", "loc": "t.py:9", "events": [], "time": 900.0,
             "ops": Counter({"aten::mul_": 48, "aten::lerp_": 24, "aten::addcdiv_": 24, "aten::sqrt": 24})}
    assert passes(adamw) == 5 and saving(adamw) == pytest.approx(900.0 * 4 / 5)
    # plain SGD: one p.add_(grad) per parameter, a single pass: fusing it saves no traffic, no finding
    sgd = {**adamw, "optimizer": "SGD", "ops": Counter({"aten::add_": 8})}
    assert passes(sgd) == 1 and saving(sgd) == 0.0


def test_optimizers_without_fused_get_foreach_only():
    assert "fused=True" in suggestion_for("SGD")
    text = suggestion_for("RMSprop")
    assert "foreach=True" in text and "fused" not in text


def test_a_fusion_chain_names_each_line_once():
    key = (("aten::mul", "m.py:3"), ("aten::add", "m.py:3"), ("aten::tanh", "m.py:4"), ("aten::mul", "m.py:3"))
    assert chain_text(key) == "mul -> add (m.py:3) -> tanh (m.py:4) -> mul (m.py:3)"
    assert chain_text((("aten::mul_", "o.py:9"),) * 24 + (("aten::lerp_", "o.py:9"),) * 24) == "mul_ x24 -> lerp_ x24 (o.py:9)"
    assert chain_text((("aten::exp", ""), ("aten::sum", ""))) == "exp -> sum"
