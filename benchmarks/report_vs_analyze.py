"""The commands that read a run back, next to `opscope analyze` of the same trace, as whole processes.

Issue 22's goal: `opscope report RUN --html` takes no longer than `opscope analyze` of the trace the run
came from (both whole processes: interpreter start, imports, work, output). For each trace the script
analyzes it once into a run directory, then times fresh processes of, in turn, `--repeats` times:

- analyze:      `opscope analyze TRACE --out DIR` (console report discarded);
- report:       `opscope report RUN` (console);
- report_html:  `opscope report RUN --html -o FILE`;
- compare:      `opscope compare RUN RUN2` (RUN2: a second analysis of the same trace).

opscope's modules are byte-compiled first, as `pip install` leaves them. Reported: the median wall time of
each command and its peak RSS (from wait4), and each reader's time as a ratio of analyze's (below 1: the
reader is faster).

    python benchmarks/report_vs_analyze.py [--repeats 5] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACES = [*sorted((ROOT / "tests" / "fixtures" / "traces").glob("*.json.gz")),
          *sorted((ROOT / "tests" / "fixtures" / "h200").glob("*.json.gz"))]
COMMANDS = ("analyze", "report", "report_html", "compare")


def _timed(args: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one `python -m opscope ARGS` process."""
    env = {**os.environ, "COLUMNS": "120"}
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "opscope", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"opscope {' '.join(args)} failed: {proc.stderr.read().decode()[-500:]}")
    return wall, usage.ru_maxrss / 1024


def bench(trace: Path, repeats: int, work: Path) -> dict[str, tuple[float, float]]:
    run, run2 = work / "run", work / "run2"
    _timed(["analyze", str(trace), "--out", str(run)])
    _timed(["analyze", str(trace), "--out", str(run2)])
    samples: dict[str, list[tuple[float, float]]] = {c: [] for c in COMMANDS}
    for i in range(repeats):
        out = work / f"a{i}"
        samples["analyze"].append(_timed(["analyze", str(trace), "--out", str(out)]))
        samples["report"].append(_timed(["report", str(run)]))
        samples["report_html"].append(_timed(["report", str(run), "--html", "-o", str(work / f"r{i}.html")]))
        samples["compare"].append(_timed(["compare", str(run), str(run2)]))
    return {c: (statistics.median(s[0] for s in v), max(s[1] for s in v)) for c, v in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", nargs="*", default=None, help="trace names (without .json.gz)")
    args = parser.parse_args()
    compileall.compile_dir(str(ROOT / "opscope"), quiet=1)
    traces = [t for t in TRACES if args.only is None or t.name.removesuffix(".json.gz") in args.only]
    print(f"{'trace':36} {'analyze':>9} {'report':>9} {'--html':>9} {'compare':>9}   "
          f"{'report':>7} {'--html':>7} {'compare':>7}  (ratio to analyze)")
    worst = 0.0
    for trace in traces:
        with tempfile.TemporaryDirectory() as tmp:
            r = bench(trace, args.repeats, Path(tmp))
        a = r["analyze"][0]
        ratios = [r[c][0] / a for c in COMMANDS[1:]]
        worst = max(worst, ratios[1])
        print(f"{trace.name.removesuffix('.json.gz'):36} " + " ".join(f"{r[c][0]:8.2f}s" for c in COMMANDS)
              + "   " + " ".join(f"{x:6.2f}x" for x in ratios))
        print(f"{'  peak RSS MiB':36} " + " ".join(f"{r[c][1]:8.0f} " for c in COMMANDS))
    print(f"report --html / analyze, worst trace: {worst:.2f}x ({'met' if worst <= 1.0 else 'NOT met'}: <= 1)")


if __name__ == "__main__":
    main()
