"""Was the machine busy while opscope measured? Other processes' CPU use from /proc/stat (torch-free).

Linux counts, per CPU, the time spent in each state in /proc/stat (in USER_HZ ticks). Over a window,
busy time (user + nice + system + irq + softirq + steal) summed over the CPUs this process may run on,
minus this process's own CPU time (all its threads), is what everything else used: other processes,
kernel threads, and a hypervisor that took the vCPU away (steal). Divided by (cores x wall time) it is
`other_cpu_share`, the fraction of the machine's capacity others took while we measured.

The kernel samples those counters at its tick (250 Hz here) and prints them in 10 ms units, each field
truncated, so one reading is off by a few ticks: about +-0.03 core-seconds. A window of MIN_WINDOW_S
keeps that under 0.03 of 2 cores. Where /proc/stat does not exist (macOS, Windows) nothing is guessed:
the share is None and the verdict "unknown".
"""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from opscope.units import number

PROC_STAT = "/proc/stat"
# /proc/stat columns after the name: user nice system idle iowait irq softirq steal guest guest_nice.
# guest time is already inside user; idle and iowait are not busy.
_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)

# Above this share of the cores used by other processes, a measurement is "noisy" (and a calibration
# unstable). Measured with opscope itself on the project's 2-core VM (AMD EPYC, torch 2.13), in moments
# when an independent per-process count showed the rest of the machine under 5 % busy: idle, profile
# 0.001-0.019 (4 runs, 1 and 2 threads), calibrate 0.004-0.025 (4 runs; 0.043 in one with 0.040 of
# background load, read as it was); one busy-loop process: 0.51 (1 thread), 0.33-0.39 (2 threads: it
# gets 2/3 of a core); one per core: 0.70-0.72 (1 thread), 0.62 (2 threads). 0.10 sits 4x above the
# idle readings and 3x below a single competing process here; from about 10 cores a lone busy loop
# reads under it and is caught by the oversubscription rule below instead.
NOISY_SHARE = 0.10
# threads + other processes' cores above the core count is oversubscription once the others use at least
# this many cores (below it, the tick error and ordinary daemons would trip it on every run).
OVERSUBSCRIBED_MIN_CORES = 0.25
MIN_WINDOW_S = 0.5


def affinity_cpus() -> list[int]:
    """The CPUs this process may run on (all of them where affinity is not supported)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def read_proc_stat() -> str | None:
    try:
        with open(PROC_STAT) as f:
            return f.read()
    except OSError:
        return None


def busy_ticks(text: str, cpus: Iterable[int]) -> int | None:
    """Busy ticks summed over `cpus` from /proc/stat text. When `cpus` are all the CPUs listed, the
    aggregate "cpu" line is used (the kernel sums before truncating to ticks: one rounding per column
    instead of one per CPU); else the per-CPU "cpuN" lines. None if the text has none of them."""
    wanted = set(cpus)
    per_cpu: dict[int, int] = {}
    total: int | None = None
    for line in text.splitlines():
        if not line.startswith("cpu"):
            continue
        name, *fields = line.split()
        try:
            values = [int(v) for v in fields]
        except ValueError:
            continue
        busy = sum(values[i] for i in _BUSY_COLUMNS if i < len(values))
        if name == "cpu":
            total = busy
        elif name[3:].isdigit():
            per_cpu[int(name[3:])] = busy
    if total is not None and per_cpu and wanted >= set(per_cpu):
        return total
    if not wanted & set(per_cpu):
        return None
    return sum(per_cpu[c] for c in wanted if c in per_cpu)


def ticks_per_second() -> float:
    try:
        return float(os.sysconf("SC_CLK_TCK"))
    except (AttributeError, ValueError, OSError):
        return 100.0


@dataclass(frozen=True)
class CpuSample:
    wall_s: float  # time.perf_counter()
    busy_s: float | None  # busy CPU-seconds over the sampled CPUs since boot (None: /proc/stat unreadable)
    own_cpu_s: float  # this process's CPU time, all threads


class CpuSampler:
    """Takes CpuSamples. Every source is injectable so tests can replay recorded /proc/stat snapshots."""

    def __init__(self, read_stat: Callable[[], str | None] = read_proc_stat,
                 clock: Callable[[], float] = time.perf_counter,
                 own_cpu: Callable[[], float] = time.process_time,
                 cpus: Iterable[int] | None = None, ticks_per_s: float | None = None) -> None:
        self.read_stat, self.clock, self.own_cpu = read_stat, clock, own_cpu
        self.cpus = list(cpus) if cpus is not None else affinity_cpus()
        self.ticks_per_s = ticks_per_s or ticks_per_second()

    @property
    def cores(self) -> int:
        return len(self.cpus)

    def sample(self) -> CpuSample:
        text = self.read_stat()
        ticks = busy_ticks(text, self.cpus) if text is not None else None
        return CpuSample(wall_s=self.clock(), busy_s=None if ticks is None else ticks / self.ticks_per_s,
                         own_cpu_s=self.own_cpu())


def other_cores(start: CpuSample, end: CpuSample) -> float | None:
    """Cores' worth of CPU that others used between two samples (>= 0; the tick rounding can make the
    raw difference slightly negative), or None when unknown."""
    wall = end.wall_s - start.wall_s
    if start.busy_s is None or end.busy_s is None or wall <= 0:
        return None
    others = (end.busy_s - start.busy_s) - (end.own_cpu_s - start.own_cpu_s)
    return max(others / wall, 0.0)


def assess(others: float | None, cores: int, threads: int, window_s: float,
           during: str = "during the timed steps") -> dict[str, Any]:
    """The noise verdict for a window in which others used `others` cores of `cores` while this process
    ran `threads` compute threads: {"other_cpu_share", "verdict", "reason", "cores", "threads",
    "oversubscribed", "window_s"}. Noisy when the share reaches NOISY_SHARE, or when threads plus the
    others' cores exceed the core count (oversubscription) with the others above
    OVERSUBSCRIBED_MIN_CORES."""
    base = {"cores": int(cores), "threads": int(threads), "window_s": round(float(window_s), 3)}
    if others is None or cores < 1:
        return {"other_cpu_share": None, "verdict": "unknown", "oversubscribed": None,
                "reason": f"{PROC_STAT} is not readable here: other processes' CPU use is unknown", **base}
    share = min(others / cores, 1.0)
    oversubscribed = threads + others > cores and others >= OVERSUBSCRIBED_MIN_CORES
    noisy = share >= NOISY_SHARE or oversubscribed
    reason = f"other processes used {others:.2f} of {cores} cores {during}"
    if oversubscribed:
        reason += (f" (oversubscribed: {threads} torch thread{'s' if threads != 1 else ''} + {others:.2f} busy "
                   f"cores > {cores} cores)")
    return {"other_cpu_share": round(share, 4), "verdict": "noisy" if noisy else "quiet",
            "oversubscribed": oversubscribed, "reason": reason, **base}


def window_noise(sampler: CpuSampler, before: CpuSample, after: CpuSample, threads: int,
                 during: str = "during the timed steps",
                 sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """assess() for what ran between `before` and `after`. A window shorter than MIN_WINDOW_S is widened
    to MIN_WINDOW_S (the tick counts could not resolve a 10 % share in less): through what ran since
    `after` (profile's source-line pass), then an idle wait for the rest; the reason says so."""
    measured = after.wall_s - before.wall_s
    end = after
    if measured < MIN_WINDOW_S:
        end = sampler.sample()
        if end.wall_s - before.wall_s < MIN_WINDOW_S:
            sleep(before.wall_s + MIN_WINDOW_S - end.wall_s)
            end = sampler.sample()
    window = end.wall_s - before.wall_s
    if end is not after:
        during += f" ({measured:.2f} s) and the {window - measured:.2f} s after"
    return assess(other_cores(before, end), sampler.cores, threads, window, during=during)


def unknown(reason: str) -> dict[str, Any]:
    """The noise entry when nothing about other processes is known (a trace recorded elsewhere)."""
    return {"other_cpu_share": None, "verdict": "unknown", "reason": reason}


def remedy(noise: dict[str, Any]) -> str:
    """What to do about a noisy measurement: fewer threads than cores, more steps, an idle machine."""
    cores, share = number(noise.get("cores")), number(noise.get("other_cpu_share"))
    if cores is None or share is None or not (1 <= cores <= 1 << 20 and 0 <= share <= 1):
        return "rerun on an idle machine, with fewer --threads than cores, or with more --steps"
    free = max(int(cores) - math.ceil(share * cores - 1e-9), 1)
    return f"rerun on an idle machine, with --threads {free}, or with more --steps"


def noise_caveat(noise: dict[str, Any] | None) -> str:
    """One sentence to append to a finding that rests on achieved rates, on a noisy run; else ""."""
    if not noise or noise.get("verdict") != "noisy":
        return ""
    return (f" Measured on a noisy run: {noise.get('reason')}; rates may read low and times high, so "
            "confirm on an idle machine.")


def step_spread(step_us: list[float]) -> dict[str, float | None]:
    """{"step_time_us_p50", "step_time_us_max", "step_time_cv"} of per-step wall times; cv is the
    sample standard deviation over the mean (None with fewer than 2 steps)."""
    values = sorted(float(v) for v in step_us if v == v)
    if not values:
        return {"step_time_us_p50": None, "step_time_us_max": None, "step_time_cv": None}
    n = len(values)
    p50 = values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2
    cv = None
    mean = sum(values) / n
    if n >= 2 and mean > 0:
        var = sum((v - mean) ** 2 for v in values) / (n - 1)
        cv = math.sqrt(var) / mean
    return {"step_time_us_p50": p50, "step_time_us_max": values[-1], "step_time_cv": cv}


@contextlib.contextmanager
def busy_loops(n: int) -> Iterator[None]:
    """n processes spinning in a Python busy loop, all running before this yields: the competing load
    the noise tests and the calibration benchmark measure under."""
    procs = [subprocess.Popen([sys.executable, "-c", "print('spinning', flush=True)\nwhile True: pass"],
                              stdout=subprocess.PIPE, text=True) for _ in range(n)]
    try:
        for p in procs:
            assert p.stdout is not None  # stdout=PIPE
            p.stdout.readline()
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
