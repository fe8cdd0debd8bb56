"""`opscope whatif RUN` as users run it (real subprocesses), opscope.api.whatif as a script calls it, and
the what-if numbers every analyzed run carries (findings' id and critical_path_saving_us, summary.json
whatif, whatif.json)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import EXAMPLES, PEAKS, TRACES, assert_clean_error, run_cli
from opscope import units

BERT = TRACES / "h100_bert-small_bf16.json.gz"


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("whatif") / "bert"
    proc = run_cli("analyze", str(BERT), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


def test_every_finding_has_an_id_and_a_saving_that_add_up(bert_run: Path):
    findings = json.loads((bert_run / "findings.json").read_text())
    summary = json.loads((bert_run / "summary.json").read_text())
    ids = [f["id"] for f in findings]
    assert len(set(ids)) == len(ids) and all(i.startswith(f["rule"] + "-") for i, f in zip(ids, findings, strict=True))
    w = summary["whatif"]
    steps_total = summary["step_time_us"] * summary["steps"]
    assert all(0 <= f["critical_path_saving_us"] <= steps_total for f in findings)
    assert w["replayed_step_time_us"] == pytest.approx(w["recorded_step_time_us"], rel=0.02)
    assert 0 < w["predicted_step_time_us"] <= w["replayed_step_time_us"]
    # launch-bound and overhead are the same fix (the launch gaps removed): one saving, counted once
    same = [f["critical_path_saving_us"] for f in findings if f["rule"] in ("launch-bound", "overhead")]
    assert len(same) == 2 and same[0] == same[1] > 0
    # with the gaps gone the GPU decides the step, and the other fixes (kernels at their roofline) count
    assert w["predicted_step_time_us"] <= w["replayed_step_time_us"] - same[0] / summary["steps"] + 0.01
    paths = json.loads((bert_run / "whatif.json").read_text())
    assert 0 < len(paths["critical_path"]) <= 2000 and 0 < len(paths["critical_path_fixed"]) <= 2000
    assert {s["lane"].split(":")[0] for s in paths["critical_path"]} <= {"cpu", "gpu"}


def test_ids_are_the_same_in_a_second_analysis(bert_run: Path, tmp_path: Path):
    proc = run_cli("analyze", str(BERT), "--out", str(tmp_path / "again"))
    assert proc.returncode == 0, proc.stderr
    first = [f["id"] for f in json.loads((bert_run / "findings.json").read_text())]
    assert [f["id"] for f in json.loads((tmp_path / "again" / "findings.json").read_text())] == first


def test_whatif_all_json(bert_run: Path):
    proc = run_cli("whatif", str(bert_run), "--all", "--json")
    assert proc.returncode == 0, proc.stderr
    w = json.loads(proc.stdout)
    assert {"recorded_step_time_us", "predicted_step_time_us", "applied", "critical_path"} <= set(w)
    saved = sum(a["saving_us_per_step"] for a in w["applied"])
    assert saved <= w["recorded_step_time_us"]
    assert w["predicted_step_time_us"] == pytest.approx(w["replayed_step_time_us"] - saved, abs=0.01)
    margins = [a["saving_us_per_step"] for a in w["applied"]]
    assert margins[0] == max(margins)  # the recommended order: the largest saving first
    # greedy on what each fix gains once those before it are applied: the kernel fixes that gain only once the
    # launch gaps are gone come before the fixes that gain nothing at all (a lazy order listed them after)
    zero = [i for i, m in enumerate(margins) if m == 0]
    assert not zero or all(m == 0 for m in margins[zero[0]:]), margins
    summary = json.loads((bert_run / "summary.json").read_text())
    assert w["predicted_step_time_us"] == pytest.approx(summary["whatif"]["predicted_step_time_us"], abs=0.01)


def test_whatif_console_and_the_summary_line(bert_run: Path):
    finding = json.loads((bert_run / "findings.json").read_text())[0]["id"]
    proc = run_cli("whatif", str(bert_run), "--finding", finding, "--op-speedup", "aten::addmm=2x")
    assert proc.returncode == 0, proc.stderr
    assert "predicted" in proc.stdout and finding in proc.stdout and "aten::addmm=2x" in proc.stdout
    report = run_cli("report", str(bert_run))
    summary = json.loads((bert_run / "summary.json").read_text())
    n, after = summary["whatif"]["fixes"], summary["whatif"]["predicted_step_time_us"]
    assert f"fix these {n} findings → step 4.43 ms → {units.duration(after)}" in report.stdout


def test_remove_gaps_on_the_launch_bound_trace(bert_run: Path):
    proc = run_cli("whatif", str(bert_run), "--remove-gaps", "--json")
    assert proc.returncode == 0, proc.stderr
    w = json.loads(proc.stdout)
    summary = json.loads((bert_run / "summary.json").read_text())
    busy = summary["device_busy_share"] * summary["step_time_us"]
    assert busy <= w["predicted_step_time_us"] < w["recorded_step_time_us"]


@pytest.mark.parametrize(("args", "needle"), [
    (["--finding", "launch-bound-00000000"], "no finding 'launch-bound-00000000'"),
    (["--op-speedup", "aten::gelu=0x"], "positive"),
    (["--op-speedup", "=2x"], "expected OP=FACTORx"),
    (["--op-speedup", "foo"], "expected OP=FACTORx"),
])
def test_bad_input_is_one_line(bert_run: Path, args: list[str], needle: str):
    assert_clean_error(run_cli("whatif", str(bert_run), *args), needle)


def test_a_run_without_its_trace(bert_run: Path, tmp_path: Path):
    copy = tmp_path / "copy"
    shutil.copytree(bert_run, copy)
    (copy / "trace.json.gz").unlink()
    assert_clean_error(run_cli("whatif", str(copy), "--all"), "no trace.json.gz")


def test_a_cpu_profile_run_replays_to_its_step_and_the_api_takes_speedups(tmp_path: Path):
    out = tmp_path / "mlp"
    proc = run_cli("profile", str(EXAMPLES / "mlp.py"), "--steps", "3", "--warmup", "1", *PEAKS, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["whatif"]["replayed_step_time_us"] == pytest.approx(summary["step_time_us"], rel=0.02)
    import opscope

    w = opscope.whatif(out, op_speedups=["aten::addmm=2x"])
    assert w.replayed_step_time_us == pytest.approx(summary["step_time_us"], rel=0.02)
    assert w.predicted_step_time_us < w.replayed_step_time_us
    assert [a["fix"] for a in w.applied] == ["aten::addmm=2x"]
    assert w.to_json()["critical_path"]


def test_no_fix_is_zero_percent_and_all_without_findings_says_so(bert_run: Path, tmp_path: Path):
    """A run whose recorded step differs from its replay (a merged run records the ranks' mean and replays
    rank 0's trace): with no fix applied the change is 0%, not the two's difference; --all on a run with no
    findings says that, not "give --all"."""
    run = tmp_path / "run"
    shutil.copytree(bert_run, run)
    (run / "findings.json").write_text("[]")
    summary = json.loads((run / "summary.json").read_text())
    summary["step_time_us"] *= 1.1
    (run / "summary.json").write_text(json.dumps(summary))
    proc = run_cli("whatif", str(run), "--all")
    assert proc.returncode == 0, proc.stderr
    assert "(0.0% faster)" in proc.stdout
    assert "no fix applied: the run has no findings (--all applies each finding's fix)" in proc.stdout
    plain = run_cli("whatif", str(run))
    assert "no fix applied: give --finding ID, --all" in plain.stdout
