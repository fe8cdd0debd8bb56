"""The CI gate from Python: save a baseline of runs, gate runs against it (opscope.gating). No torch."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from opscope.api.files import user_path
from opscope.errors import OpscopeError
from opscope.gating.baseline import DEFAULT_DIR, load_baseline, save_baseline
from opscope.gating.samples import read_samples
from opscope.gating.verdict import DEFAULT_CONFIDENCE, DEFAULT_THRESHOLD, GateResult, check_options
from opscope.gating.verdict import gate as gate_samples

PathLike = str | os.PathLike[str]


def _run_paths(runs: Sequence[PathLike] | PathLike) -> list[Path]:
    if isinstance(runs, (str, os.PathLike)):
        runs = [runs]
    paths = [p for p in (user_path(r) for r in runs) if p is not None]
    if not paths:
        raise OpscopeError("no run directories given")
    return paths


def baseline_save(runs: Sequence[PathLike] | PathLike, name: str, *, dir: PathLike = DEFAULT_DIR) -> Path:
    """Saves the samples of the run directories `runs` (per step, per op row, per module; the machine, its
    ceilings and the torch version) as the baseline `name`: DIR/NAME.json, replacing one of that name.
    Returns its path."""
    folder = user_path(dir)
    assert folder is not None
    return save_baseline(read_samples(_run_paths(runs)), name, folder)


def gate(runs: Sequence[PathLike] | PathLike, baseline: str, *, dir: PathLike = DEFAULT_DIR,
         threshold: float = DEFAULT_THRESHOLD, confidence: float = DEFAULT_CONFIDENCE) -> GateResult:
    """The run directories `runs` against the saved baseline `baseline`: step time, op rows and modules
    tested (one-sided Mann-Whitney U at `confidence` past +`threshold`, e.g. 0.10), new op rows named.
    `result.exit_code` is 1 on a regression; bad input (a missing or incompatible baseline, a damaged run)
    is an OpscopeError."""
    check_options(threshold, confidence)
    folder = user_path(dir)
    assert folder is not None
    saved = load_baseline(baseline, folder)
    return gate_samples(saved.samples, read_samples(_run_paths(runs)), baseline_name=saved.name,
                        threshold=threshold, confidence=confidence)
