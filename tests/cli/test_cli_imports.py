"""`opscope analyze TRACE` (the whole command: decode, analysis, run directory, console report) imports
neither pandas nor numpy: importing them costs more than analyzing a trace of a few thousand events.
The commands that read runs back (report, report --html, --tree, --json, --baseline, compare) import
neither pandas, numpy, torch nor plotly (--html reads plotly.js from the plotly package's files)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import PEAKS, REPO, TRACES

CPU_TRACE = REPO / "tests" / "fixtures" / "distributed" / "ddp_gloo_rank0.json.gz"


def _imported(args: list[str], cwd, expect: str = "Top 15 ops") -> set[str]:  # noqa: ANN001
    """Top-level packages the command imported (python -X importtime), after checking it succeeded and
    printed `expect`."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "opscope", *args], cwd=cwd,
                          env={**os.environ, "COLUMNS": "160"}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert expect in proc.stdout  # the command's output was rendered
    return {line.rsplit("|", 1)[1].strip().split(".")[0] for line in proc.stderr.splitlines()
            if line.startswith("import time:") and "|" in line}


@pytest.mark.parametrize("trace", [TRACES / "h100_bert-small_bf16.json.gz", CPU_TRACE], ids=["gpu", "cpu"])
def test_analyze_imports_neither_pandas_nor_numpy(tmp_path, trace):
    modules = _imported(["analyze", str(trace), "--out", str(tmp_path / "run"), *PEAKS], tmp_path)
    assert "opscope" in modules and "rich" in modules  # what importtime lists is what was imported
    assert not modules & {"pandas", "numpy"}


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("runs")
    for name in ("h100_bert-small_bf16", "mi300x_bert-small_bf16"):
        proc = subprocess.run([sys.executable, "-m", "opscope", "analyze", str(TRACES / f"{name}.json.gz"), "--out",
                               str(folder / name)], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
    return folder / "h100_bert-small_bf16", folder / "mi300x_bert-small_bf16"


@pytest.mark.parametrize(("args", "expect"), [
    (["report", "{a}"], "Findings"),
    (["report", "{a}", "--tree"], "module"),
    (["report", "{a}", "--json"], "top_ops"),
    (["report", "{b}", "--baseline", "{a}"], "Comparison with the baseline"),
    (["report", "{a}", "--html", "-o", "{tmp}/r.html"], "report:"),
    (["compare", "{a}", "{b}"], "op time"),
    (["compare", "{a}", "{b}", "--json"], "step_ratio"),
], ids=["report", "tree", "json", "baseline", "html", "compare", "compare-json"])
def test_reading_runs_imports_no_pandas_numpy_or_torch(tmp_path, two_runs, args, expect):
    a, b = two_runs
    args = [x.format(a=a, b=b, tmp=tmp_path) for x in args]
    modules = _imported(args, tmp_path, expect)
    assert "opscope" in modules
    # plotly.js is read from the plotly package's data file: the Python package is not imported either
    assert not modules & {"pandas", "numpy", "torch", "plotly"}, modules & {"pandas", "numpy", "torch", "plotly"}
