"""`opscope analyze` next to Holistic Trace Analysis (HTA, `pip install holistictraceanalysis`; a
benchmark-only dependency) on the same traces, in one run.

Three jobs per trace, each in a fresh Python process, run in turn `--repeats` times (medians reported, so
a burst of load on a shared machine hits every job alike):

- opscope: `analyze_trace_file` (read, decode, call tree, kernel attribution, cost model, roofline,
  findings, run directory written);
- opscope CLI: the whole `opscope analyze TRACE --out DIR` command, console report included (its output
  is discarded), as a user runs it;
- HTA load: `TraceAnalysis(trace_dir=...)` (what HTA does before any analysis);
- HTA load + kernel breakdown: the same and `get_gpu_kernel_breakdown()`.

opscope's modules are byte-compiled first, as `pip install` leaves them (HTA's are). Each job reports its
work time (wall, after its imports), its whole-process wall time (interpreter start and imports included)
and its peak RSS. Ratios are HTA / opscope: above 1 means opscope is faster or
smaller. Traces: the shared real traces and the synthetic ~132k-event trace of analyze_scaling.py.

    python benchmarks/analyze_vs_hta.py [--repeats 3] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from analyze_scaling import OUT, replicate  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "tests" / "fixtures" / "traces"

# Each job prints one JSON line: import and work seconds, peak RSS in MiB.
_JOB = """
import json, logging, resource, sys, tempfile, time
from pathlib import Path
t0 = time.perf_counter()
{imports}
t1 = time.perf_counter()
logging.disable(logging.CRITICAL)
{work}
t2 = time.perf_counter()
print(json.dumps({{"import_s": t1 - t0, "work_s": t2 - t1,
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""
_HTA_IMPORT = "from hta.trace_analysis import TraceAnalysis"
_HTA_LOAD = "analysis = TraceAnalysis(trace_dir=sys.argv[1])"
JOBS = {
    "opscope": _JOB.format(
        imports="from opscope.analysis.trace_file import analyze_trace_file",
        work="with tempfile.TemporaryDirectory() as d:\n    analyze_trace_file(Path(sys.argv[1]), out=Path(d) / 'run')"),
    "opscope_cli": _JOB.format(
        imports="import contextlib, io\nfrom opscope.cli.app import main",
        work="with tempfile.TemporaryDirectory() as d:\n"
             "    sys.argv = ['opscope', 'analyze', sys.argv[1], '--out', str(Path(d) / 'run')]\n"
             "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
             "        try:\n            main()\n        except SystemExit as exc:\n"
             "            if exc.code:\n                raise"),
    "hta_load": _JOB.format(imports=_HTA_IMPORT, work=_HTA_LOAD),
    "hta_breakdown": _JOB.format(imports=_HTA_IMPORT,
                                 work=_HTA_LOAD + "\nanalysis.get_gpu_kernel_breakdown(visualize=False)"),
}


def _job_env() -> dict[str, str]:
    # Bytecode as an installed package has it (pip compiles it; HTA's is): with PYTHONDONTWRITEBYTECODE
    # set, every opscope module would be compiled from source in every job.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    return env


def compile_bytecode() -> None:
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "opscope")], env=_job_env(), check=True)


def run_job(job: str, trace: Path, folder: Path) -> dict:
    """One fresh process; adds its whole wall time ("process_s"). HTA reads a folder of traces."""
    arg = str(trace) if job.startswith("opscope") else str(folder)
    env = _job_env()
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", JOBS[job], arg], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        err = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": err[:120]}
    return {**json.loads(lines[-1]), "process_s": wall}


def measure(trace: Path, repeats: int) -> dict[str, dict]:
    folder = Path(tempfile.mkdtemp(prefix="hta-"))
    shutil.copy(trace, folder / trace.name)
    results: dict[str, list[dict]] = {job: [] for job in JOBS}
    try:
        for _ in range(repeats):
            for job in JOBS:
                results[job].append(run_job(job, trace, folder))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    out = {}
    for job, runs in results.items():
        good = [r for r in runs if "error" not in r]
        if not good:
            out[job] = {"error": runs[0]["error"]}
            continue
        out[job] = {k: statistics.median(r[k] for r in good) for k in ("import_s", "work_s", "process_s", "rss_mib")}
    return out


def _cell(x: dict) -> str:
    if "error" in x:
        return f"failed: {x['error'][:22]}"
    return f"{x['work_s']:.3f} / {x['process_s']:.2f}, {x['rss_mib']:.0f}"


def _ratio(a: dict, b: dict, key: str) -> str:
    if "error" in a or "error" in b or not b.get(key):
        return "—"
    return f"{a[key] / b[key]:.1f}x"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", nargs="*", help="trace file names (or 'synthetic') to run")
    args = ap.parse_args()
    compile_bytecode()
    cases = [(p.name.removesuffix(".json.gz"), p) for p in sorted(TRACES.glob("*.json.gz"))]
    synthetic = OUT / "synthetic_132k.json.gz"
    if not synthetic.exists():
        OUT.mkdir(parents=True, exist_ok=True)
        replicate(32_000, synthetic)
    cases.append(("synthetic ~132k events", synthetic))
    if args.only:
        cases = [c for c in cases if any(o in c[0] for o in args.only)]
    print(f"{args.repeats} fresh processes per job, medians; ratio = HTA / opscope (>1: opscope faster or smaller)")
    print(f"{'trace':<34} {'opscope work/proc s, MiB':>25} {'HTA load work/proc s, MiB':>26} "
          f"{'HTA +breakdown work/proc s, MiB':>32}  {'time vs load (work/proc)':>25} "
          f"{'time vs +bd (work/proc)':>24} {'mem vs load':>11} {'mem vs +bd':>10} "
          f"{'CLI proc s':>10} {'CLI vs load (proc)':>18}")
    for label, path in cases:
        r = measure(path, args.repeats)
        o, hl, hb, cli = r["opscope"], r["hta_load"], r["hta_breakdown"], r["opscope_cli"]
        print(f"{label:<34} {_cell(o):>25} {_cell(hl):>26} {_cell(hb):>32}  "
              f"{_ratio(hl, o, 'work_s') + ' / ' + _ratio(hl, o, 'process_s'):>25} "
              f"{_ratio(hb, o, 'work_s') + ' / ' + _ratio(hb, o, 'process_s'):>24} "
              f"{_ratio(hl, o, 'rss_mib'):>11} {_ratio(hb, o, 'rss_mib'):>10} "
              f"{cli.get('process_s', float('nan')):>10.2f} {_ratio(hl, cli, 'process_s'):>18}", flush=True)


if __name__ == "__main__":
    main()
