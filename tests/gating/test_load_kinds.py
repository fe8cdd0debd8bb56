"""The gate's two corrections on synthetic samples of known distributions (no timing): load measured on rows of
each op row's own kind (load slows memory- and compute-bound ops unalike), and the threshold widened by the
baseline's between-run spread (steps of one run share its effects)."""

from __future__ import annotations

import json

import pytest
from gate_helpers import synthetic

from opscope.gating import baseline as bl
from opscope.gating.verdict import OK, REGRESSION, UNTESTED, gate, run_spread

ADD = ("aten::add", "model.py:16", "", 8_000.0)  # a second memory-bound row: the relu's peer
# a loaded run: memory-bound rows 2x slower, compute-bound ones 1.2x (a CPU hog on the SMT sibling)
LOADED = {"memory": [2.0], "compute": [1.2]}


def run_gate(base, new, **kw):
    return gate(base, new, baseline_name="base", **kw)


def item(result, op, line):
    found = [i for i in result.items if i.kind == "op" and i.name == op and i.line == line]
    assert len(found) == 1, result.items
    return found[0]


def test_a_loaded_run_of_the_same_code_passes_and_a_lone_memory_row_is_untested_with_its_reason():
    base = synthetic(3, seed=1, per_step=True, bounds=True)
    for seed in range(2, 8):
        same = run_gate(base, synthetic(1, seed=seed, per_step=True, bounds=True, noisy=True, kind_load=LOADED))
        assert same.exit_code == 0, same.regressions
        relu = item(same, "aten::clamp_min", "model.py:14")
        assert relu.verdict == UNTESTED and "no other memory-bound row to measure the load it sees" in relu.reason
        assert any("not gated on these noisy runs (aten::clamp_min at model.py:14)" in n for n in same.notes)
        # the matmuls are each other's peers: gated, and load cancels
        for line in ("model.py:14", "model.py:15"):
            mm = item(same, "aten::mm", line)
            assert mm.verdict == OK and mm.ratio == pytest.approx(1.0, abs=0.08)


def test_without_kinds_the_same_load_is_a_false_alarm():
    # what the gate did before (and still does when neither side knows the bounds: one class of rows): the
    # relu divided by the matmuls' 1.2x looks 2 / 1.2 = 1.67x slower
    base = synthetic(3, seed=1, per_step=True)
    result = run_gate(base, synthetic(1, seed=2, per_step=True, noisy=True, kind_load=LOADED))
    relu = item(result, "aten::clamp_min", "model.py:14")
    assert relu.verdict == REGRESSION and relu.ratio == pytest.approx(1.67, rel=0.1)


def test_a_memory_row_with_a_peer_is_normalized_by_it():
    base = synthetic(3, seed=1, per_step=True, bounds=True, more=[ADD])
    for seed in range(2, 8):
        same = run_gate(base, synthetic(1, seed=seed, per_step=True, bounds=True, noisy=True, kind_load=LOADED,
                                        more=[ADD]))
        assert same.exit_code == 0, same.regressions
        for op, line in (("aten::clamp_min", "model.py:14"), ("aten::add", "model.py:16")):
            row = item(same, op, line)
            assert row.verdict == OK and row.ratio == pytest.approx(1.0, abs=0.15)  # not 2 / 1.2
    # and a memory row that really slows is caught against its peer's load
    slow = run_gate(base, synthetic(1, seed=2, per_step=True, bounds=True, noisy=True, kind_load=LOADED, more=[ADD],
                                    slower={"model.py:16": 1.5}))
    add = item(slow, "aten::add", "model.py:16")
    assert add.verdict == REGRESSION and add.ratio == pytest.approx(1.5, rel=0.1)


def test_a_real_compute_regression_under_the_same_load_is_caught():
    base = synthetic(3, seed=1, per_step=True, bounds=True)
    slow = run_gate(base, synthetic(1, seed=2, per_step=True, bounds=True, noisy=True, kind_load=LOADED,
                                    slower={"model.py:15": 1.3}))
    mm = item(slow, "aten::mm", "model.py:15")
    assert slow.exit_code == 1 and mm.verdict == REGRESSION and mm.ratio == pytest.approx(1.3, rel=0.08)
    assert item(slow, "aten::mm", "model.py:14").verdict == OK


def test_quiet_runs_gate_every_row_as_before():
    base = synthetic(3, seed=1, per_step=True, bounds=True)
    same = run_gate(base, synthetic(1, seed=2, per_step=True, bounds=True))
    assert not same.normalized and same.exit_code == 0
    assert item(same, "aten::clamp_min", "model.py:14").verdict == OK
    slow = run_gate(base, synthetic(1, seed=2, per_step=True, bounds=True, slower={"model.py:14": 1.5}))
    assert item(slow, "aten::clamp_min", "model.py:14").verdict == REGRESSION


def test_a_run_level_effect_in_the_baseline_widens_that_rows_threshold_and_says_so():
    # the add page-faults in one baseline process of three (5x its time, in every step of that run)
    base = synthetic(3, seed=1, per_step=True, bounds=True, more=[ADD], run_level={"model.py:16": [1.0, 5.0, 1.0]})
    for level in (5.0, 1.0):
        same = run_gate(base, synthetic(1, seed=2, per_step=True, bounds=True, more=[ADD],
                                        run_level={"model.py:16": [level]}))
        add = item(same, "aten::add", "model.py:16")
        assert add.verdict == OK, add
        assert "threshold widened to +" in add.reason and "differ by 5" in add.reason
        assert any("wider threshold" in n for n in same.notes)
    # without the widening, the slow process would be a false alarm: its steps pooled look 5x
    assert run_spread([[1.0] * 10, [5.0] * 10, [1.0] * 10]) == pytest.approx(5.0)
    # a row whose baseline runs agree keeps the plain threshold: +50% is caught
    base = synthetic(3, seed=1, per_step=True, bounds=True, more=[ADD], run_level={"model.py:16": [1.0, 5.0, 1.0]},
                     spread=0.01)
    slow = run_gate(base, synthetic(1, seed=2, per_step=True, bounds=True, more=[ADD], spread=0.01,
                                    slower={"model.py:15": 1.5}))
    mm = item(slow, "aten::mm", "model.py:15")
    assert mm.verdict == REGRESSION and "widened" not in mm.reason
    assert item(slow, "aten::add", "model.py:16").verdict == OK


def test_a_tight_baseline_is_not_widened():
    base = synthetic(3, seed=1, per_step=True, spread=0.01)
    same = run_gate(base, synthetic(1, seed=2, per_step=True, spread=0.01))
    assert not any("widened" in i.reason for i in same.items)
    assert not any("wider threshold" in n for n in same.notes)


def test_an_old_baseline_without_bounds_loads_and_gates(tmp_path):
    path = bl.save_baseline(synthetic(3, seed=1, per_step=True, bounds=True), "old", tmp_path)
    doc = json.loads(path.read_text())
    for row in doc["samples"]["ops"]:
        del row["bound"]  # as opscope wrote it before it kept the bound
    path.write_text(json.dumps(doc))
    old = bl.load_baseline("old", tmp_path).samples
    assert {r.bound for r in old.ops} == {""}
    # gated runs that know their bounds: the kinds come from them
    loaded = run_gate(old, synthetic(1, seed=2, per_step=True, bounds=True, noisy=True, kind_load=LOADED))
    assert loaded.exit_code == 0
    assert "no other memory-bound row" in item(loaded, "aten::clamp_min", "model.py:14").reason
    # neither side knows them: every row one class (unknown), gated as before
    quiet = run_gate(old, synthetic(1, seed=2, per_step=True))
    assert quiet.exit_code == 0 and item(quiet, "aten::clamp_min", "model.py:14").verdict == OK
    noisy = run_gate(old, synthetic(1, seed=2, per_step=True, noisy=True, load=[2.0]))
    assert noisy.exit_code == 0 and item(noisy, "aten::clamp_min", "model.py:14").verdict == OK


def test_a_module_is_normalized_kind_by_kind():
    # fc1's module is one matmul: measured against the load on the compute rows outside it (fc2), not on the
    # relu that load slows 2x; modules have one sample per run, so 8 runs a side
    base = synthetic(8, seed=1, bounds=True)
    same = run_gate(base, synthetic(8, seed=2, bounds=True, noisy=True, kind_load={"memory": [2.0] * 8,
                                                                                    "compute": [1.2] * 8}))
    fc1 = [i for i in same.items if i.kind == "module" and i.name == "fc1"][0]
    assert same.exit_code == 0 and fc1.verdict == OK and fc1.ratio == pytest.approx(1.0, abs=0.06)
    slow = run_gate(base, synthetic(8, seed=2, bounds=True, noisy=True, slower={"model.py:15": 1.3},
                                    kind_load={"memory": [2.0] * 8, "compute": [1.2] * 8}))
    assert [i.verdict for i in slow.items if i.kind == "module" and i.name == "fc2"] == [REGRESSION]
