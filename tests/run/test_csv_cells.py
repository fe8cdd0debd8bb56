"""CSV injection (issue 23, item 9e): names from a trace that a spreadsheet would run as formulas are
written with a quote in front (OWASP's advice), and opscope reads its own files back unchanged."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import pytest

from conftest import TRACES, run_cli
from opscope.run.cells import FORMULA_STARTS, as_written, spreadsheet_safe
from opscope.run.read import TEXT_COLUMNS, read_ops_csv, read_run
from opscope.run.write import write_csv

BERT = TRACES / "h100_bert-small_bf16.json.gz"
KERNEL_PREFIX = "=HYPERLINK(\"http://x\")"  # every kernel's name starts like this
FRAME = "-2+3"  # one user frame's file


@pytest.mark.parametrize("text", ["=1+1", "+x", "-x", "@SUM(A1)", "\tx", "\rx", "'x", "''=x", "'", "", "plain",
                                  "x=1", "-1.5"])
def test_a_cell_round_trips(text: str) -> None:
    written = spreadsheet_safe(text)
    assert as_written(written) == text
    assert not written.startswith(FORMULA_STARTS)
    assert written == text or written == "'" + text


@pytest.mark.parametrize("cell", ["'x", "'", "''", "'plain text", "'1"])
def test_a_quote_that_escapes_nothing_is_kept(cell: str) -> None:
    """A cell written before the rule (or by hand) that starts with a quote but no formula reads unchanged."""
    assert as_written(cell) == cell
    assert spreadsheet_safe(cell) == cell


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """The BERT trace with every kernel and one user frame named like formulas, analyzed; aten::gelu is
    renamed to what is no op name, so its kernels are op rows named after them."""
    folder = tmp_path_factory.mktemp("cells")
    doc = json.loads(gzip.decompress(BERT.read_bytes()))
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel":
            e["name"] = KERNEL_PREFIX + e["name"]
        elif e.get("cat") == "cpu_op" and e.get("name") == "aten::gelu":
            e["name"] = "@SUM(1+1)"
        elif e.get("cat") == "python_function" and "modeling_bert.py(364)" in e["name"]:
            e["name"] = e["name"].replace("transformers/models/bert/modeling_bert.py", FRAME)
    trace = folder / "formulas.json"
    trace.write_text(json.dumps(doc))
    proc = run_cli("analyze", str(trace), "--out", str(folder / "run"), cwd=folder)
    assert proc.returncode == 0, proc.stderr
    return folder / "run"


def test_no_cell_starts_a_formula_and_names_read_back_unchanged(run_dir: Path) -> None:
    with (run_dir / "ops.csv").open(newline="") as f:
        rows = list(csv.reader(f))
    header = rows[0]
    escaped = set()
    for row in rows[1:]:
        for name, cell in zip(header, row, strict=True):
            if cell.startswith(FORMULA_STARTS):
                float(cell)  # only numbers (-1.5 is no formula)
            elif cell.startswith("'"):
                escaped.add(name)
    assert {"op", "kernels", "source_location"} <= escaped
    ops = read_run(run_dir).ops
    assert any(op.startswith(KERNEL_PREFIX) for op in ops["op"])
    kernels = [cell for cell in ops["kernels"] if cell and not cell.startswith("Memcpy")]  # memcpy: not renamed
    assert kernels and all(cell.startswith(KERNEL_PREFIX) for cell in kernels)
    assert any(loc.startswith(FRAME + ":") for loc in ops["source_location"])
    # written and read again: the same text, not one quote more or less
    write_csv(ops, run_dir.parent / "again.csv")
    again = read_ops_csv(run_dir.parent / "again.csv")
    for name in TEXT_COLUMNS:
        if name in ops:
            assert again[name] == ops[name], name
    with (run_dir.parent / "again.csv").open(newline="") as f:
        rewritten = list(csv.reader(f))
    assert rewritten[0] == header
    for k, name in enumerate(header):  # and written as before: the quote is not doubled
        if name in TEXT_COLUMNS:
            assert [r[k] for r in rewritten[1:]] == [r[k] for r in rows[1:]], name


def test_report_and_compare_show_the_names_as_they_were(run_dir: Path) -> None:
    proc = run_cli("report", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    assert "=HYPERLINK" in proc.stdout and "'=HYPERLINK" not in proc.stdout
    proc = run_cli("compare", str(run_dir), str(run_dir))
    assert proc.returncode == 0, proc.stderr
    assert "'=HYPERLINK" not in proc.stdout
