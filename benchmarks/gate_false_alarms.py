"""Does `opscope gate` hold on a noisy machine? A baseline of 3 runs of benchmarks/gate_models/base.py, then:

- 20 more runs of the same code, the second half beside a CPU hog (`python -c "while 1: pass"`): every
  gate at the defaults (+10%, 99%) should pass (false alarms: 0);
- 20 runs of copy.py (an accidental `.contiguous()` of a transposed activation at line 15, about +15-25%
  step time): the gate should catch >= 19 and every catch name that line;
- 20 runs of slow_op.py (its last matmul 14-20% slower, measured): the detection rate is reported, one run
  at a time and 7 runs at a time.

Each run is gated alone (`opscope gate RUN --baseline base`), and 20 draws of 7 runs are gated together
(op rows with one sample per run need several), through the Python API (the CLI is a thin layer over it;
one CLI call at the end checks its exit codes). `--reuse` gates the runs of an earlier call again. Runs use --threads 1 (pinned, as the CI
gate page advises) and --steps 10; `--repeat` profiles each group in one command.

    .venv/bin/python benchmarks/gate_false_alarms.py [--work DIR] [--runs 20] [--steps 10] [--reuse]

About 5-8 minutes on the project's 2-core VM (292-435 s measured). Prints the figures and writes
DIR/figures.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = HERE / "gate_models"
REUSE = False
GROUP = 7
SLOW_LINE = "model.py:15"  # slow_op.py's fc2
COPY_LINE = "model.py:15"  # copy.py's line 15, profiled as WORK/src/model.py


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "opscope", *args], capture_output=True, text=True, timeout=3600)
    if check and done.returncode != 0:
        raise SystemExit(f"opscope {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return done


def profile(model: str, out: Path, repeat: int, steps: int) -> list[Path]:
    """OUT/run-1 ... OUT/run-N of the variant `model`, copied to one path first (WORK/src/model.py): in CI the
    pull request changes the file the baseline profiled, so op rows keep their file and line."""
    if REUSE and (out / "run-1").is_dir():  # --reuse: gate the runs an earlier call profiled
        return sorted(out.glob("run-*"), key=lambda p: int(p.name.removeprefix("run-")))[:repeat]
    target = out.parent / "src" / "model.py"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text((MODELS / model).read_text())
    # with --repeat 1 a plain profile: given OUT/run-1 itself
    cli("profile", str(target), "--threads", "1", "--steps", str(steps), "--repeat", str(repeat),
        "--out", str(out if repeat > 1 else out / "run-1"))
    return [out / f"run-{i}" for i in range(1, repeat + 1)]


def noise_of(run: Path) -> tuple[str, float | None]:
    noise = json.loads((run / "summary.json").read_text()).get("noise") or {}
    return str(noise.get("verdict")), noise.get("other_cpu_share")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None, help="Folder for the runs (default: a temporary one).")
    parser.add_argument("--runs", type=int, default=20, help="Runs per group (same code, copy, slow op).")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--reuse", action="store_true", help="Gate the runs already in --work (no profiling).")
    args = parser.parse_args()
    global REUSE
    REUSE = args.reuse
    import opscope
    from opscope.gating.verdict import GateResult

    work = args.work or Path(tempfile.mkdtemp(prefix="opscope-gate-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    baseline_runs = profile("base.py", work / "baseline", 3, args.steps)
    cli("baseline", "save", *map(str, baseline_runs), "--name", "base", "--dir", str(work / "baselines"))

    half = args.runs // 2
    quiet = profile("base.py", work / "same-quiet", half, args.steps)
    hog = subprocess.Popen([sys.executable, "-c", "while 1: pass"]) if not REUSE else None
    try:
        loaded = profile("base.py", work / "same-hog", args.runs - half, args.steps)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    copies = profile("copy.py", work / "copy", args.runs, args.steps)
    slow = profile("slow_op.py", work / "slow", args.runs, args.steps)

    def gated(runs: list[Path]) -> list[GateResult]:
        return [opscope.gate([r], "base", dir=work / "baselines") for r in runs]

    g_quiet, g_loaded, g_copy, g_slow = gated(quiet), gated(loaded), gated(copies), gated(slow)

    def names_copy(result: GateResult) -> bool:
        return any(COPY_LINE in (i.line + " " + i.reason) for i in result.regressions)

    caught = [r for r in g_copy if r.exit_code]
    # op rows have one sample per run: gated together, GROUP runs reach 99% against 3 baseline runs
    # (1 / C(10, 3) = 0.008). Groups drawn from the 20 runs (seeded; they overlap, so not independent).
    rng = random.Random(29)

    def groups(runs: list[Path]) -> list[GateResult]:
        size = min(GROUP, len(runs))  # a smaller --runs: groups of all of them
        return [opscope.gate(rng.sample(runs, size), "base", dir=work / "baselines") for _ in range(len(runs))]

    grouped_same, grouped_slow = groups(quiet + loaded), groups(slow)

    def names_slow_op(result: GateResult) -> bool:
        return any(i.kind == "op" and i.line.endswith(SLOW_LINE) for i in result.regressions)

    cli_copy = cli("gate", str(copies[0]), "--baseline", "base", "--dir", str(work / "baselines"), check=False)
    cli_same = cli("gate", str(quiet[0]), "--baseline", "base", "--dir", str(work / "baselines"), check=False)

    def step_p50(run: Path) -> float:
        return float(json.loads((run / "summary.json").read_text())["step_time_us_p50"])

    base_step = statistics.median(step_p50(r) for r in baseline_runs)

    def op_time(run: Path, line: str) -> float:
        import csv

        with open(run / "ops.csv", newline="") as f:
            rows = [r for r in csv.DictReader(f) if r["op"] == "aten::mm" and r["source_location"].endswith(line)]
        steps = json.loads((run / "summary.json").read_text())["steps"]
        return sum(float(r["time_us_total"]) for r in rows) / steps

    # the slow op's own slowdown: its matmul over the first matmul of the same run (load cancels)
    slow_ratio = statistics.median(op_time(r, ":15") / op_time(r, ":14") for r in slow)
    base_ratio = statistics.median(op_time(r, ":15") / op_time(r, ":14") for r in baseline_runs + quiet)
    noisy = [noise_of(r) for r in baseline_runs + quiet + loaded + copies + slow]
    figures = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()} {os.cpu_count()} cores, {platform.processor() or platform.platform()}",
        "runs_noisy": f"{sum(v == 'noisy' for v, _ in noisy)} of {len(noisy)}",
        "other_cpu_share_median": statistics.median(s for _, s in noisy if s is not None),
        "false_alarms_quiet": f"{sum(r.exit_code for r in g_quiet)} of {len(g_quiet)}",
        "false_alarms_beside_hog": f"{sum(r.exit_code for r in g_loaded)} of {len(g_loaded)}",
        "copy_step_increase": statistics.median(step_p50(r) for r in copies) / base_step - 1,
        "copy_caught": f"{len(caught)} of {len(g_copy)}",
        "every_catch_names_the_copy_line": all(names_copy(r) for r in caught),
        "slow_op_slowdown": slow_ratio / base_ratio - 1,
        "slow_op_detected": f"{sum(r.exit_code for r in g_slow)} of {len(g_slow)}",
        "slow_op_named": f"{sum(names_slow_op(r) for r in g_slow)} of {len(g_slow)}",
        f"groups_of_{GROUP}_same_code_false_alarms": f"{sum(r.exit_code for r in grouped_same)} of {len(grouped_same)}",
        f"groups_of_{GROUP}_slow_op_detected": f"{sum(r.exit_code for r in grouped_slow)} of {len(grouped_slow)}",
        f"groups_of_{GROUP}_slow_op_named": f"{sum(names_slow_op(r) for r in grouped_slow)} of {len(grouped_slow)}",
        "cli_exit_codes": {"copy run": cli_copy.returncode, "same-code run": cli_same.returncode},
        "seconds": round(time.monotonic() - started),
    }
    (work / "figures.json").write_text(json.dumps(figures, indent=1) + "\n")
    for key, value in figures.items():
        print(f"{key:34} {value:.3f}" if isinstance(value, float) else f"{key:34} {value}")
    print(f"runs and baseline in {work}")


if __name__ == "__main__":
    main()
