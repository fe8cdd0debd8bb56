"""benchmarks/gpu_check.sh, the prepared GPU check, on a machine without a GPU: it says so in one line,
runs nothing and exits non-zero (the GPU half is run where the device tool lends a GPU)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO

SCRIPT = REPO / "benchmarks" / "gpu_check.sh"


def test_the_script_is_valid_bash() -> None:
    proc = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert os.access(SCRIPT, os.X_OK)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_without_a_gpu_it_says_so_and_exits_non_zero(tmp_path: Path) -> None:
    log = tmp_path / "results" / "gpu.log"
    env = {**os.environ, "PYTHON": sys.executable, "TMPDIR": str(tmp_path)}
    proc = subprocess.run(["bash", str(SCRIPT), str(log)], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and "no CUDA GPU that torch can use" in lines[0] and "nothing was run" in lines[0]
    assert lines[0] in log.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results"]  # no work folder, no build, no run
