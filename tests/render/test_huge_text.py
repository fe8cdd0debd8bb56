"""A huge name costs nothing (issue 23, item 1): a trace's name of megabytes is cut where it enters a
run (opscope.limits.MAX_TEXT_CHARS) and again where it is shown (DISPLAY_TEXT_CHARS), so the run can be
read back and every renderer's output stays small; the terminal's width ($COLUMNS) is clamped."""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from conftest import REPO, run_cli
from opscope.analysis.trace_file import analyze_trace_file
from opscope.limits import DISPLAY_TEXT_CHARS, MAX_TEXT_CHARS, bounded
from opscope.render.console import render_run
from opscope.render.console_report import render_report
from opscope.render.html import render_html
from opscope.run.model import Run

SOURCE = REPO / "tests" / "fixtures" / "cpu_traces" / "avx2_channels_last_after_train.json.gz"
HUGE = 2 << 20  # characters: far over both limits, small enough for a quick test


def huge_name_trace(path: Path) -> Path:
    """SOURCE with its first aten::threshold_backward renamed to a name of HUGE characters."""
    text = gzip.decompress(SOURCE.read_bytes()).decode()
    huge = "aten::" + "n" * HUGE
    text, n = re.subn(r'"name": "aten::threshold_backward"', lambda _m: f'"name": "{huge}"', text, count=1)
    assert n == 1
    path.write_bytes(gzip.compress(text.encode(), compresslevel=1))
    return path


def test_bounded_keeps_both_ends_and_the_length():
    text = "aten::" + "x" * 10_000 + ":123"
    cut = bounded(text, 80)
    assert len(cut) == 80 and cut.startswith("aten::x") and cut.endswith(":123") and "10,010" in cut
    assert bounded("short", 80) == "short"


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def test_a_huge_op_name_is_cut_where_it_enters_and_the_run_reads_back(tmp_path):
    trace = huge_name_trace(tmp_path / "t.json.gz")
    run_dir = tmp_path / "run"
    analyzed = run_cli("analyze", str(trace), "--out", str(run_dir), "--peak-bw", "20", "--peak-flops", "100")
    assert analyzed.returncode == 0, analyzed.stderr
    assert "name over 65,536 characters" in analyzed.stderr  # said once, as a skipped-events line
    assert len(analyzed.stdout) < 50_000
    for name in ("meta.json", "summary.json", "findings.json"):
        assert max(map(len, _strings(json.loads((run_dir / name).read_text())))) <= MAX_TEXT_CHARS
    with open(run_dir / "ops.csv", newline="") as f:
        assert max(len(cell) for row in csv.reader(f) for cell in row) <= MAX_TEXT_CHARS
    for args in ([], ["--html", "-o", str(tmp_path / "r.html")]):
        report = run_cli("report", str(run_dir), *args)
        assert report.returncode == 0, report.stderr  # was: "ops.csv is damaged: field larger than field limit"
        assert len(report.stdout) < 50_000
    assert (tmp_path / "r.html").stat().st_size < 20 << 20


@pytest.fixture(scope="module")
def huge_run(tmp_path_factory) -> Run:
    """A real run whose top op, its finding and its source line carry names of HUGE characters, as a
    run read from an edited (or foreign) directory could: the renderers bound what they show."""
    folder = tmp_path_factory.mktemp("huge")
    run = analyze_trace_file(SOURCE, out=folder / "run", peak_bw=20, peak_flops=["100"])
    ops = {k: list(v) for k, v in run.ops.items()}
    ops["op"][0] = "aten::" + "n" * HUGE
    ops["source_location"][0] = "/" + "d/" * (HUGE // 2) + "model.py:12"
    findings = [{**f, "op": ops["op"][0], "message": "m" * HUGE, "suggestion": "s" * HUGE} for f in run.findings]
    meta = {**run.meta, "target": "t" * HUGE}
    return dataclasses.replace(run, ops=ops, findings=findings, meta=meta)


@pytest.mark.parametrize("render", [render_run, render_report])
def test_the_console_shows_a_bounded_part_of_a_huge_name(huge_run, render):
    out = io.StringIO()
    render(huge_run, Console(file=out, width=120, color_system=None, legacy_windows=False))
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 120
    # the findings' text in full, but each string at most DISPLAY_TEXT_CHARS: a few hundred lines at most
    assert len(text) < 40 * DISPLAY_TEXT_CHARS
    assert "aten::nnnn" in text and "characters]" in text


def test_the_html_report_shows_a_bounded_part_of_a_huge_name(huge_run):
    page = render_html(huge_run)
    assert "aten::nnnn" in page
    assert "n" * (DISPLAY_TEXT_CHARS + 1) not in page and "m" * (DISPLAY_TEXT_CHARS + 1) not in page


@pytest.mark.parametrize("columns", ["0", "1", "999999999"])
def test_the_terminal_width_is_clamped(tmp_path, columns):
    run_dir = tmp_path / "run"
    analyze_trace_file(SOURCE, out=run_dir)
    proc = subprocess.run([sys.executable, "-m", "opscope", "report", str(run_dir)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": columns})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) > 20 and "Top 15 ops" in proc.stdout  # COLUMNS=0 printed nothing at all
    assert max(len(line) for line in lines) <= 1000  # a billion columns rendered for 30 s and 7.8 GB
