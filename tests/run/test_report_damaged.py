"""`opscope report` reads run directories back: a damaged one is one clean line (exit 2), whatever is
wrong with it; a fuzz test corrupts a real run's files at random."""

from __future__ import annotations

import csv
import io
import json
import random
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from conftest import TRACES, assert_clean_error, run_cli
from opscope.analysis.trace_file import analyze_trace_file
from opscope.errors import OpscopeError
from opscope.render.console import render_run
from opscope.run.read import read_run


@pytest.fixture(scope="module")
def good_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report") / "run"
    analyze_trace_file(TRACES / "h100_bert-small_bf16.json.gz", out=out, peak_bw=3350.0, peak_flops=["989000"])
    return out


def _copy(good_run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(good_run, dst)
    return dst


def _edit_json(path: Path, edit) -> None:
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


DAMAGE = {
    "meta not an object": lambda r: (r / "meta.json").write_text("[1, 2]"),
    "summary truncated": lambda r: (r / "summary.json").write_text((r / "summary.json").read_text()[:40]),
    "summary steps a string": lambda r: _edit_json(r / "summary.json", lambda d: d.update(steps="five")),
    "findings entry a number": lambda r: (r / "findings.json").write_text("[3]"),
    "finding without a message": lambda r: _edit_json(r / "findings.json", lambda d: d[0].pop("message")),
    "ops.csv binary": lambda r: (r / "ops.csv").write_bytes(b"\x00\xff\xfe" * 100),
    "ops.csv without columns": lambda r: (r / "ops.csv").write_text("a,b\n1,2\n"),
    "ops.csv calls not numbers": lambda r: (r / "ops.csv").write_text(_bad_calls(r)),
    "ops.csv empty": lambda r: (r / "ops.csv").write_text(""),
    "peaks a string": lambda r: _edit_json(r / "meta.json", lambda d: d.update(peaks="fast")),
    "summary.json a directory": lambda r: ((r / "summary.json").unlink(), (r / "summary.json").mkdir()),
}


def _bad_calls(run_dir: Path) -> str:
    """ops.csv with the first row's `calls` replaced by a word."""
    header, first = (run_dir / "ops.csv").read_text().splitlines()[:2]
    row = next(csv.reader([first]))
    row[header.split(",").index("calls")] = "many"
    out = io.StringIO()
    csv.writer(out).writerow(row)
    return header + "\n" + out.getvalue()


@pytest.mark.parametrize("case", list(DAMAGE))
def test_damaged_run_directories_give_one_line(good_run, tmp_path, case):
    run_dir = _copy(good_run, tmp_path)
    DAMAGE[case](run_dir)
    proc = run_cli("report", str(run_dir))
    assert_clean_error(proc, "run")


def test_report_of_a_file_is_one_line(tmp_path):
    f = tmp_path / "x"
    f.write_text("hi")
    assert_clean_error(run_cli("report", str(f)), "not a directory")


_VALUES = [None, "x", -1, 1e308, [], {}, True, "NaN", 2**80]


@pytest.mark.slow
def test_fuzzed_run_directories_never_give_a_traceback(good_run, tmp_path):
    outcomes = {"ok": 0, "error": 0}
    for seed in range(150):
        rng = random.Random(seed)
        run_dir = tmp_path / f"r{seed}"
        shutil.copytree(good_run, run_dir)
        name = rng.choice(["meta.json", "summary.json", "findings.json", "ops.csv"])
        path = run_dir / name
        data = path.read_bytes()
        kind = rng.choice(["truncate", "flip", "retype"])
        if kind == "truncate":
            path.write_bytes(data[: rng.randrange(len(data) + 1)])
        elif kind == "flip":
            buf = bytearray(data)
            for _ in range(rng.randint(1, 10)):
                buf[rng.randrange(len(buf))] = rng.randrange(256)
            path.write_bytes(bytes(buf))
        elif name.endswith(".json"):
            doc = json.loads(data)
            target = doc[0] if isinstance(doc, list) and doc else doc
            if isinstance(target, dict) and target:
                key = rng.choice(list(target))
                target[key] = rng.choice(_VALUES)
            path.write_text(json.dumps(doc))
        else:
            lines = data.decode().splitlines()
            cells = lines[1].split(",")
            cells[rng.randrange(len(cells))] = str(rng.choice(_VALUES))
            lines[1] = ",".join(cells)
            path.write_text("\n".join(lines) + "\n")
        try:
            run = read_run(run_dir)
            render_run(run, Console(file=io.StringIO(), width=140))
            outcomes["ok"] += 1
        except OpscopeError as exc:
            assert "\n" not in str(exc)
            outcomes["error"] += 1
        except Exception as exc:  # noqa: BLE001
            pytest.fail(f"seed {seed} ({name}, {kind}): {type(exc).__name__}: {exc}")
    assert outcomes["ok"] > 10 and outcomes["error"] > 10, outcomes


def _without_rows(good_run: Path, dst: Path) -> Path:
    """A copy of the run whose ops.csv is its header only (a run with zero op rows), summary to match."""
    shutil.copytree(good_run, dst)
    (dst / "report.html").unlink(missing_ok=True)
    header = (dst / "ops.csv").read_text().splitlines()[0]
    (dst / "ops.csv").write_text(header + "\n")
    _edit_json(dst / "summary.json", lambda d: d.update(top_ops=[], total_time_us=0.0, swap_candidates=[]))
    return dst


def test_every_reader_takes_a_run_with_zero_op_rows(good_run, tmp_path):
    """report, --html, --tree, --json, --baseline and compare, either side: no traceback (issue 23, item 4)."""
    empty = _without_rows(good_run, tmp_path / "empty")
    other = _copy(good_run, tmp_path)
    for args in (["report", str(empty)], ["report", str(empty), "--html"], ["report", str(empty), "--tree"],
                 ["report", str(empty), "--json"], ["report", str(empty), "--baseline", str(other)],
                 ["report", str(other), "--html", "-o", str(tmp_path / "b.html"), "--baseline", str(empty)],
                 ["compare", str(empty), str(other)], ["compare", str(other), str(empty)],
                 ["compare", str(empty), str(empty), "--json"]):
        proc = run_cli(*args)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (args, proc.stderr)
    assert (empty / "report.html").stat().st_size > 0 and (tmp_path / "b.html").stat().st_size > 0
