"""Does `opscope gate` hold on a noisy machine? A baseline of 3 runs of benchmarks/gate_models/base.py, then:

- 20 more runs of the same code, the second half beside a CPU hog (`python -c "while 1: pass"`): every
  gate at the defaults (+10%, 99%) should pass (false alarms: 0);
- 20 runs of copy.py (an accidental `.contiguous()` of a transposed activation at line 26, about +15-25%
  step time): the gate should catch >= 19 and every catch name that line;
- 20 runs of slow_op.py (one op row, fc2's aten::mm at line 27, does 11 passes for base.py's 10: the same op,
  line and shapes with 10% more work): the detection rate is reported, one run at a time and 7 runs at a
  time, at the default threshold (+10%) and at +5%, with false alarms of the same-code runs at +5%. The
  row's slowdown is measured, not assumed: the median of its per-step times (summary.json
  op_step_times_us) in the slow_op runs over that in the same-code runs beside no hog (baseline and quiet),
  and, so that load drifting between the run sets cancels, the same ratio of its time over fc1's in each step.

Each run is gated alone (`opscope gate RUN --baseline base`), and 20 draws of 7 runs are gated together
(op rows with one sample per run need several), through the Python API (the CLI is a thin layer over it;
one CLI call at the end checks its exit codes). `--reuse` gates the runs of an earlier call again. Runs use --threads 1 (pinned, as the CI
gate page advises) and --steps 10; `--repeat` profiles each group in one command.

    .venv/bin/python benchmarks/gate_false_alarms.py [--work DIR] [--runs 20] [--steps 10] [--reuse]

About 5-9 minutes on the project's busy 2-core VM (323-520 s measured). Prints the figures and writes
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
SLOW_LINE = "model.py:27"  # fc2's passes in base.py and slow_op.py (profiled as WORK/src/model.py)
FC1_LINE = "model.py:24"  # fc1 in both: the reference its per-step time is taken over
COPY_LINE = "model.py:26"  # copy.py's accidental copy
LOW_THRESHOLD = 0.05  # the second threshold the slow op and the same code are gated at


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


def load_average() -> str:
    """The 1, 5 and 15 minute load averages (how busy the shared machine was)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.platform()


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
    load_at_start = load_average()
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

    def gated(runs: list[Path], threshold: float = 0.10) -> list[GateResult]:
        return [opscope.gate([r], "base", dir=work / "baselines", threshold=threshold) for r in runs]

    g_quiet, g_loaded, g_copy, g_slow = gated(quiet), gated(loaded), gated(copies), gated(slow)

    def names_copy(result: GateResult) -> bool:
        return any(COPY_LINE in (i.line + " " + i.reason) for i in result.regressions)

    caught = [r for r in g_copy if r.exit_code]
    # op rows have one sample per run: gated together, GROUP runs reach 99% against 3 baseline runs
    # (1 / C(10, 3) = 0.008). Groups drawn from the 20 runs (seeded; they overlap, so not independent), the
    # same draws at both thresholds.
    rng = random.Random(29)
    size = min(GROUP, args.runs)  # a smaller --runs: groups of all of them
    same = quiet + loaded
    draws_same = [rng.sample(same, size) for _ in range(len(same))]
    draws_slow = [rng.sample(slow, size) for _ in range(len(slow))]

    def groups(draws: list[list[Path]], threshold: float = 0.10) -> list[GateResult]:
        return [opscope.gate(d, "base", dir=work / "baselines", threshold=threshold) for d in draws]

    grouped_same, grouped_slow = groups(draws_same), groups(draws_slow)
    low_same, low_slow = gated(same, LOW_THRESHOLD), gated(slow, LOW_THRESHOLD)
    low_grouped_same, low_grouped_slow = groups(draws_same, LOW_THRESHOLD), groups(draws_slow, LOW_THRESHOLD)

    def names_slow_op(result: GateResult) -> bool:
        return any(i.kind == "op" and i.line.endswith(SLOW_LINE) for i in result.regressions)

    def of(results: list[GateResult], named: bool = False) -> str:
        return f"{sum(names_slow_op(r) if named else r.exit_code for r in results)} of {len(results)}"

    cli_copy = cli("gate", str(copies[0]), "--baseline", "base", "--dir", str(work / "baselines"), check=False)
    cli_same = cli("gate", str(quiet[0]), "--baseline", "base", "--dir", str(work / "baselines"), check=False)

    def steps_of(runs: list[Path]) -> list[float]:
        return [float(t) for r in runs for t in json.loads((r / "summary.json").read_text())["step_times_us"]]

    def row_steps(runs: list[Path], line: str) -> list[float]:
        """Each step's time of fc1's or fc2's op row (aten::mm at `line`; summary.json op_step_times_us, summed
        over the ops.csv rows of one key as the gate does), all the runs' steps in one list."""
        from opscope.gating.samples import read_samples

        out: list[float] = []
        for run in runs:
            rows = [o for o in read_samples([run]).ops if o.op == "aten::mm" and o.line.endswith(line)]
            if len(rows) != 1 or rows[0].step_times_us is None:
                raise SystemExit(f"{run}: no single aten::mm row with step times at {line}")
            out += rows[0].step_times_us[0]
        return out

    def over_fc1(runs: list[Path]) -> list[float]:
        return [a / b for a, b in zip(row_steps(runs, SLOW_LINE), row_steps(runs, FC1_LINE), strict=True) if b > 0]

    # the reference for the slowdowns: the same code's runs beside no hog (the CPU hog would inflate them)
    ref = baseline_runs + quiet
    med = statistics.median
    base_step = med(steps_of(ref))
    noisy = [noise_of(r) for r in baseline_runs + quiet + loaded + copies + slow]
    figures = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()} {os.cpu_count()} cores, {cpu_model()}",
        "load_average_start_end": f"{load_at_start} / {load_average()}",
        "runs_noisy": f"{sum(v == 'noisy' for v, _ in noisy)} of {len(noisy)}",
        "other_cpu_share_median": med(s for _, s in noisy if s is not None),
        "false_alarms_quiet": f"{sum(r.exit_code for r in g_quiet)} of {len(g_quiet)}",
        "false_alarms_beside_hog": f"{sum(r.exit_code for r in g_loaded)} of {len(g_loaded)}",
        "copy_step_increase": med(steps_of(copies)) / base_step - 1,
        "copy_caught": f"{len(caught)} of {len(g_copy)}",
        "every_catch_names_the_copy_line": all(names_copy(r) for r in caught),
        # measured, not assumed: per step, the slow runs' median over the same code's
        "slow_op_row_slowdown": med(row_steps(slow, SLOW_LINE)) / med(row_steps(ref, SLOW_LINE)) - 1,
        "slow_op_row_over_fc1_slowdown": med(over_fc1(slow)) / med(over_fc1(ref)) - 1,
        "slow_op_step_slowdown": med(steps_of(slow)) / base_step - 1,
        "slow_op_detected": of(g_slow),
        "slow_op_named": of(g_slow, named=True),
        f"groups_of_{GROUP}_same_code_false_alarms": of(grouped_same),
        f"groups_of_{GROUP}_slow_op_detected": of(grouped_slow),
        f"groups_of_{GROUP}_slow_op_named": of(grouped_slow, named=True),
        "at_5%_same_code_false_alarms": of(low_same),
        "at_5%_slow_op_detected": of(low_slow),
        "at_5%_slow_op_named": of(low_slow, named=True),
        f"at_5%_groups_of_{GROUP}_same_code_false_alarms": of(low_grouped_same),
        f"at_5%_groups_of_{GROUP}_slow_op_detected": of(low_grouped_slow),
        f"at_5%_groups_of_{GROUP}_slow_op_named": of(low_grouped_slow, named=True),
        "cli_exit_codes": {"copy run": cli_copy.returncode, "same-code run": cli_same.returncode},
        "seconds": round(time.monotonic() - started),
    }
    (work / "figures.json").write_text(json.dumps(figures, indent=1) + "\n")
    for key, value in figures.items():
        print(f"{key:42} {value:.3f}" if isinstance(value, float) else f"{key:42} {value}")
    print(f"runs and baseline in {work}")


if __name__ == "__main__":
    main()
