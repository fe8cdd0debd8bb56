"""The same trace gives the same run directory, byte for byte, whatever Python's string hash seed: no sum
or order may follow a set of strings (swap candidates' time once did, in its last digit)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import TESTS

TRACE = TESTS / "fixtures" / "traces" / "h100_vit-image-classifier_bf16.json.gz"
FILES = ("ops.csv", "summary.json", "findings.json", "modules.csv")


def _analyze(out: Path, seed: str) -> dict[str, bytes]:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    subprocess.run([sys.executable, "-m", "opscope", "analyze", str(TRACE), "--out", str(out)], env=env,
                   check=True, capture_output=True, timeout=300)
    return {name: (out / name).read_bytes() for name in FILES if (out / name).exists()}


def test_run_files_do_not_depend_on_the_hash_seed(tmp_path: Path) -> None:
    first = _analyze(tmp_path / "a", "1")
    second = _analyze(tmp_path / "b", "2")
    assert set(first) == set(FILES)
    for name in FILES:
        assert first[name] == second[name], name
