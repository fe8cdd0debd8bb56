"""The typed run format (opscope.run.schema): every file opscope writes follows it, readers reject a bad or
future file in one line and accept keys they do not know, every CSV column written is declared, and the
published JSON Schema and column tables (docs/generated) are the module's."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from conftest import REPO, TRACES, assert_clean_error, run_cli
from opscope.analysis.trace_file import analyze_trace_file
from opscope.errors import OpscopeError
from opscope.run import schema
from opscope.run.read import read_run
from opscope.run.swap_results import read_swap

RANK_TRACES = REPO / "tests" / "fixtures" / "distributed"
DECLARED = {
    "ops.csv": schema.OPS_COLUMNS, "modules.csv": schema.MODULES_COLUMNS, "ranks.csv": schema.RANKS_COLUMNS,
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[Path]:
    folder = tmp_path_factory.mktemp("schema")
    out = [analyze_trace_file(trace, out=folder / trace.name.removesuffix(".json.gz")).path
           for trace in sorted(TRACES.glob("*.json.gz"))]
    merged = folder / "ranks"
    assert run_cli("analyze", str(RANK_TRACES), "--out", str(merged)).returncode == 0
    return [*out, merged, *sorted((merged / "ranks").iterdir())]


def test_every_file_written_follows_the_format(runs):
    for run in runs:
        for name in ("meta.json", "summary.json", "findings.json"):
            schema.check(name, json.loads((run / name).read_text()))
        for name, columns in DECLARED.items():
            if (run / name).is_file():
                with open(run / name, newline="") as f:
                    header = next(csv.reader(f))
                undeclared = set(header) - {c.name for c in columns}
                assert not undeclared, (run / name, undeclared)


def test_the_ops_columns_are_declared_in_the_order_they_are_written(runs):
    order = [c.name for c in schema.OPS_COLUMNS]
    for run in runs:
        with open(run / "ops.csv", newline="") as f:
            header = next(csv.reader(f))
        positions = [order.index(c) for c in header]
        assert positions == sorted(positions), run


def _copy(run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(run, dst)
    return dst


def _edit(path: Path, change) -> None:  # noqa: ANN001
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(("file", "change", "where"), [
    ("summary.json", lambda d: d.update(memory={"peak_op": 3}), "$.memory.peak_op"),
    ("summary.json", lambda d: d.update(steps=True), "$.steps"),
    ("summary.json", lambda d: d.update(total_time_us="fast"), "$.total_time_us"),
    ("summary.json", lambda d: d["top_ops"][0].update(calls="many"), "$.top_ops[0].calls"),
    ("meta.json", lambda d: d["peaks"].update(memory_bandwidth_gbps=-1), "$.peaks.memory_bandwidth_gbps"),
    ("findings.json", lambda d: d[0].pop("severity"), "severity"),
])
def test_a_wrong_type_anywhere_is_one_line_naming_the_key(runs, tmp_path, file, change, where):
    run = _copy(runs[0], tmp_path)
    _edit(run / file, change)
    with pytest.raises(OpscopeError, match="is damaged") as exc:
        read_run(run)
    assert where in str(exc.value) and "\n" not in str(exc.value)
    assert_clean_error(run_cli("report", str(run)), file, where)


def test_a_number_must_be_finite(runs, tmp_path):
    run = _copy(runs[0], tmp_path)
    text = (run / "summary.json").read_text()
    (run / "summary.json").write_text(text.replace('"total_time_us": ', '"total_time_us": NaN, "x": ', 1))
    with pytest.raises(OpscopeError, match=r"finite number - at `\$.total_time_us`"):
        read_run(run)


@pytest.mark.parametrize("file", ["meta.json", "summary.json"])
def test_a_file_of_a_newer_format_is_refused(runs, tmp_path, file):
    run = _copy(runs[0], tmp_path)
    _edit(run / file, lambda d: d.update(format_version=schema.FORMAT_VERSION + 1))
    assert_clean_error(run_cli("report", str(run)), file, "newer opscope", "upgrade")


def test_keys_a_reader_does_not_know_are_accepted(runs, tmp_path):
    run = _copy(runs[0], tmp_path)
    _edit(run / "summary.json", lambda d: d.update(a_key_from_a_newer_opscope={"anything": [1, "x"]}))
    _edit(run / "meta.json", lambda d: d["device"].update(memory_gb=80))
    assert read_run(run).summary["a_key_from_a_newer_opscope"] == {"anything": [1, "x"]}


def test_swap_results_that_do_not_follow_the_format_are_left_out(tmp_path):
    good = {"label": "rms_norm", "status": "passed", "kernels": ["rms_norm"], "op_level": [],
            "end_to_end": {"speedup": 1.2, "original": {"median_ms": 2.0}}}
    bad = [{"label": "x", "status": "maybe"}, {"label": 3, "status": "passed"},
           {"label": "y", "status": "passed", "end_to_end": {"speedup": "fast"}}]
    (tmp_path / "swap.json").write_text(json.dumps({"format_version": 1, "results": [good, *bad]}))
    assert read_swap(tmp_path / "swap.json")["results"] == [good]


def test_the_published_schema_and_columns_are_the_modules(tmp_path):
    """docs/generated is written by `python -m opscope.run.schema docs/generated` (make docs): a change to
    the format that is not regenerated fails here."""
    written = schema.write_docs(str(tmp_path))
    for path in map(Path, written):
        committed = REPO / "docs" / "generated" / path.name
        assert committed.read_text() == path.read_text(), f"{committed} is stale: run make docs"
    doc = json.loads((tmp_path / "run-format.schema.json").read_text())
    assert set(doc["properties"]) == {"meta.json", "summary.json", "findings.json", "swap.json", "timeline.json", "whatif.json"}
    assert doc["$defs"]["Finding"]["required"] == ["rule", "severity", "message", "suggestion"]


@pytest.mark.parametrize(("change", "where"), [
    (lambda d: d.update(step_time_us=-5.0), "$.step_time_us"),
    (lambda d: d.update(step_time_us_p50=-1.0), "$.step_time_us_p50"),
    (lambda d: d.update(steps=2 ** 80), "$.steps"),
    (lambda d: d.update(step_time_cv=1e300), "$.step_time_cv"),
    (lambda d: d.update(total_time_us=-1.0), "$.total_time_us"),
])
def test_compare_refuses_edited_runs_in_one_line(runs, tmp_path, change, where):
    """issue 23, item 12: compare (and report) validate both runs against the format before using them."""
    run = _copy(runs[0], tmp_path)
    _edit(run / "summary.json", change)
    assert_clean_error(run_cli("compare", str(runs[0]), str(run)), "summary.json", where)
    assert_clean_error(run_cli("compare", str(run), str(runs[0])), "summary.json", where)


def test_a_half_written_ops_csv_is_refused(runs, tmp_path):
    run = _copy(runs[0], tmp_path)
    text = (run / "ops.csv").read_text()
    (run / "ops.csv").write_text(text[: len(text) // 2])  # cut inside a row
    assert_clean_error(run_cli("compare", str(runs[0]), str(run)), "ops.csv")
