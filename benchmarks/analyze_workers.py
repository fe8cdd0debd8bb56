"""`opscope analyze FOLDER --workers N`: a 32-rank folder analyzed by one process and by worker processes.

The folder is benchmarks/merge_ranks.py's: copies of the shared H100 ViT trace with shifted times and
their own distributedInfo, rank 3 slowed. Each measurement is a whole fresh process (`python -m opscope
analyze FOLDER --workers N`: imports, the workers' start, every rank's analysis and run directory, the
merge), the worker counts interleaved within each repeat (their order alternating) so that a change in
the machine's load falls on both; medians reported. Every run's files must be byte-identical to the first
one's (tests/golden.py's digest: meta.json without its creation time and target).

    python benchmarks/analyze_workers.py [--ranks 32] [--workers 1 2] [--repeats 5]
    python benchmarks/analyze_workers.py --memory   # one rank's peak memory per JSON byte (Ray's declaration)
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]

from merge_ranks import SOURCE, synthetic_ranks  # noqa: E402

from golden import digest  # noqa: E402

PEAKS = ["--peak-bw", "3350", "--peak-flops", "989000"]


def analyze(folder: Path, out: Path, workers: int) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "opscope", "analyze", str(folder), "--out", str(out),
                           "--workers", str(workers), "--json", *PEAKS], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    return wall


def _spin(n: int) -> float:
    t0 = time.perf_counter()
    x = 0
    for i in range(n):
        x += i * i
    return time.perf_counter() - t0


def machine_parallelism(n: int = 5_000_000) -> float:
    """How many cores' worth of throughput two processes get here now, next to one (2.0 on an idle
    2-core machine; about 1.0 when other sessions keep the cores busy: Linux's autogroup scheduling
    shares the CPUs between sessions, not between processes)."""
    one = _spin(n)
    with multiprocessing.get_context("fork").Pool(2) as pool:
        t0 = time.perf_counter()
        pool.map(_spin, [n, n])
        two = time.perf_counter() - t0
    return 2 * one / two


def timing(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="opscope-workers-bench-") as tmp:
        folder = Path(tmp) / "job"
        synthetic_ranks(SOURCE, folder, args.ranks)
        walls: dict[int, list[float]] = {w: [] for w in args.workers}
        reference = None
        print(f"{args.ranks} ranks of {SOURCE.name}; {len(os.sched_getaffinity(0))} usable cores; "
              f"load average before: {os.getloadavg()[0]:.2f}; two processes get "
              f"{machine_parallelism():.2f}x one's throughput")
        print(f"{'repeat':>6} " + " ".join(f"{f'--workers {w}':>12}" for w in args.workers) + "  ratios (this repeat)")
        for rep in range(args.repeats):
            order = args.workers if rep % 2 == 0 else list(reversed(args.workers))
            for w in order:
                out = Path(tmp) / f"run-{rep}-{w}"
                walls[w].append(analyze(folder, out, w))
                files = digest(out)
                if reference is None:
                    reference = files
                elif files != reference:
                    raise SystemExit(f"--workers {w} (repeat {rep}) wrote different run files")
            ratios = " ".join(f"{walls[args.workers[0]][-1] / walls[w][-1]:.2f}x" for w in args.workers[1:])
            print(f"{rep:>6} " + " ".join(f"{walls[w][-1]:>11.2f}s" for w in args.workers) + f"  {ratios}")
        medians = {w: statistics.median(v) for w, v in walls.items()}
        print(f"{'median':>6} " + " ".join(f"{medians[w]:>11.2f}s" for w in args.workers))
        base = args.workers[0]
        for w in args.workers[1:]:
            print(f"--workers {w} vs --workers {base}: {medians[base] / medians[w]:.2f}x faster (medians)")
        print(f"run files byte-identical across all {args.repeats * len(args.workers)} runs "
              f"({len(reference or {})} files each); load average after: {os.getloadavg()[0]:.2f}; two processes "
              f"get {machine_parallelism():.2f}x one's throughput")


MEMORY_SCRIPT = """
import gzip, sys
from pathlib import Path
def hwm():
    return next(int(ln.split()[1]) for ln in open('/proc/self/status') if ln.startswith('VmHWM')) * 1024
from opscope.analysis.ranks import RankJob, analyze_rank
import opscope.analysis.trace_file  # noqa: F401
base = hwm()
path = Path(sys.argv[1])
analyze_rank(RankJob(0, str(path), 0, 3350.0, ("989000",), None, sys.argv[2]))
print(base, hwm(), len(gzip.decompress(path.read_bytes())))
"""


def memory() -> None:
    """Peak RSS of one rank's analysis (a fresh process; less its RSS after imports) per JSON byte."""
    with tempfile.TemporaryDirectory(prefix="opscope-rank-memory-") as tmp:
        ranks = synthetic_ranks(SOURCE, Path(tmp) / "job", 1)
        large = ROOT / "benchmarks" / "out" / "synthetic_132k.json.gz"
        if not large.exists():
            from analyze_scaling import replicate

            large.parent.mkdir(parents=True, exist_ok=True)
            replicate(32_000, large)
        print(f"{'trace':<28} {'gzip MiB':>9} {'JSON MiB':>9} {'imports MiB':>12} {'peak MiB':>9} {'/JSON byte':>11}")
        for i, path in enumerate([ranks[0], large]):
            proc = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, str(path), str(Path(tmp) / f"run{i}")],
                                  capture_output=True, text=True, check=True)
            base, peak, raw = map(int, proc.stdout.split())
            print(f"{path.name:<28} {path.stat().st_size / 2**20:>9.2f} {raw / 2**20:>9.1f} {base / 2**20:>12.0f} "
                  f"{peak / 2**20:>9.0f} {(peak - base) / raw:>11.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=32)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--memory", action="store_true")
    args = ap.parse_args()
    if args.memory:
        memory()
    else:
        timing(args)


if __name__ == "__main__":
    main()
