"""The gate's verdicts on synthetic samples of known distributions (tests/gating/gate_helpers.py): no timing."""

from __future__ import annotations

import pytest
from gate_helpers import synthetic

from opscope.errors import OpscopeError
from opscope.gating.verdict import NEW, OK, REGRESSION, UNTESTED, gate


def run_gate(base, new, **kw):
    return gate(base, new, baseline_name="base", **kw)


def test_the_same_distribution_passes_run_after_run():
    base = synthetic(3, seed=1)
    for seed in range(2, 22):
        result = run_gate(base, synthetic(1, seed=seed))
        assert result.exit_code == 0, [i for i in result.regressions]
        assert result.items[0].kind == "step" and result.items[0].verdict == OK


def test_a_slower_step_fails_and_names_the_op_that_grew():
    base = synthetic(3, seed=1)
    result = run_gate(base, synthetic(1, seed=2, slower={"model.py:15": 1.5}))
    step = result.items[0]
    assert result.exit_code == 1 and step.verdict == REGRESSION
    assert step.ratio > 1.2 and step.low is not None and step.low > 1.0
    assert "aten::mm at model.py:15" in step.reason
    # one run per op row: listed by change, not gated, and the notes say why
    assert all(i.verdict == UNTESTED for i in result.items if i.kind in ("op", "module"))
    assert any("one sample per run" in n for n in result.notes)


def test_a_change_within_the_threshold_passes():
    base = synthetic(3, seed=1, spread=0.01)
    result = run_gate(base, synthetic(1, seed=2, spread=0.01, slower={"model.py:15": 1.05}))
    assert result.exit_code == 0


def test_a_new_op_row_is_named_with_its_line_and_share():
    base = synthetic(3, seed=1)
    result = run_gate(base, synthetic(1, seed=2, extra=("aten::copy_", "model.py:16", 15_000.0)))
    new = [i for i in result.items if i.kind == "new op"]
    assert len(new) == 1 and new[0].verdict == REGRESSION and new[0].line == "model.py:16"
    assert new[0].share == pytest.approx(15_000 / (83_000 * 1.02), rel=0.1)
    small = run_gate(base, synthetic(1, seed=2, extra=("aten::copy_", "model.py:16", 2_000.0)))
    assert [i.verdict for i in small.items if i.kind == "new op"] == [NEW]


def test_op_rows_are_tested_when_there_are_enough_runs():
    base = synthetic(8, seed=1)
    result = run_gate(base, synthetic(8, seed=2, slower={"model.py:14": 1.4}))
    mm = [i for i in result.items if i.kind == "op" and i.line == "model.py:14" and i.name == "aten::mm"]
    assert mm[0].verdict == REGRESSION and mm[0].module == "fc1" and mm[0].p is not None and mm[0].p <= 0.01
    fc1 = [i for i in result.items if i.kind == "module" and i.name == "fc1"]
    assert fc1[0].verdict == REGRESSION
    other = [i for i in result.items if i.kind == "op" and i.line == "model.py:15"]
    assert other[0].verdict == OK


def test_a_loaded_noisy_run_is_normalized_not_failed_and_says_so():
    base = synthetic(3, seed=1)
    result = run_gate(base, synthetic(1, seed=2, load=[2.5], noisy=True))
    assert result.exit_code == 0 and result.normalized
    assert any("noisy" in n and "normalized" in n and "2.5" in n for n in result.notes)
    # new work still shows in a noisy run
    loaded_copy = run_gate(base, synthetic(1, seed=2, load=[2.5], noisy=True,
                                           extra=("aten::copy_", "model.py:16", 15_000.0)))
    assert loaded_copy.exit_code == 1
    assert {i.line for i in loaded_copy.regressions} >= {"model.py:16"}


def test_the_same_load_unmarked_fails_the_step():
    # without the noisy marker nothing is normalized: 2.5x is a regression (the gate does not guess)
    result = run_gate(synthetic(3, seed=1), synthetic(1, seed=2, load=[2.5]))
    assert result.exit_code == 1 and not result.normalized


def test_a_slower_machine_scales_the_baseline_and_says_so():
    base = synthetic(3, seed=1, bandwidth=20.0)
    result = run_gate(base, synthetic(1, seed=2, bandwidth=10.0, load=[2.0]))
    assert result.exit_code == 0
    assert any("ceilings are 0.50x" in n for n in result.notes)
    same = run_gate(base, synthetic(1, seed=2))
    assert not any("ceilings are" in n for n in same.notes)


def test_other_threads_are_noted_and_ceilings_not_compared():
    result = run_gate(synthetic(3, seed=1, threads=2), synthetic(1, seed=2, bandwidth=10.0, threads=1))
    assert any("threads" in n for n in result.notes)
    assert not any("ceilings are" in n for n in result.notes)


def test_bad_options_and_devices_are_bad_input():
    base = synthetic(3, seed=1)
    with pytest.raises(OpscopeError, match="confidence"):
        run_gate(base, synthetic(1, seed=2), confidence=1.5)
    with pytest.raises(OpscopeError, match="threshold"):
        run_gate(base, synthetic(1, seed=2), threshold=-0.1)
    gpu = synthetic(1, seed=2)
    gpu.machine.device_type = "cuda"
    with pytest.raises(OpscopeError, match="cuda"):
        run_gate(base, gpu)


def test_in_noisy_runs_a_slower_op_is_measured_against_the_load_on_the_others():
    base = synthetic(8, seed=1, noisy=True, load=[1.0, 1.3, 0.9, 1.6, 1.1, 1.0, 2.0, 1.2])
    load = [2.0, 1.5, 2.5, 1.8, 2.2, 1.4, 2.6, 1.9]
    slow = run_gate(base, synthetic(8, seed=2, noisy=True, load=load, slower={"model.py:14": 1.4}))
    mm = [i for i in slow.items if i.kind == "op" and i.name == "aten::mm" and i.line == "model.py:14"]
    assert mm[0].verdict == REGRESSION and mm[0].ratio == pytest.approx(1.4, rel=0.1)
    same = run_gate(base, synthetic(8, seed=2, noisy=True, load=load))
    assert same.exit_code == 0 and same.normalized


def test_op_rows_with_per_step_samples_are_tested_from_one_run():
    base = synthetic(3, seed=1, per_step=True)
    slow = run_gate(base, synthetic(1, seed=2, per_step=True, slower={"model.py:15": 1.4}))
    mm = [i for i in slow.items if i.kind == "op" and i.line == "model.py:15"]
    assert mm[0].verdict == REGRESSION and mm[0].module == "fc2" and mm[0].low > 1.2
    assert any("tested on each step" in n for n in slow.notes)
    for seed in range(2, 12):
        same = run_gate(base, synthetic(1, seed=seed, per_step=True))
        assert not [i for i in same.items if i.kind == "op" and i.verdict in (REGRESSION, UNTESTED)]
