"""Other processes' CPU use (opscope.machine.noise): the /proc/stat arithmetic on recorded snapshots, the verdict,
step-time spread, and where they show up (summary.json, console header, findings). Then the real thing:
CPU hogs during `profile` and `calibrate`, and a quiet run read as quiet when the machine is idle."""

from __future__ import annotations

import gzip
import io
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console

from calibration_helpers import _Snapshots
from conftest import PEAKS, TRACES, run_cli, write_model
from opscope.analysis.pipeline import analyze
from opscope.analysis.trace_file import analyze_trace_file
from opscope.findings.base import NOT_RATE_BASED
from opscope.machine import calibrate, noise
from opscope.machine.noise import CpuSample, CpuSampler
from opscope.machine.peaks import Peaks
from opscope.render.console import noise_line, render_run
from opscope.run.read import read_run
from opscope.trace.reader import load_trace

# /proc/stat as Linux prints it (user nice system idle iowait irq softirq steal guest guest_nice).
STAT = """cpu  {u} 0 {s} 9000 700 0 {si} {st} 0 0
cpu0 {u0} 0 {s} 4500 350 0 {si} {st} 0 0
cpu1 {u1} 0 0 4500 350 0 0 0 0 0
intr 1 2 3
"""


def stat(u0: int, u1: int, s: int = 0, si: int = 0, st: int = 0) -> str:
    return STAT.format(u=u0 + u1, u0=u0, u1=u1, s=s, si=si, st=st)


def test_busy_ticks_counts_busy_columns_over_the_affinity_set() -> None:
    text = stat(u0=100, u1=40, s=10, si=3, st=2)
    # all CPUs: the aggregate line, user + nice + system + irq + softirq + steal (not idle, not iowait)
    assert noise.busy_ticks(text, [0, 1]) == 140 + 10 + 3 + 2
    assert noise.busy_ticks(text, [1]) == 40  # a subset: its cpuN lines
    assert noise.busy_ticks(text, [0]) == 100 + 10 + 3 + 2
    assert noise.busy_ticks(text, [7]) is None
    assert noise.busy_ticks("intr 1 2\n", [0]) is None


def replay(stats: list[str | None], walls: list[float], own: list[float], cpus=(0, 1)) -> CpuSampler:
    it_stat, it_wall, it_own = iter(stats), iter(walls), iter(own)
    return CpuSampler(read_stat=lambda: next(it_stat), clock=lambda: next(it_wall), own_cpu=lambda: next(it_own),
                      cpus=cpus, ticks_per_s=100)


def test_other_cores_is_busy_minus_own_over_wall() -> None:
    # 2 s: the machine was busy 300 ticks (3.0 core-s; 20 of them steal), this process used 1.2 s
    sampler = replay([stat(100, 100), stat(200, 280, st=20)], [10.0, 12.0], [5.0, 6.2])
    a, b = sampler.sample(), sampler.sample()
    assert (a.busy_s, b.busy_s) == (2.0, 5.0)
    assert noise.other_cores(a, b) == pytest.approx((3.0 - 1.2) / 2.0)  # 0.9 cores
    # the tick rounding can make it slightly negative: clamped
    assert noise.other_cores(CpuSample(0, 1.0, 0), CpuSample(1, 1.99, 1.0)) == 0.0
    assert noise.other_cores(CpuSample(0, None, 0), CpuSample(1, 2.0, 0)) is None


def test_assess_quiet_noisy_oversubscribed_unknown() -> None:
    quiet = noise.assess(0.04, cores=2, threads=1, window_s=1.0)
    assert quiet["verdict"] == "quiet" and quiet["other_cpu_share"] == 0.02 and not quiet["oversubscribed"]
    busy = noise.assess(0.9, cores=2, threads=2, window_s=1.0)
    assert busy["verdict"] == "noisy" and busy["other_cpu_share"] == 0.45
    assert busy["reason"] == ("other processes used 0.90 of 2 cores during the timed steps (oversubscribed: 2 "
                              "torch threads + 0.90 busy cores > 2 cores)")
    # 0.2 of 2 cores beside 1 thread: share 0.10 reaches NOISY_SHARE, no oversubscription
    share_only = noise.assess(0.2, cores=2, threads=1, window_s=1.0)
    assert share_only["verdict"] == "noisy" and not share_only["oversubscribed"]
    # one busy process beside 8 threads on 8 cores: share 0.06 < 0.10, but 8 + 0.5 > 8
    oversub = noise.assess(0.5, cores=8, threads=8, window_s=1.0)
    assert oversub["verdict"] == "noisy" and oversub["oversubscribed"] and "oversubscribed" in oversub["reason"]
    # under OVERSUBSCRIBED_MIN_CORES, 8 + 0.1 > 8 is the tick error and daemons, not oversubscription
    assert noise.assess(0.1, cores=8, threads=8, window_s=1.0)["verdict"] == "quiet"
    unknown = noise.assess(None, cores=2, threads=2, window_s=1.0)
    assert unknown["verdict"] == "unknown" and unknown["other_cpu_share"] is None
    assert "/proc/stat" in unknown["reason"]


def test_window_noise_widens_short_windows() -> None:
    """A 0.1 s timed pass: the window goes on through what ran next (to 0.2 s), then waits to 0.5 s."""
    sampler = replay([stat(0, 0), stat(5, 5), stat(10, 10), stat(30, 30)], [0.0, 0.1, 0.2, 0.5],
                     [0.0, 0.1, 0.2, 0.2])
    before, after = sampler.sample(), sampler.sample()
    slept: list[float] = []
    got = noise.window_noise(sampler, before, after, threads=1, sleep=slept.append)
    assert slept == [pytest.approx(0.3)]
    assert got["window_s"] == 0.5
    # 0.6 core-s busy, 0.2 s ours -> 0.4 core-s over 0.5 s = 0.8 cores, share 0.4
    assert got["other_cpu_share"] == pytest.approx(0.4) and got["verdict"] == "noisy"
    assert "during the timed steps (0.10 s) and the 0.40 s after" in got["reason"]
    # a long enough pass is read as it is
    sampler = replay([stat(0, 0), stat(50, 51)], [0.0, 1.0], [0.0, 1.0])
    before, after = sampler.sample(), sampler.sample()
    got = noise.window_noise(sampler, before, after, threads=1, sleep=slept.append)
    assert got["window_s"] == 1.0 and got["verdict"] == "quiet" and len(slept) == 1
    assert got["reason"] == "other processes used 0.01 of 2 cores during the timed steps"


def test_missing_proc_stat_is_unknown() -> None:
    sampler = replay([None, None], [0.0, 1.0], [0.0, 1.0])
    got = noise.window_noise(sampler, sampler.sample(), sampler.sample(), threads=1)
    assert got["verdict"] == "unknown" and got["other_cpu_share"] is None


def test_step_spread() -> None:
    got = noise.step_spread([40.0, 10.0, 30.0, 20.0])
    assert got["step_time_us_p50"] == 25.0 and got["step_time_us_max"] == 40.0
    assert got["step_time_cv"] == pytest.approx(statistics.stdev([10, 20, 30, 40]) / 25.0)  # 0.516
    assert noise.step_spread([7.0]) == {"step_time_us_p50": 7.0, "step_time_us_max": 7.0, "step_time_cv": None}
    assert noise.step_spread([1.0, 2.0, 3.0])["step_time_us_p50"] == 2.0


NOISY = noise.assess(0.93, cores=2, threads=2, window_s=1.0)


def test_remedy_caveat_and_console_line() -> None:
    # 0.93 busy cores of 2 leave 1 core: --threads 1
    assert noise.remedy(NOISY) == "rerun on an idle machine, with --threads 1, or with more --steps"
    assert noise.noise_caveat(None) == "" and noise.noise_caveat({"verdict": "quiet"}) == ""
    assert noise.noise_caveat(NOISY).startswith(" Measured on a noisy run: other processes used 0.93 of 2")
    line = noise_line({"noise": NOISY, "step_time_cv": 0.41})
    assert line == ("noise   noisy: other processes used 0.93 of 2 cores during the timed steps (oversubscribed: "
                    "2 torch threads + 0.93 busy cores > 2 cores); step time varied 41% (cv); rerun on an idle "
                    "machine, with --threads 1, or with more --steps")
    assert noise_line({"noise": noise.assess(0.0, 2, 1, 1.0)}) is None
    assert noise_line({"noise": noise.unknown("a trace")}) is None
    assert noise_line({}) is None  # a run written before these keys existed


def _bert_trace():
    return load_trace(TRACES / "h100_bert-small_bf16.json.gz")


def test_rate_based_findings_carry_the_caveat_on_noisy_runs() -> None:
    """The shared BERT trace analysed as if noisy: every finding whose saving rests on an achieved rate says
    so (not only low-bandwidth and overhead, as before), the others (findings.base.NOT_RATE_BASED) do not;
    as a trace (noise unknown) none does."""
    trace = _bert_trace()
    peaks = Peaks(3350.0, {"float32": 66900.0, "bfloat16": 989400.0})
    plain = analyze(trace, peaks=peaks, meta={}, source="trace")
    assert plain.summary["noise"] == {"other_cpu_share": None, "verdict": "unknown",
                                      "reason": "a trace recorded elsewhere: other processes' CPU use on its "
                                                "machine is not known"}
    noisy = analyze(trace, peaks=peaks, meta={}, source="trace", noise=NOISY)
    assert noisy.summary["noise"] == NOISY
    caveat = noise.noise_caveat(NOISY)
    for before, after in zip(plain.findings, noisy.findings, strict=True):
        assert before["rule"] == after["rule"]
        if after["rule"] in NOT_RATE_BASED:
            assert after["message"] == before["message"]
        else:
            assert after["message"] == before["message"] + caveat
    assert {f["rule"] for f in noisy.findings} - {"low-bandwidth", "overhead"} - NOT_RATE_BASED  # others too


def _step_durations(trace_gz: Path) -> list[float]:
    """ProfilerStep#N durations read straight from the Chrome trace, independently of opscope's reader."""
    doc = json.loads(gzip.decompress(trace_gz.read_bytes()))
    return [e["dur"] for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]


TINY = """
import torch
def get_model():
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU())
def get_inputs():
    return [torch.randn(8, 64)]
"""


def test_profile_and_analyze_summaries(tmp_path: Path) -> None:
    """profile: step stats from its own per-step wall times and a measured noise entry; analyze of the
    same trace: step stats from the ProfilerStep annotations, noise unknown."""
    from opscope.capture.torch_profiler import profile_target
    from opscope.target.specs import ProfileOptions

    path = write_model(tmp_path, TINY)
    run, _ = profile_target(ProfileOptions(target=path, out=tmp_path / "run", steps=4, warmup=1, threads=1,
                                           peak_bw=20.0, peak_flops=["100"]))
    s = run.summary
    assert s["step_time_us_p50"] <= s["step_time_us_max"] and s["step_time_cv"] >= 0
    n = s["noise"]
    if os.path.exists("/proc/stat"):
        assert n["verdict"] in ("quiet", "noisy") and 0 <= n["other_cpu_share"] <= 1
        assert n["window_s"] >= noise.MIN_WINDOW_S and n["threads"] == 1
        assert n["cores"] == len(noise.affinity_cpus())
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert written["noise"] == n and written["step_time_cv"] == pytest.approx(s["step_time_cv"])

    durations = _step_durations(tmp_path / "run" / "trace.json.gz")
    assert len(durations) == 4
    again = analyze_trace_file(tmp_path / "run" / "trace.json.gz", out=tmp_path / "again", peak_bw=20.0,
                               peak_flops=["100"]).summary
    assert again["step_time_us_p50"] == pytest.approx(statistics.median(durations))
    assert again["step_time_us_max"] == pytest.approx(max(durations))
    assert again["step_time_cv"] == pytest.approx(statistics.stdev(durations) / statistics.mean(durations))
    assert again["noise"]["verdict"] == "unknown" and again["noise"]["other_cpu_share"] is None


# --- the real thing -----------------------------------------------------------------------------------
# With busy-loop processes on every core, the tests below check what does not depend on how busy the
# machine happened to be: the fields are there, the share is the reading, the verdict follows the rule
# from that reading, and what a noisy verdict changes (header, caveats, cache) follows the verdict. Where
# a verdict itself is asserted, the /proc/stat readings are injected (the ones measured on the project's
# 2-core VM with one busy loop per core, see noise.NOISY_SHARE), so no timing decides the outcome.


HOGS = len(noise.affinity_cpus())  # one per core
needs_proc_stat = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="no /proc/stat: noise is unknown")


def _others_from_reason(reason: str) -> float:
    """The other processes' cores, as the reason states them ('other processes used 1.37 of 2 cores')."""
    return float(reason.split("other processes used ", 1)[1].split(" of ", 1)[0])


def assert_verdict_follows_reading(n: dict) -> None:
    """The noise entry is complete, and its verdict is assess()'s rule applied to its own reading."""
    assert set(n) >= {"other_cpu_share", "verdict", "reason", "cores", "threads", "oversubscribed", "window_s"}
    share, cores, threads = n["other_cpu_share"], n["cores"], n["threads"]
    assert isinstance(share, float) and 0.0 <= share <= 1.0, n
    assert cores == len(noise.affinity_cpus()) and n["window_s"] >= noise.MIN_WINDOW_S
    others = _others_from_reason(n["reason"])
    assert others / cores == pytest.approx(share, abs=0.005 / cores + 1e-4)  # the reason rounds to 0.01
    oversubscribed = threads + others > cores and others >= noise.OVERSUBSCRIBED_MIN_CORES
    assert n["oversubscribed"] == oversubscribed or abs(threads + others - cores) <= 0.01, n
    if abs(share - noise.NOISY_SHARE) > 1e-4:  # the share is rounded to 4 places
        assert n["verdict"] == ("noisy" if share >= noise.NOISY_SHARE or n["oversubscribed"] else "quiet"), n


def _console(run_dir: Path) -> str:
    out = io.StringIO()
    render_run(read_run(run_dir), Console(file=out, width=500, color_system=None))
    return out.getvalue()


@pytest.mark.slow
@pytest.mark.serial
@needs_proc_stat
def test_profile_under_hogs_reports_what_it_read(tmp_path: Path) -> None:
    """A real profile (CLI subprocess) while one busy loop per core runs: the noise entry is there and
    consistent; the console header and the rate-based findings' caveat appear exactly when it says noisy."""
    path = write_model(tmp_path, TINY)
    with noise.busy_loops(HOGS):
        proc = run_cli("profile", str(path), "--steps", "3", "--warmup", "1", "--threads", "1",
                       *PEAKS, "--json", "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    n = summary["noise"]
    assert n["threads"] == 1
    assert_verdict_follows_reading(n)
    assert summary["step_time_us_p50"] <= summary["step_time_us_max"] and summary["step_time_cv"] >= 0
    noisy = n["verdict"] == "noisy"
    text = _console(tmp_path / "run")
    assert ("noise   noisy: " + n["reason"] in text) == noisy
    assert ("rerun on an idle machine, with --threads" in text) == noisy
    for f in json.loads((tmp_path / "run" / "findings.json").read_text()):
        if f["rule"] in ("low-bandwidth", "overhead"):
            assert f["message"].endswith(noise.noise_caveat(n)) if noisy else "noisy run" not in f["message"]


# One busy loop per core beside a 1-thread run on the 2-core VM: the machine busy 2.0 cores, the run 0.6
# of them, the loops 1.4 (share 0.70, as measured there). Idle: the run 1.0 core, the rest 0.02.
HOGGED, IDLE = (2.0, 0.6), (1.02, 1.0)


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize("readings, verdict", [(HOGGED, "noisy"), (IDLE, "quiet")], ids=["hogged", "idle"])
def test_profile_verdict_from_injected_readings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                readings: tuple[float, float], verdict: str) -> None:
    """A real profile under a real busy loop, with the /proc/stat readings injected: hogged readings make
    a noisy run (summary, header with reason and remedy, caveats), idle ones a quiet run without them."""
    from opscope.capture import torch_profiler
    from opscope.capture.torch_profiler import profile_target
    from opscope.target.specs import ProfileOptions

    monkeypatch.setattr(torch_profiler, "CpuSampler", lambda: _Snapshots(*readings))
    path = write_model(tmp_path, TINY)
    with noise.busy_loops(1):
        run, _ = profile_target(ProfileOptions(target=path, out=tmp_path / "run", steps=3, warmup=1, threads=1,
                                               peak_bw=20.0, peak_flops=["100"]))
    expected = noise.assess(readings[0] - readings[1], cores=2, threads=1, window_s=1.0)
    assert run.summary["noise"] == expected and expected["verdict"] == verdict
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["noise"] == expected
    text = _console(tmp_path / "run")
    if verdict == "noisy":
        assert ("noise   noisy: other processes used 1.40 of 2 cores during the timed steps (oversubscribed: 1 "
                "torch thread + 1.40 busy cores > 2 cores)") in text
        assert "rerun on an idle machine, with --threads 1, or with more --steps" in text
    else:
        assert "noise   noisy" not in text and "rerun on an idle machine" not in text


@pytest.mark.slow
@pytest.mark.serial
@needs_proc_stat
def test_calibration_under_hogs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real quick calibrations under one busy loop per core, on small sizes (the figures are not the
    point; the window is still widened to MIN_WINDOW_S). With the real readings: the entry is consistent
    and the result is cached exactly when it is stable. With the hogged readings injected: unstable, said,
    not cached."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("OPSCOPE_CACHE_DIR", str(cache))
    monkeypatch.setattr(calibrate, "GEMM_MIN_N", 256)
    monkeypatch.setattr(calibrate, "_MIN_ARRAY_BYTES", 16 << 20)
    monkeypatch.setitem(calibrate._QUICK, "max_array_bytes", 16 << 20)
    messages: list[str] = []
    with noise.busy_loops(HOGS):
        real = calibrate.obtain(1, quick=True, progress=messages.append)
        assert_verdict_follows_reading(real.result.noise)
        assert real.result.stable == (real.result.noise["verdict"] != "noisy"
                                      and not any("varied up to" in m for m in real.result.notes))
        assert (real.path is not None) == real.result.stable == (calibrate.load(threads=1) is not None)
        if real.result.noise["verdict"] == "noisy":
            assert any(m.startswith("opscope: calibration unstable: other processes used") for m in messages)
        for f in cache.glob("cpu-calibration-*.json"):
            f.unlink()

        messages.clear()
        monkeypatch.setattr(calibrate, "CpuSampler", lambda: _Snapshots(*HOGGED))
        got = calibrate.obtain(1, quick=True, progress=messages.append)
    assert got.result.noise == noise.assess(1.4, cores=2, threads=1, window_s=1.0, during="while it measured")
    assert not got.result.stable and got.path is None and calibrate.load(threads=1) is None
    assert not list(cache.glob("cpu-calibration-*.json"))
    assert ("opscope: calibration unstable: other processes used 1.40 of 2 cores while it measured "
            "(oversubscribed: 1 torch thread + 1.40 busy cores > 2 cores), so these ceilings may read low; they "
            "are not cached; rerun `opscope calibrate` on an idle machine") in messages


class ThirdPartyLoad:
    """Samples, every `period` s, the CPU that neither this process nor the process tree under `pid`
    used (the CLI's supervisor and its worker): what the rest of the machine did meanwhile. busiest() is
    the highest share over any window of MIN_WINDOW_S."""

    def __init__(self, pid: int, period: float = 0.1) -> None:
        self.pid, self.period = pid, period
        self.sampler = CpuSampler()
        self.samples: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _child_cpu_s(self) -> float | None:
        """utime + stime + cutime + cstime summed over `pid` and its descendants (a child's time moves
        into its parent's cutime when reaped, so the sum runs on)."""
        stats: dict[int, tuple[int, float]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            stats[int(entry.name)] = (int(fields[1]), sum(int(v) for v in fields[11:15]) / self.sampler.ticks_per_s)
        if self.pid not in stats:
            return None
        tree, total = {self.pid}, 0.0
        grew = True
        while grew:
            grew = False
            for pid, (ppid, _) in stats.items():
                if ppid in tree and pid not in tree:
                    tree.add(pid)
                    grew = True
        for pid in tree:
            total += stats[pid][1]
        return total

    def _run(self) -> None:
        while not self.stop.is_set():
            child = self._child_cpu_s()
            s = self.sampler.sample()
            if child is None or s.busy_s is None:
                break
            self.samples.append((s.wall_s, s.busy_s - s.own_cpu_s - child))
            time.sleep(self.period)

    def busiest(self) -> float:
        self.stop.set()
        self.thread.join()
        worst = 0.0
        for i, (w0, b0) in enumerate(self.samples):
            for w1, b1 in self.samples[i + 1:]:
                if w1 - w0 >= noise.MIN_WINDOW_S:
                    worst = max(worst, (b1 - b0) / (w1 - w0) / self.sampler.cores)
                    break
        return worst


@pytest.mark.slow
@pytest.mark.serial
@needs_proc_stat
def test_quiet_profile_reads_quiet(tmp_path: Path) -> None:
    """Without hogs, a profile on an idle machine reads quiet. Whether the machine is idle is measured
    alongside (everything but this test and the profile process); when it was not, the test skips with
    that measurement rather than assert about someone else's load."""
    sampler = CpuSampler()
    a = sampler.sample()
    time.sleep(noise.MIN_WINDOW_S)
    background = noise.other_cores(a, sampler.sample()) / sampler.cores
    if background >= noise.NOISY_SHARE / 2:
        pytest.skip(f"machine not idle: other processes used {min(background, 1):.0%} of its CPU before the run")
    env = {**os.environ, "COLUMNS": "160"}
    path = write_model(tmp_path, TINY)
    proc = subprocess.Popen([sys.executable, "-m", "opscope", "profile", str(path), "--steps", "3",
                             "--warmup", "1", "--threads", "1", *PEAKS, "--json", "--out", str(tmp_path / "run")],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    monitor = ThirdPartyLoad(proc.pid)
    out, err = proc.communicate(timeout=300)
    busiest = monitor.busiest()
    assert proc.returncode == 0, err
    if busiest >= noise.NOISY_SHARE / 2:
        pytest.skip(f"machine not idle: other processes used up to {busiest:.0%} of its CPU during the run")
    got = json.loads(out)["noise"]
    assert got["verdict"] == "quiet", (got, busiest)


def test_damaged_noise_keys_give_one_line_not_a_traceback(tmp_path: Path) -> None:
    """summary.json's step and noise keys and meta.json's "calibration" retyped: `opscope report` (console
    and HTML) renders the run or names the damage in one line, never a traceback."""
    import shutil

    from opscope.errors import OpscopeError
    from opscope.render.html import render_html

    good = tmp_path / "good"
    analyze_trace_file(TRACES / "h100_bert-small_bf16.json.gz", out=good, peak_bw=3350.0, peak_flops=["989000"])
    summary = json.loads((good / "summary.json").read_text())
    summary.update(noise=NOISY, step_time_cv=0.41)
    (good / "summary.json").write_text(json.dumps(summary))
    meta = json.loads((good / "meta.json").read_text())
    meta["calibration"] = {"stable": False, "cached": False, "quick": True}
    (good / "meta.json").write_text(json.dumps(meta))
    assert "noise   noisy: other processes used 0.93 of 2 cores" in _console(good)
    assert "calibration unstable (the machine was busy)" in _console(good)

    values = [None, "x", -1, 1e308, [], {}, True, "NaN", 2**80, [1]]
    paths = [("summary.json", (k,)) for k in ("step_time_us_p50", "step_time_us_max", "step_time_cv", "noise")]
    paths += [("summary.json", ("noise", k)) for k in NOISY] + [("meta.json", ("calibration",)),
                                                                 ("meta.json", ("calibration", "stable"))]
    rejected = 0
    for i, (name, where) in enumerate(paths):
        for value in values:
            folder = tmp_path / f"r{i}"
            shutil.rmtree(folder, ignore_errors=True)
            shutil.copytree(good, folder)
            doc = json.loads((folder / name).read_text())
            target = doc
            for step in where[:-1]:
                target = target[step]
            target[where[-1]] = value
            (folder / name).write_text(json.dumps(doc))
            try:
                run = read_run(folder)
                render_run(run, Console(file=io.StringIO(), width=140))
                render_html(run)
            except OpscopeError as exc:
                assert "\n" not in str(exc)
                rejected += 1
    assert rejected  # the checks on read caught some (e.g. "noise" as a list)
