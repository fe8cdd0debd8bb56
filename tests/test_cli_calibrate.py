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
