"""profile's in-context timing of the swap candidates (opscope.kernels.incontext): only a kernel measured
faster on the run's own shapes is a suggestion; one that lost is listed apart as slower here; where
nothing timed it, it claims nothing. No timing is asserted: the timer is injected where a verdict is."""

from __future__ import annotations

import json

import pytest

from conftest import EXAMPLES, PEAKS, run_cli
from opscope.findings.fusion import bundled_text, pattern_for
from opscope.kernels import incontext
from opscope.kernels.bench import Timing
from opscope.kernels.catalog import candidates
from opscope.run.schema import candidate_verdict, kernels_for_rows

# a Linear + GELU (bias_gelu's pattern) and a residual add (broadcast_add), as a profile's ops table has them
OPS = {
    "op": ["aten::addmm", "aten::gelu", "aten::add"],
    "input_dims": ["[[64], [32, 16], [16, 64], [], []]", "[[4, 8, 64], []]", "[[4, 8, 64], [4, 8, 64], []]"],
    "input_dtypes": ['["float", "float", "float", "Scalar", "Scalar"]', '["float", ""]', '["float", "float", "Scalar"]'],
    "concrete_inputs": ['["", "", "", "1", "1"]', '["", ""]', '["", "", "1"]'],
    "source_location": ["m.py:3", "m.py:3", "m.py:4"],
    "module": ["", "", ""],
    "calls": [2.0, 2.0, 2.0],
    "time_us_total": [50.0, 30.0, 20.0],
}


@pytest.fixture
def found():
    cands = candidates(OPS)
    assert {c["kernel"] for c in cands} == {"bias_gelu", "broadcast_add"}
    return cands


def _measure(cands, kernel_ms):
    """The candidates measured by a timer whose kernel takes kernel_ms[kernel] to the original's 1 ms."""
    def timer(name, original, kernel, budget_s):
        ms = kernel_ms[name]
        return Timing(1.0, 1.0, 1.0, [1.0] * 5), Timing(ms, ms, ms, [ms] * 5)

    return incontext.measure(cands, OPS, steps=2, timer=timer)


def test_a_kernel_forced_to_lose_goes_to_the_slower_ones(found):
    out = {c["kernel"]: c for c in _measure(found, {"bias_gelu": 0.5, "broadcast_add": 2.0})}
    win, lose = out["bias_gelu"], out["broadcast_add"]
    assert win["verdict"] == "faster" and win["measured_speedup"] == pytest.approx(2.0) and win["why"] is None
    assert win["original_us"] == pytest.approx(1000.0) and win["measured_us"] == pytest.approx(500.0)  # 1 call/step
    assert lose["verdict"] == "slower here" and lose["measured_speedup"] == pytest.approx(0.5)
    assert "2.00x the time" in lose["why"] and "[4, 8, 64] float32" in lose["why"]
    # only the winner is a suggestion, for its rows (the addmm and the GELU)
    assert kernels_for_rows(list(out.values()), range(3)) == {0: ["bias_gelu"], 1: ["bias_gelu"]}
    assert kernels_for_rows(list(out.values()), range(3), "slower here") == {2: ["broadcast_add"]}


def test_a_tie_is_not_a_win(found):
    out = _measure(found, {"bias_gelu": 1.0, "broadcast_add": 1.0})
    assert [c["verdict"] for c in out] == ["slower here", "slower here"]
    assert kernels_for_rows(out, range(3)) == {}


def test_the_linear_and_its_gelu_are_one_call_of_the_kernel(found):
    from reference_kernels._registry import op_module

    cand = next(c for c in found if c["kernel"] == "bias_gelu")
    (work,) = incontext._works(cand, OPS, 2, op_module("bias_gelu"))
    assert work.rows == [0, 1] and work.calls == 1.0 and work.time_us == 80.0
    x, bias = work.args[:2]
    assert (x.numel(), x.shape[-1], list(bias.shape)) == (32 * 64, 64, [64])


def test_not_measured_here_claims_nothing(found):
    for out in (incontext.measure(found, OPS, device="cuda"), incontext.not_measured(found, "a trace")):
        assert all(c["verdict"] == "not measured here" and c["measured_speedup"] is None and c["why"] for c in out)
        assert kernels_for_rows(out, range(3)) == {}
    # a run written before the in-context timing: its candidates were not measured, so none is suggested
    assert candidate_verdict({"kernel": "softmax", "rows": [0]}) == "not measured here"
    assert kernels_for_rows([{"kernel": "softmax", "rows": [0]}], range(3)) == {}


def test_findings_name_a_bundled_kernel_only_where_it_won():
    need = {"pow", "mean", "add", "rsqrt", "mul"}
    assert "rms_norm (1.50x" in pattern_for(need, speedups={"rms_norm": 1.5})[1]
    slower = pattern_for(need, speedups={"rms_norm": 0.8})[1]
    assert "Slower here, so not suggested: the bundled kernel rms_norm (0.80x)" in slower
    assert "does it in one pass" not in slower
    assert "was not measured here" in pattern_for(need)[1]
    assert bundled_text([], {}) == ""


def _check_run(run_dir, stdout: str) -> None:
    cands = json.loads((run_dir / "summary.json").read_text())["swap_candidates"]
    assert cands, "the example has name-matched candidates"
    for c in cands:
        verdict = candidate_verdict(c)
        assert c["verdict"] == verdict
        if verdict == "faster":
            # the verdict is the speedup weighted by the rows' profiled time; original_us/measured_us weight
            # the benchmark's medians by calls, and may disagree on a near-tie across several shapes
            assert c["measured_speedup"] > 1.0 and c["original_us"] > 0 and c["measured_us"] > 0
        elif verdict == "slower here":
            assert c["measured_speedup"] <= 1.0 and c["why"]
            assert f"{c['kernel']} {c['measured_speedup']:.2f}x" in stdout  # apart, with the number
        else:
            assert c["why"]
        assert c.get("measure_s") is None or c["measure_s"] < 5  # a few hundred ms each (generous: a loaded CI)
    suggested = {k for ks in kernels_for_rows(cands, range(10_000)).values() for k in ks}
    assert suggested == {c["kernel"] for c in cands if c["verdict"] == "faster"}
    findings = json.loads((run_dir / "findings.json").read_text())
    speed = {c["kernel"]: c["measured_speedup"] for c in cands}
    for f in findings:
        if "does it in one pass" in f["suggestion"]:  # a finding that suggests a bundled kernel: a winner
            named = [k for k in speed if f"kernel {k} (" in f["suggestion"] or f"kernels {k} (" in f["suggestion"]]
            assert named and all((speed[k] or 0) > 1.0 for k in named)


@pytest.mark.slow
@pytest.mark.parametrize("example", ["transformer_block", "llama_block"])
def test_profile_lists_only_measured_winners(tmp_path, example):
    from reference_kernels import _build

    _build.load_cpu_extension()  # built once per machine; profile only loads it
    proc = run_cli("profile", str(EXAMPLES / f"{example}.py"), "--steps", "2", "--warmup", "1", "--threads", "1",
                   *PEAKS, "--out", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr
    _check_run(tmp_path / "run", proc.stdout)
    cands = json.loads((tmp_path / "run" / "summary.json").read_text())["swap_candidates"]
    assert all(c["verdict"] != "not measured here" for c in cands)  # built here: every one was timed


def test_renderers_list_losers_apart(found):
    """The console's suggestions carry the measured speedup; the slower and the unmeasured come after,
    apart; the HTML report's table orders them the same way and says why."""
    from rich.console import Console

    from opscope.render.console import swap_candidates as console_candidates
    from opscope.render.report_data import candidate_table
    from opscope.run.model import Run

    cands = _measure(found, {"bias_gelu": 0.5, "broadcast_add": 2.0})
    cands.append(incontext.not_measured([{"kernel": "softmax", "rows": [2]}], "no C++ compiler here")[0])
    ops = {**OPS, "time_us_total": [50.0, 30.0, 20.0]}
    run = Run(meta={}, ops=ops, findings=[], summary={"swap_candidates": cands})
    console = Console(width=200, record=True)
    console.print(console_candidates(run))
    text = console.export_text()
    suggestions, rest = text.split("Slower here (not suggested):\n")
    assert "→ bias_gelu 2.00x" in suggestions and "broadcast_add" not in suggestions
    assert rest.startswith("  broadcast_add 0.50x\n") and "Not measured here: softmax (no C++ compiler here)" in rest
    columns, rows = candidate_table(run)
    assert [r[:3] for r in rows] == [["bias_gelu", "faster", "2.00x"], ["broadcast_add", "slower here", "0.50x"],
                                     ["softmax", "not measured here", "—"]]
    assert rows[1][columns.index("why")].startswith("the kernel took 2.00x the time")
