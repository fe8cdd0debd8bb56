"""Merging a multi-process job: `opscope analyze FOLDER` over a synthetic 8-rank folder, and whether it
finds the slowed rank.

Each rank's trace is a copy of a shared trace with its times shifted (rank r starts r x 1.7 ms later)
and its own distributedInfo (rank, world size); one rank (3 by default) is slowed: every event's start
(relative to the trace's first) and duration x 1.25, so its kernels and CPU ops take 25 % longer. The
merge runs in a fresh process (`python -m opscope analyze FOLDER`), so its wall time and peak RSS are
the whole process's: imports, each rank's full analysis (read, ops table, costs, findings, its run
directory), the merge and the merged run directory. "runs" merges the result's ranks/ again: run
directories that carry their rank numbers, as `opscope profile --nproc-per-node` merges them (each rank
analyzed itself, in parallel): read, merge, copy, write.

    python benchmarks/merge_ranks.py [--ranks 8] [--slowed 3] [--factor 1.25] [--large]

--large adds a folder of 8 copies of a ~132k-event trace (benchmarks/analyze_scaling.py builds it).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests" / "fixtures" / "traces" / "h100_vit-image-classifier_bf16.json.gz"
SHIFT_US = 1700.0


def synthetic_ranks(source: Path, folder: Path, ranks: int = 8, slowed: int = 3, factor: float = 1.25) -> list[Path]:
    """Writes rank<r>.json.gz for r in range(ranks): copies of `source` with shifted times, the slowed
    rank stretched by `factor`. Returns the files."""
    doc = json.loads(gzip.decompress(source.read_bytes()))
    events = doc.pop("traceEvents")
    t0 = min(e["ts"] for e in events if isinstance(e.get("ts"), (int, float)))
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in range(ranks):
        stretch = factor if r == slowed else 1.0
        out = []
        for e in events:
            e2 = dict(e)
            if isinstance(e.get("ts"), (int, float)):
                e2["ts"] = t0 + (e["ts"] - t0) * stretch + r * SHIFT_US
            if isinstance(e.get("dur"), (int, float)):
                e2["dur"] = e["dur"] * stretch
            out.append(e2)
        info = {"backend": "nccl", "rank": r, "world_size": ranks}
        path = folder / f"rank{r}.json.gz"
        with gzip.open(path, "wt", compresslevel=6) as f:
            json.dump({**doc, "distributedInfo": info, "traceEvents": out}, f)
        paths.append(path)
    return paths


def merge_in_fresh_process(folder: Path, out: Path) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MiB, stderr) of `opscope analyze FOLDER --out OUT` in a fresh process."""
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec, so a child forked from this (large) process
    # would report this process's memory.
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c",
                           "import sys; from opscope.cli.app import main; sys.argv[0]='opscope';"
                           "\ntry:\n    main()\nfinally:\n"
                           "    import resource\n"
                           "    try:\n        hwm = next(int(ln.split()[1]) for ln in open('/proc/self/status') "
                           "if ln.startswith('VmHWM'))\n"
                           "    except OSError:\n        hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
                           "    print('maxrss', hwm, file=sys.stderr)",
                           "analyze", str(folder), "--out", str(out), "--json"],
                          capture_output=True, text=True, env={**os.environ, "COLUMNS": "120"})
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    rss_kib = int(next(ln.split()[1] for ln in proc.stderr.splitlines() if ln.startswith("maxrss")))
    return wall, rss_kib / 1024, proc.stderr


def measure(label: str, source: Path, args: argparse.Namespace, tmp: Path) -> None:
    folder = tmp / label.replace(" ", "_")
    paths = synthetic_ranks(source, folder, args.ranks, args.slowed, args.factor)
    size = sum(p.stat().st_size for p in paths) / len(paths)
    raw = gzip.decompress(paths[0].read_bytes())
    events = raw.count(b'"ph"')
    del raw
    out = tmp / f"{folder.name}-run"
    wall, rss, _ = merge_in_fresh_process(folder, out)
    summary = json.loads((out / "summary.json").read_text())["distributed"]
    with open(out / "ranks.csv") as f:
        marked = [int(float(r["rank"])) for r in csv.DictReader(f) if float(r["straggler"]) == 1]
    found = summary["straggler_rank"]
    # The ranks' run directories again (what `profile`'s launcher merges: each rank analyzed itself)
    wall_runs, rss_runs, _ = merge_in_fresh_process(out / "ranks", tmp / f"{folder.name}-again")
    print(f"{label:<24} {args.ranks:>5} {events:>9,} {size / 2**10:>9,.0f} {wall:>7.2f} {rss:>9.0f} "
          f"{wall_runs:>10.2f} {rss_runs:>9.0f} {found:>9} {summary['straggler_excess_share'] * 100:>7.1f}% "
          f"{'yes' if found == args.slowed and marked == [args.slowed] else 'NO':>6}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--slowed", type=int, default=3)
    ap.add_argument("--factor", type=float, default=1.25)
    ap.add_argument("--large", action="store_true")
    args = ap.parse_args()
    cases = [("shared H100 ViT trace", SOURCE)]
    if args.large:
        large = ROOT / "benchmarks" / "out" / "synthetic_132k.json.gz"
        if not large.exists():
            sys.path.insert(0, str(ROOT / "benchmarks"))
            from analyze_scaling import replicate

            large.parent.mkdir(parents=True, exist_ok=True)
            replicate(32_000, large)
        cases.append(("synthetic ~132k events", large))
    print(f"slowed rank {args.slowed}, x{args.factor}\n")
    print(f"{'per-rank trace':<24} {'ranks':>5} {'events':>9} {'KiB/rank':>9} {'wall s':>7} {'peak MiB':>9} "
          f"{'runs: s':>10} {'peak MiB':>9} {'straggler':>9} {'excess':>8} {'found':>6}")
    with tempfile.TemporaryDirectory(prefix="opscope-merge-bench-") as tmp:
        for label, source in cases:
            measure(label, source, args, Path(tmp))


if __name__ == "__main__":
    main()
