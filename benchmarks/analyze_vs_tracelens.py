"""`opscope analyze` next to TraceLens's per-op performance report on the same trace, in one run.

Two jobs, each in a fresh Python process, run in turn `--repeats` times (medians, so that a burst of
load on a shared machine hits both alike): the whole `opscope analyze TRACE` command (read, decode,
analysis, run directory, console report), and TraceLens's `generate_perf_report_pytorch(TRACE,
output_csvs_dir=...)` (its per-op report, written as CSV files). Each reports its whole-process wall
time and peak RSS; ratios are TraceLens / opscope (above 1: opscope is faster or smaller). Issue 28's
goal: at least 10x the speed and at most 0.25x the memory on the real 132k-event owlv2 H100 trace.

TraceLens (AMD-AGI/TraceLens, MIT) is not on PyPI: `pip install git+https://github.com/AMD-AGI/TraceLens`.
Where it is not installed, the script measures opscope alone and says that the comparison is missing.
The owlv2 trace is TraceLens's own test data, not in this repository; without a TRACE argument the
~132k-event synthetic trace of analyze_scaling.py stands in for it.

    python benchmarks/analyze_vs_tracelens.py [TRACE] [--repeats 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from analyze_scaling import OUT, replicate  # noqa: E402


def _job(body: str, *args: str) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of a fresh interpreter running `body` (its argv: `args`)."""
    code = ("import resource, sys\ntry:\n" + textwrap.indent(body, "    ") +
            "\nfinally:\n    print('maxrss', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "120"})
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"job failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    rss_kib = int(next(ln.split()[1] for ln in proc.stderr.splitlines() if ln.startswith("maxrss")))
    return wall, rss_kib / 1024


OPSCOPE = """from opscope.cli.app import main
sys.argv[0] = "opscope"
try:
    main()
except SystemExit as exc:
    if exc.code:
        raise
"""
TRACELENS = """from TraceLens.Reporting.generate_perf_report_pytorch import generate_perf_report_pytorch
generate_perf_report_pytorch(sys.argv[1], output_csvs_dir=sys.argv[2])
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace", nargs="?", type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    trace = args.trace
    if trace is None:
        trace = OUT / "synthetic_132k.json.gz"
        if not trace.exists():
            OUT.mkdir(parents=True, exist_ok=True)
            replicate(32_000, trace)
        print(f"trace: {trace.name} (stands in for the owlv2 H100 trace, not in this repository)")
    have_tracelens = importlib.util.find_spec("TraceLens") is not None
    ours: list[tuple[float, float]] = []
    theirs: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.repeats):
            ours.append(_job(OPSCOPE, "analyze", str(trace), "--out", str(Path(tmp) / f"run{k}"), "--json"))
            if have_tracelens:
                theirs.append(_job(TRACELENS, str(trace), str(Path(tmp) / f"tracelens{k}")))
    wall = statistics.median(w for w, _ in ours)
    rss = statistics.median(r for _, r in ours)
    print(f"opscope analyze (whole process): {wall:.2f} s, {rss:.0f} MiB peak RSS (median of {args.repeats})")
    if not have_tracelens:
        print("TraceLens: not installed here, so not measured (it is not on PyPI: "
              "pip install git+https://github.com/AMD-AGI/TraceLens); no ratio")
        return
    t_wall = statistics.median(w for w, _ in theirs)
    t_rss = statistics.median(r for _, r in theirs)
    print(f"TraceLens per-op report (whole process): {t_wall:.2f} s, {t_rss:.0f} MiB peak RSS")
    print(f"speed: {t_wall / wall:.1f}x TraceLens's (goal: at least 10x); memory: {rss / t_rss:.2f}x its peak "
          "(goal: at most 0.25x)")


if __name__ == "__main__":
    main()
