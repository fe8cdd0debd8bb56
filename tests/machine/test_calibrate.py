"""CPU calibration: one real (quick) measurement, then the cache logic with a stand-in measurement."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from calibration_helpers import _doc, _fake_result, _Snapshots, _with_samples
from opscope.errors import OpscopeError
from opscope.machine import calibrate
from opscope.machine.calibrate import CalibrationResult


@pytest.fixture()
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("OPSCOPE_CACHE_DIR", str(d))
    return d


class _Counter:
    """Wraps calibrate.measure_cpu (real or fake) and counts calls."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


def test_cache_dir_env(cache_dir: Path) -> None:
    assert calibrate.cache_dir() == cache_dir


# Several seconds (first-touching the stream arrays costs host page faults whose price varies run to
# run; 2048^3 GEMMs), so slow; serial: in `make test` it runs alone, where the machine is quiet enough
# for the result to be stable and cached. Under load it checks the other branch: not cached.
@pytest.mark.slow
@pytest.mark.serial
def test_quick_measurement_then_cache(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one test that measures: a quick calibration on 2 threads, then (when it was stable) a cache hit
    without measuring, or (when the machine was busy) no cache and a new measurement."""
    import torch

    counter = _Counter(calibrate.measure_cpu)
    monkeypatch.setattr(calibrate, "measure_cpu", counter)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(1)
    messages: list[str] = []
    try:
        peaks, cached = calibrate.cpu_peaks(threads=2, progress=messages.append)
        assert torch.get_num_threads() == 1  # restored after measuring on 2
    finally:
        torch.set_num_threads(threads_before)
    assert (cached, counter.calls) == (False, 1)
    assert messages and "measuring" in messages[0] and all("\n" not in m for m in messages)
    printed = len(messages)
    assert 0.5 < peaks.memory_bandwidth_gbps < 2000
    assert peaks.flops_gflops["float32"] > 1.0
    assert all(v > 0 for v in peaks.flops_gflops.values())
    assert peaks.origin == {"memory_bandwidth": "measured", "flops": "measured"}

    result = calibrate.load(threads=2)
    unstable = [m for m in messages if m.startswith("opscope: calibration unstable")]
    if result is None:  # the machine was busy: said so, not cached, measured again next time
        assert unstable and not list(cache_dir.glob("cpu-calibration-*.json"))
        calibrate.cpu_peaks(threads=2, progress=messages.append)
        assert counter.calls == 2
        return
    assert not unstable and result.stable and result.noise["verdict"] in ("quiet", "unknown")
    assert result.threads == 2 and result.quick
    assert result.memory_bandwidth_gbps == max(result.copy_gbps, result.triad_gbps)
    assert result.copy_gbps == max(result.samples["copy_gbps"])  # best of the repeats
    assert result.gemm_gflops["float32"] == max(result.samples["gemm_float32_gflops"])
    assert len(result.samples["copy_gbps"]) == result.bandwidth_repeats
    assert result.gemm_sizes["float32"] >= calibrate.GEMM_MIN_N
    assert result.array_bytes >= 256 << 20
    report = calibrate.format_report(result)
    assert "copy" in report and "triad" in report and "GEMM float32" in report

    again, cached = calibrate.cpu_peaks(threads=2, progress=messages.append)
    assert (cached, counter.calls) == (True, 1)
    assert again == peaks
    assert len(messages) == printed  # nothing printed on a cache hit


def test_corrupt_cache_is_ignored_and_rewritten(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    counter = _Counter(lambda threads=None, quick=False: _fake_result(threads))
    monkeypatch.setattr(calibrate, "measure_cpu", counter)
    good = _fake_result(3)
    path = calibrate.save(good)
    assert path.parent == cache_dir

    for corrupt in ("{not json", "[]", json.dumps({"format": 1, "result": {"copy_gbps": -1}}),
                    json.dumps({"format": 999, "result": good.to_json()}),
                    json.dumps({"format": 1, "result": {**good.to_json(), "gemm_gflops": {}}})):
        path.write_text(corrupt)
        assert calibrate.load(threads=3) is None
        peaks, cached = calibrate.cpu_peaks(threads=3)
        assert not cached and peaks.flops_gflops["float32"] == 300.0
        assert calibrate.load(threads=3) is not None  # rewritten
    assert counter.calls == 5


def test_cache_is_keyed_by_threads_and_round_trips(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(calibrate, "measure_cpu", lambda *a, **k: pytest.fail("must not measure"))
    result = _fake_result(2)
    calibrate.save(result)
    assert calibrate.load(threads=5) is None
    loaded = calibrate.load(threads=2)
    assert loaded == result
    peaks, cached = calibrate.cpu_peaks(threads=2)
    assert cached and peaks.memory_bandwidth_gbps == 25.0
    assert peaks.flops_gflops == {"float32": 300.0, "bfloat16": 1200.0}
    doc = result.to_json()
    assert json.loads(json.dumps(doc))["peaks"] == peaks.to_json()
    assert doc["memory_bandwidth_gbps"] == 25.0
    # a cached file for another torch version is not used
    calibrate.save(_fake_result(4, torch_version="0.0.1"))
    assert calibrate.load(threads=4) is None


def test_refresh_measures_again(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    counter = _Counter(lambda threads=None, quick=False: _fake_result(threads, triad_gbps=40.0))
    monkeypatch.setattr(calibrate, "measure_cpu", counter)
    calibrate.save(_fake_result(2))
    peaks, cached = calibrate.cpu_peaks(threads=2, refresh=True)
    assert not cached and counter.calls == 1 and peaks.memory_bandwidth_gbps == 40.0


def test_unwritable_cache_still_returns_peaks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("OPSCOPE_CACHE_DIR", str(blocker / "sub"))  # a directory under a file
    monkeypatch.setattr(calibrate, "measure_cpu", lambda threads=None, quick=False: _fake_result(threads))
    messages: list[str] = []
    peaks, cached = calibrate.cpu_peaks(threads=1, progress=messages.append)
    assert not cached and peaks.flops_gflops["float32"] == 300.0
    assert any("could not cache" in m for m in messages)


def test_bad_threads() -> None:
    with pytest.raises(OpscopeError):
        calibrate.cpu_peaks(threads=0)
    with pytest.raises(OpscopeError):
        calibrate.measure_cpu(threads=-1)


def test_machine_facts_and_sizes() -> None:
    assert calibrate.cpu_model_name()
    llc = calibrate.llc_bytes()
    assert llc is None or llc > 0
    assert calibrate._parse_size("491520K") == 480 << 20
    assert calibrate._parse_size("480 MiB") == 480 << 20
    assert calibrate._parse_size("bogus") is None
    mib = 1 << 20
    notes: list[str] = []
    assert calibrate._stream_array_bytes(8 * mib, None, notes) == 256 * mib  # the 256 MiB floor
    assert calibrate._stream_array_bytes(480 * mib, None, notes) == 1920 * mib  # 4x LLC
    assert notes == []
    assert calibrate._stream_array_bytes(480 * mib, None, notes, max_bytes=512 * mib) == 512 * mib
    assert len(notes) == 1 and "quick" in notes[0]
    assert calibrate._stream_array_bytes(1024 * mib, None, [], max_bytes=512 * mib) == 1024 * mib  # >= 1x LLC
    assert calibrate._stream_array_bytes(64 * mib, None, [], max_bytes=512 * mib) == 256 * mib  # under the cap
    assert calibrate._stream_array_bytes(480 * mib, 3 * 1024 * mib, notes) == 512 * mib  # half of memory / 3
    assert len(notes) == 2


def test_format_report_fake() -> None:
    text = calibrate.format_report(_fake_result(2, notes=["bfloat16 GEMM is emulated"]))
    assert "25.0 GB/s" in text and "300.0 GFLOP/s" in text and "note: bfloat16 GEMM is emulated" in text
    assert "[" not in text  # no rich markup surprises


def _stand_in_kernels(monkeypatch: pytest.MonkeyPatch, copy: list[float], triad: list[float]) -> None:
    monkeypatch.setattr(calibrate, "_measure_bandwidth", lambda torch, repeats, nbytes: (copy, triad))

    def fake_gemm(torch, name, n, repeats, fp32_rate):
        if name == "bfloat16":
            return [20.0], 512, "bfloat16 GEMM runs at 20 GFLOP/s, 0.10x float32"
        if name == "float16":
            raise RuntimeError("\"addmm_impl_cpu_\" not implemented for 'Half'")
        return [200.0, 210.0, 190.0], n, None

    monkeypatch.setattr(calibrate, "_measure_gemm", fake_gemm)


def test_measure_cpu_bookkeeping_with_stand_in_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """measure_cpu's best-of figures, skip rule, instability notes and thread restore, without measuring."""
    import torch

    _stand_in_kernels(monkeypatch, [10.0, 11.0, 30.0], [12.0, 12.0, 12.5])
    before = torch.get_num_threads()
    # the sampler: 1 s per sample, this process used 1 core, the machine 1.02 cores -> others 0.02 cores
    result = calibrate.measure_cpu(threads=1, quick=True, sampler=_Snapshots(busy=1.02, own=1.0))
    assert torch.get_num_threads() == before
    assert result.threads == 1
    assert (result.copy_gbps, result.triad_gbps, result.memory_bandwidth_gbps) == (30.0, 12.5, 30.0)
    assert result.gemm_gflops == {"float32": 210.0, "float64": 210.0}
    assert result.gemm_sizes == {"float32": 2048, "bfloat16": 512, "float64": 2048}
    assert result.noise["verdict"] == "quiet" and result.noise["other_cpu_share"] == pytest.approx(0.01)
    assert not result.stable  # copy varied 30 / 11 = 2.7x between repeats
    assert [n for n in result.notes if n.startswith("unstable")] == [
        "unstable: copy_gbps varied up to 2.7x between repeats (the machine was probably busy), so these "
        "ceilings may read low; they are not cached; rerun `opscope calibrate` on an idle machine"]
    assert any("bfloat16 GEMM runs at" in n for n in result.notes)
    assert any(n.startswith("float16 GEMM unavailable") for n in result.notes)
    assert CalibrationResult.from_json(json.loads(json.dumps(result.to_json()))) == result


def test_other_processes_make_a_calibration_unstable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Consistent repeats, but others used 0.6 of 2 cores meanwhile: unstable, and the note says why."""
    _stand_in_kernels(monkeypatch, [20.0, 20.5, 21.0], [22.0, 22.0, 22.5])
    # per 1 s sample: the machine busy 1.6 cores, this process 1.0 -> others 0.6 cores, share 0.3
    result = calibrate.measure_cpu(threads=1, quick=True, sampler=_Snapshots(busy=1.6, own=1.0))
    assert result.noise["verdict"] == "noisy" and result.noise["other_cpu_share"] == pytest.approx(0.3)
    assert not result.stable
    assert [n for n in result.notes if n.startswith("unstable")] == [
        "unstable: other processes used 0.60 of 2 cores while it measured, so these ceilings may read low; "
        "they are not cached; rerun `opscope calibrate` on an idle machine"]
    quiet = calibrate.measure_cpu(threads=1, quick=True, sampler=_Snapshots(busy=1.0, own=1.0))
    assert quiet.stable and quiet.noise["other_cpu_share"] == 0.0
    assert "machine quiet: other processes used 0.00 of 2 cores" in calibrate.format_report(quiet)


def test_gemm_size_is_set_by_work() -> None:
    """n >= 2048, doubled until each thread gets >= 2 GFLOP (2 * 2048^3 = 17.2 GFLOP covers 8 threads,
    2 * 4096^3 = 137 GFLOP 68), >= 4096 on a matrix engine, capped at 8192."""
    size = calibrate.gemm_size
    assert size("float32", 1, set()) == 2048
    assert size("float32", 8, set()) == 2048
    assert size("float32", 9, set()) == 4096
    assert size("float64", 68, set()) == 4096
    assert size("float64", 69, set()) == 8192
    assert size("float32", 10_000, set()) == 8192
    assert size("bfloat16", 2, {"avx512_bf16", "amx_bf16"}) == 4096
    assert size("bfloat16", 2, {"avx512_bf16"}) == 2048
    assert size("float16", 2, {"amx_bf16"}) == 2048
    assert size("float16", 2, {"amx_fp16"}) == 4096


def test_measure_gemm_probe_and_full_size() -> None:
    """Real (tiny) torch GEMMs: a reduced dtype far under the float32 rate stops at the probe; otherwise
    the requested n is measured `repeats` times."""
    import torch

    rates, n, skipped = calibrate._measure_gemm(torch, "bfloat16", 64, 3, fp32_rate=1e12)
    assert n == calibrate._PROBE_N and len(rates) == 1 and "no fast native path" in skipped
    rates, n, skipped = calibrate._measure_gemm(torch, "bfloat16", 64, 3, fp32_rate=1e-9)
    assert (n, len(rates), skipped) == (64, 3, None)
    rates, n, skipped = calibrate._measure_gemm(torch, "float32", 64, 2, fp32_rate=None)
    assert (n, len(rates), skipped) == (64, 2, None) and all(r > 0 for r in rates)


def test_unstable_result_is_not_cached(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An unstable quick calibration is used for the run, said, not cached, and measured again next time;
    an unstable full one leaves the stable cached result in place."""
    noisy = _fake_result(2, stable=False, notes=["unstable: other processes used 1.20 of 2 cores"])
    counter = _Counter(lambda threads=None, quick=False: noisy)
    monkeypatch.setattr(calibrate, "measure_cpu", counter)
    messages: list[str] = []
    got = calibrate.obtain(2, progress=messages.append)
    assert (got.how, got.path, got.result) == ("measured", None, noisy)
    assert "opscope: calibration unstable: other processes used 1.20 of 2 cores" in messages
    assert calibrate.load(threads=2) is None and not list(cache_dir.glob("cpu-calibration-*.json"))
    peaks, cached = calibrate.cpu_peaks(threads=2)
    assert not cached and counter.calls == 2 and peaks == noisy.peaks()

    stable = _fake_result(2, copy_gbps=50.0)
    calibrate.save(stable)
    got = calibrate.obtain(2, quick=False, refresh=True)
    assert counter.calls == 3 and got.path is None
    assert calibrate.load(threads=2) == stable
    # an unstable file (an older opscope wrote them) is not taken as the machine's ceilings
    path = calibrate.save(stable)
    path.write_text(json.dumps({"format": calibrate.CACHE_FORMAT, "result": noisy.to_json()}))
    assert calibrate.load(threads=2) is None and calibrate.cached_cpu_peaks() is None


# A process that calibrates through calibrate.obtain with a stand-in measurement: it appends a line to
# `log` and returns the result stored in `fake` (after `delay` s). Prints {"how", "copy_gbps"}.
_OBTAIN = """
import json, sys, time
from pathlib import Path
from opscope.machine import calibrate

log, fake, delay, quick = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "quick"

def measure(threads=None, quick=False):
    with log.open("a") as f:
        f.write("measured\\n")
    time.sleep(delay)
    return calibrate.CalibrationResult.from_json(json.loads(fake.read_text()))

calibrate.measure_cpu = measure
got = calibrate.obtain(2, quick=quick, refresh=not quick, progress=lambda m: print(m, file=sys.stderr, flush=True))
print(json.dumps({"how": got.how, "copy_gbps": got.result.copy_gbps}))
"""


def _obtainer(tmp_path: Path, result: CalibrationResult, delay: float, kind: str) -> subprocess.Popen:
    fake = tmp_path / f"fake-{result.copy_gbps}.json"
    fake.write_text(json.dumps(result.to_json()))
    return subprocess.Popen([sys.executable, "-c", _OBTAIN, str(tmp_path / "log"), str(fake), str(delay), kind],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _measurements(tmp_path: Path) -> int:
    log = tmp_path / "log"
    return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.mark.slow  # subprocesses importing torch
def test_concurrent_first_calibrations_measure_once(cache_dir: Path, tmp_path: Path) -> None:
    """Two processes needing this CPU's ceilings at once: one measures, the other waits and reuses it
    (or, if it came later, reads the cache)."""
    procs = [_obtainer(tmp_path, _fake_result(2, copy_gbps=20.0 + i), 1.0, "quick") for i in range(2)]
    outs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert _measurements(tmp_path) == 1
    hows = [o["how"] for o in outs]
    assert hows.count("measured") == 1 and {"reused", "cached"} & set(hows)
    assert outs[0]["copy_gbps"] == outs[1]["copy_gbps"]


def _wait_for_lock_message(proc: subprocess.Popen) -> None:
    for line in proc.stderr:
        if "another opscope process is calibrating" in line:
            return
    pytest.fail(f"no waiting message; stdout {proc.stdout.read()!r}")


def _waits_then_finds(tmp_path: Path, kind: str, meanwhile: CalibrationResult) -> dict:
    """Holds the lock while a `kind` calibration starts and waits for it; caches `meanwhile`; releases."""
    with calibrate.calibration_lock() as waited:
        assert not waited
        proc = _obtainer(tmp_path, _fake_result(2, copy_gbps=2.0, quick=kind == "quick"), 0.0, kind)
        _wait_for_lock_message(proc)
        calibrate.save(meanwhile)
    return json.loads(proc.communicate(timeout=120)[0])


@pytest.mark.slow  # subprocesses importing torch
def test_a_process_that_waited_reuses_what_was_cached_meanwhile(cache_dir: Path, tmp_path: Path) -> None:
    """Deterministic: this test holds the lock while a calibration waits for it, and caches a result
    meanwhile. A quick calibration reuses it; a full one reuses a full result but measures over a quick
    one (a quick result does not stand in for `opscope calibrate`)."""
    assert _waits_then_finds(tmp_path, "quick", _fake_result(2, copy_gbps=42.0)) == {"how": "reused",
                                                                                      "copy_gbps": 42.0}
    assert _measurements(tmp_path) == 0
    assert _waits_then_finds(tmp_path, "full", _fake_result(2, copy_gbps=43.0, quick=False)) == {
        "how": "reused", "copy_gbps": 43.0}
    assert _measurements(tmp_path) == 0
    assert _waits_then_finds(tmp_path, "full", _fake_result(2, copy_gbps=44.0)) == {"how": "measured",
                                                                                     "copy_gbps": 2.0}
    assert _measurements(tmp_path) == 1
    assert calibrate.load(threads=2).copy_gbps == 2.0  # the full one replaced the quick one


# --- what is read back from the cache: finite, plausible, complete, this machine's -----------------------


# (changes to the cached result, the reason opscope gives)
IMPLAUSIBLE = {
    "1e30 GB/s": (_with_samples(copy_gbps=1e30),
                  "copy bandwidth 1e+30 GB/s is implausible (plausible: 0.1-50,000 GB/s)"),
    "1e-30 GFLOP/s": ({"gemm_gflops": {"float32": 1e-30}, "samples": {"gemm_float32_gflops": [1e-30]}},
                      "float32 GEMM 1e-30 GFLOP/s is implausible (plausible: 0.01-10,000,000 GFLOP/s)"),
    "negative": (_with_samples(triad_gbps=-25.0),
                 "triad bandwidth -25 GB/s is implausible (plausible: 0.1-50,000 GB/s)"),
    "NaN": ({"gemm_gflops": {"float32": 300.0, "bfloat16": float("nan")}},
            "bfloat16 GEMM nan GFLOP/s is implausible (plausible: 0.01-10,000,000 GFLOP/s)"),
    "infinite": ({"copy_gbps": float("inf")}, "copy bandwidth inf GB/s is implausible"),
    "bandwidth as text": ({"copy_gbps": "fast"}, "copy bandwidth 'fast' is not a number"),
    "bandwidth as bool": ({"copy_gbps": True}, "copy bandwidth True is not a number"),
    "threads as text": ({"threads": "2"}, "'threads' is '2', not a positive whole number"),
    "gemm as a list": ({"gemm_gflops": [300.0]}, "'gemm_gflops' is not an object of dtype names"),
    "no float32": ({"gemm_gflops": {"bfloat16": 1200.0}}, "it has no float32 GEMM figure"),
    "missing keys": ({"copy_gbps": None, "gemm_gflops": None}, "it lacks 'copy_gbps', 'gemm_gflops'"),
    "samples not numbers": ({"samples": {"copy_gbps": ["x"]}}, "'samples' is not an object of lists"),
    "edited apart from its samples": ({"copy_gbps": 2000.0},
                                      "copy_gbps 2000 is not the best of its samples (20)"),
    "stable as text": ({"stable": "yes"}, "'stable' is 'yes', not true or false"),
    "another machine": ({"cpu_model": "Some Other CPU 9000"}, "it was measured on another CPU ('Some Other CPU"),
    "another torch": ({"torch_version": "1.0.0"}, "it was measured with torch '1.0.0', not"),
    "unstable": ({"stable": False}, "it is marked unstable (measured on a busy machine)"),
}


@pytest.mark.parametrize("case", sorted(IMPLAUSIBLE))
def test_implausible_cache_entries_are_rejected_with_the_reason(case: str) -> None:
    import torch

    changes, reason = IMPLAUSIBLE[case]
    doc = json.loads(json.dumps(_doc(**changes)))  # through JSON, as a file holds it (NaN, Infinity)
    with pytest.raises(calibrate.CacheRejected) as exc:
        calibrate.check_cached(doc, calibrate.cpu_model_name(), 2, str(torch.__version__))
    assert str(exc.value).startswith(reason), str(exc.value)
    assert "\n" not in str(exc.value)


def test_plausible_bounds_are_inclusive_and_a_good_entry_passes() -> None:
    import torch

    args = (calibrate.cpu_model_name(), 2, str(torch.__version__))
    assert calibrate.check_cached(_doc(), *args) == _fake_result(2)
    low_bw, high_bw = calibrate.BANDWIDTH_GBPS_RANGE
    low_f, high_f = calibrate.GFLOPS_RANGE
    edge = _doc(**_with_samples(copy_gbps=low_bw, triad_gbps=high_bw),
                gemm_gflops={"float32": low_f, "bfloat16": high_f})
    edge["result"]["samples"].update(gemm_float32_gflops=[low_f], gemm_bfloat16_gflops=[high_f])
    assert calibrate.check_cached(edge, *args).memory_bandwidth_gbps == high_bw
    with pytest.raises(calibrate.CacheRejected, match="another CPU"):
        calibrate.check_cached(_doc(), "Other", 2, None)
    with pytest.raises(calibrate.CacheRejected, match="measured on 2 threads, not 3"):
        calibrate.check_cached(_doc(), calibrate.cpu_model_name(), 3, None)
    for doc, reason in (([], "the file holds list"), ({"format": 1, "result": {}}, "it is in cache format 1"),
                        ({"format": calibrate.CACHE_FORMAT, "result": 7}, "the result is int")):
        with pytest.raises(calibrate.CacheRejected, match=reason):
            calibrate.check_cached(doc, *args)


def test_obtain_says_why_it_ignores_a_cache_and_measures_again(cache_dir: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A real cache file holding 1e30 GB/s: obtain() says why in one line, measures (stand-in) and
    replaces the file; `analyze`'s torch-free reader passes over it and says why too."""
    counter = _Counter(lambda threads=None, quick=False: _fake_result(threads))
    monkeypatch.setattr(calibrate, "measure_cpu", counter)
    path = calibrate.save(_fake_result(2))
    path.write_text(json.dumps(_doc(**_with_samples(copy_gbps=1e30))))
    warned: list[str] = []
    assert calibrate.cached_cpu_peaks(warned.append) is None
    assert warned == [f"opscope: calibration cache ignored: copy bandwidth 1e+30 GB/s is implausible "
                      f"(plausible: 0.1-50,000 GB/s) ({path})"]
    messages: list[str] = []
    got = calibrate.obtain(2, progress=messages.append)
    assert (got.how, counter.calls) == ("measured", 1)
    assert messages[0] == (f"opscope: calibration cache ignored: copy bandwidth 1e+30 GB/s is implausible "
                           f"(plausible: 0.1-50,000 GB/s); re-measuring ({path})")
    assert calibrate.load(threads=2) == _fake_result(2)  # replaced by the new measurement
    messages.clear()
    assert calibrate.obtain(2, progress=messages.append).how == "cached" and messages == []
    # another machine's file in a shared cache dir is passed over without a word
    other = cache_dir / "cpu-calibration-0123456789abcdef.json"
    other.write_text(json.dumps(_doc(cpu_model="Some Other CPU", stable=False)))
    warned.clear()
    assert calibrate.cached_cpu_peaks(warned.append) == _fake_result(2).peaks() and warned == []


# --- the cache dir is not trusted: only small regular files are read, and the lock cannot hang a run ------

# Reads this CPU's cached ceilings the way `analyze` does, then takes and releases the calibration lock
# the way `profile` does, under a 1 GiB address-space limit; prints what it was told.
_READ_CACHE_AND_LOCK = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from opscope.machine import calibrate
print(calibrate.cached_cpu_peaks(print))
with calibrate.calibration_lock() as waited:
    print("locked", waited)
"""


@pytest.mark.parametrize("kind", ["fifo cache", "cache linked to /dev/zero", "big cache", "fifo lock",
                                  "lock linked to /dev/zero"])
def test_a_cache_or_lock_that_is_not_a_small_regular_file_is_passed_over(kind: str, cache_dir: Path) -> None:
    """A FIFO blocked open() forever, /dev/zero was read until MemoryError: now the file is opened
    without blocking, checked to be a regular file, and read up to a bound."""
    import os

    cache_dir.mkdir()
    cache = cache_dir / "cpu-calibration-0123456789abcdef.json"
    lock = cache_dir / calibrate.LOCK_NAME
    if kind == "fifo cache":
        os.mkfifo(cache)
    elif kind == "cache linked to /dev/zero":
        cache.symlink_to("/dev/zero")
    elif kind == "big cache":
        cache.write_bytes(b" " * (calibrate.MAX_CACHE_BYTES + 1))
    elif kind == "fifo lock":
        os.mkfifo(lock)
    else:
        lock.symlink_to("/dev/zero")
    proc = subprocess.run([sys.executable, "-c", _READ_CACHE_AND_LOCK], capture_output=True, text=True,
                          timeout=120)  # a safety net only: before the fix the FIFO cases never returned
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    if "cache" in kind:
        reason = "it is not a regular file" if kind != "big cache" else "it is larger than 1024 KiB"
        assert lines == [f"opscope: calibration cache ignored: {reason} (a calibration is a few KiB) ({cache})"
                         if kind == "big cache" else
                         f"opscope: calibration cache ignored: {reason} ({cache})", "None", "locked False"]
    else:
        assert lines == ["None", "locked False"]  # measured without the lock, as without a writable dir


def test_the_lock_wait_has_a_timeout(cache_dir: Path) -> None:
    """A process that holds the lock forever (here: this test) does not hang the next calibration: after
    the timeout it says so in one line and goes on without the lock."""
    notes: list[str] = []
    with calibrate.calibration_lock() as first:
        assert not first
        with calibrate.calibration_lock(timeout_s=0.1, note=notes.append) as waited:
            assert waited
    assert len(notes) == 1 and notes[0].startswith("opscope: gave up waiting for the other calibration after 0.1 s")
    assert notes[0].endswith("; measuring without it")
    with calibrate.calibration_lock() as again:  # released and usable again
        assert not again
