"""`opscope calibrate` measures this machine and caches the result when it was stable; `profile` then
reuses it. On a busy machine it says the result is unstable and caches nothing."""

from __future__ import annotations

import json
import os

import pytest

from conftest import EXAMPLES, run_cli


# serial: `make test` runs it alone, where the machine is quiet enough for the stable branch.
@pytest.mark.slow
@pytest.mark.serial
def test_calibrate_measures_caches_and_profile_reuses_it(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("OPSCOPE_CACHE_DIR", str(cache))
    proc = run_cli("calibrate", "--threads", "1", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["threads"] == 1 and not result["quick"]
    assert 0.5 < result["memory_bandwidth_gbps"] < 2000
    assert result["gemm_gflops"]["float32"] == max(result["samples"]["gemm_float32_gflops"])
    assert result["gemm_sizes"]["float32"] >= 2048
    assert result["peaks"]["origin"] == {"memory_bandwidth": "measured", "flops": "measured"}
    assert result["noise"]["verdict"] in ("quiet", "noisy", "unknown")
    files = list(cache.glob("cpu-calibration-*.json"))
    if not result["stable"]:  # a busy machine: said so, nothing cached
        assert "not cached" in proc.stderr and any(n.startswith("unstable") for n in result["notes"])
        assert files == []
        return
    assert "cached in" in proc.stderr and len(files) == 1
    # profile at the same thread count takes the cached ceilings and does not measure again
    before = files[0].stat().st_mtime_ns
    prof = run_cli("profile", str(EXAMPLES / "mlp.py"), "--threads", "1", "--steps", "1", "--warmup", "0",
                   "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert prof.returncode == 0, prof.stderr
    assert "measuring" not in prof.stderr
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["peaks"]["memory_bandwidth_gbps"] == pytest.approx(result["memory_bandwidth_gbps"])
    assert meta["peaks"]["origin"]["flops"] == "measured"
    assert meta["calibration"] == {"stable": True, "cached": True, "quick": False}
    assert files[0].stat().st_mtime_ns == before
    assert os.environ["OPSCOPE_CACHE_DIR"] == str(cache)


def test_analyze_passes_over_an_implausible_cache_and_says_why(tmp_path, monkeypatch):
    """A real cache file of this CPU holding 1e-30 GFLOP/s: `analyze` of a CPU trace does not take it as
    the ceilings, says why in one line, and says it has no calibration."""
    from calibration_helpers import _doc

    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("OPSCOPE_CACHE_DIR", str(cache))
    bad = _doc(gemm_gflops={"float32": 1e-30}, samples={"gemm_float32_gflops": [1e-30]})
    (cache / "cpu-calibration-0000000000000000.json").write_text(json.dumps(bad))
    trace = EXAMPLES.parent / "tests" / "fixtures" / "cpu_traces" / "avx2_channels_last_after_train.json.gz"
    proc = run_cli("analyze", str(trace), "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    err = " ".join(proc.stderr.split())
    assert ("opscope: calibration cache ignored: float32 GEMM 1e-30 GFLOP/s is implausible (plausible: "
            "0.01-10,000,000 GFLOP/s)") in err
    assert "this machine has no cached calibration" in err
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["peaks"]["memory_bandwidth_gbps"] is None


@pytest.mark.slow  # a real quick calibration
def test_profile_re_measures_over_an_implausible_cache(tmp_path, monkeypatch):
    """A real cache file at this machine's path for 1 thread, holding 1e30 GB/s: `profile` says why it
    ignores it, measures, and uses (and, when stable, caches) what it measured."""
    import torch

    from calibration_helpers import _doc, _with_samples
    from opscope.machine import calibrate

    cache = tmp_path / "cache"
    monkeypatch.setenv("OPSCOPE_CACHE_DIR", str(cache))
    path = calibrate.cache_file(calibrate.cpu_model_name(), 1, str(torch.__version__))
    path.parent.mkdir(parents=True)
    bad = _doc(**_with_samples(copy_gbps=1e30))
    bad["result"]["threads"] = 1
    path.write_text(json.dumps(bad))
    proc = run_cli("profile", str(EXAMPLES / "mlp.py"), "--threads", "1", "--steps", "1", "--warmup", "0",
                   "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    err = " ".join(proc.stderr.split())
    assert ("opscope: calibration cache ignored: copy bandwidth 1e+30 GB/s is implausible (plausible: "
            f"0.1-50,000 GB/s); re-measuring ({path})") in err
    assert "measuring this CPU's memory bandwidth" in err
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    low, high = calibrate.BANDWIDTH_GBPS_RANGE
    assert low <= meta["peaks"]["memory_bandwidth_gbps"] <= high
    assert meta["peaks"]["origin"] == {"memory_bandwidth": "measured", "flops": "measured"}
    kept, why = calibrate.read_cache_file(path, calibrate.cpu_model_name(), 1, str(torch.__version__))
    if meta["calibration"]["stable"]:  # replaced by the new measurement
        assert why is None and kept.memory_bandwidth_gbps == pytest.approx(meta["peaks"]["memory_bandwidth_gbps"])
    else:  # a busy machine: said so, and the bad file is still not used
        assert "calibration unstable" in err and "implausible" in str(why)
