"""How many torch threads a CPU profile runs on, and ceilings for a thread count never calibrated while
the machine is busy. Torch-free (the caller passes torch's numbers).

Oversubscription: torch's default is one intra-op thread per core. When other processes already keep
cores busy, those threads wait for each other at every parallel op's barrier: a tiny Llama's step read
835 ms on a loaded 2-core machine against 42 ms on 1 thread. So before the timed steps the profile
measures the cores other processes use (opscope.machine.noise) and, unless --threads is given, runs on
as many threads as fit beside them (idle_threads).

A calibration measured under load is unstable and never cached; re-measuring for a new thread count on a
busy machine would give ceilings as noisy as the run. scaled_calibration() reuses the cached quiet
calibration of another thread count instead: GEMM FLOP/s scaled in proportion to the threads (each
thread runs its share of a GEMM), the memory bandwidth kept (fewer threads reach at most as much: a % of
peak can read low, never high), and the run says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from opscope.machine.calibrate import CalibrationResult, cache_dir, read_cache_file
from opscope.machine.noise import NOISY_SHARE, OVERSUBSCRIBED_MIN_CORES
from opscope.machine.peaks import Peaks


def idle_threads(others: float | None, cores: int, default: int) -> int:
    """The torch thread count for a profile: `default` when other processes' use is unknown or under
    OVERSUBSCRIBED_MIN_CORES (the tick error and ordinary daemons), else the most threads t <= default
    with t + others <= cores, at least 1 (the noise verdict's oversubscription rule, kept)."""
    if others is None or others < OVERSUBSCRIBED_MIN_CORES or cores < 1:
        return max(default, 1)
    fit = math.floor(cores - others + 1e-9)
    return max(1, min(default, fit))


def busy(others: float | None, cores: int, threads: int) -> bool:
    """Whether a calibration measured now would be unstable (opscope.machine.noise.assess's rule)."""
    if others is None or cores < 1:
        return False
    return others / cores >= NOISY_SHARE or (threads + others > cores and others >= OVERSUBSCRIBED_MIN_CORES)


@dataclass(frozen=True)
class Scaled:
    """Ceilings for `threads` from the cached calibration measured on `result.threads`."""

    peaks: Peaks
    result: CalibrationResult
    threads: int
    path: Path


def scaled_calibration(threads: int, cpu_model: str, torch_version: str) -> Scaled | None:
    """The cached stable calibration of this CPU and torch version on the thread count nearest to
    `threads` (more threads preferred on a tie), scaled to `threads` (module docstring); None when the
    cache holds none."""
    best: tuple[CalibrationResult, Path] | None = None
    try:
        paths = sorted(cache_dir().glob("cpu-calibration-*.json"))
    except OSError:
        return None
    for path in paths:
        result, _why = read_cache_file(path, cpu_model, None, torch_version)
        if result is None or not result.stable or result.threads < 1:
            continue
        key = (abs(result.threads - threads), -result.threads)
        if best is None or key < (abs(best[0].threads - threads), -best[0].threads):
            best = (result, path)
    if best is None:
        return None
    result, path = best
    peaks = result.peaks()
    factor = threads / result.threads
    flops = {k: v * factor for k, v in peaks.flops_gflops.items()}
    return Scaled(Peaks(peaks.memory_bandwidth_gbps, flops, dict(peaks.origin)), result, threads, path)
