"""`opscope analyze TRACE` (the whole command: decode, analysis, run directory, console report) imports
neither pandas nor numpy: importing them costs more than analyzing a trace of a few thousand events.
The commands that read runs back (report, compare, HTML), merge ranks or attach Nsight results import
pandas when they need it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import PEAKS, REPO, TRACES

CPU_TRACE = REPO / "tests" / "fixtures" / "distributed" / "ddp_gloo_rank0.json.gz"


def _imported(args: list[str], cwd) -> set[str]:  # noqa: ANN001
    """Top-level packages the command imported (python -X importtime), after checking it succeeded."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "opscope", *args], cwd=cwd,
                          env={**os.environ, "COLUMNS": "160"}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Top 15 ops" in proc.stdout  # the console report was rendered
    return {line.rsplit("|", 1)[1].strip().split(".")[0] for line in proc.stderr.splitlines()
            if line.startswith("import time:") and "|" in line}


@pytest.mark.parametrize("trace", [TRACES / "h100_bert-small_bf16.json.gz", CPU_TRACE], ids=["gpu", "cpu"])
def test_analyze_imports_neither_pandas_nor_numpy(tmp_path, trace):
    modules = _imported(["analyze", str(trace), "--out", str(tmp_path / "run"), *PEAKS], tmp_path)
    assert "opscope" in modules and "rich" in modules  # what importtime lists is what was imported
    assert not modules & {"pandas", "numpy"}
