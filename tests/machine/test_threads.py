"""Oversubscription (opscope.machine.threads): a CPU profile runs on as many torch threads as fit beside
what other processes use, and a busy machine reuses the cached quiet calibration of another thread count,
scaled, instead of measuring under load."""

from __future__ import annotations

import json

import pytest
import torch

from calibration_helpers import _fake_result, _Snapshots
from conftest import PEAKS, run_cli, write_model
from opscope.capture.options import Progress
from opscope.capture.torch_profiler import choose_threads, machine_peaks
from opscope.machine import calibrate
from opscope.machine.noise import busy_loops
from opscope.machine.threads import idle_threads
from opscope.target.specs import ProfileOptions


@pytest.mark.parametrize(("others", "cores", "default", "threads"), [
    (None, 2, 2, 2),  # unknown: torch's default
    (0.1, 2, 2, 2),  # daemons and tick error
    (1.7, 2, 2, 1),  # two busy loops on 2 cores: 1, never 0
    (0.6, 4, 4, 3),
    (5.0, 4, 4, 1),
    (0.5, 8, 2, 2),  # room for the default: never more than it
])
def test_idle_threads(others, cores, default, threads):
    assert idle_threads(others, cores, default) == threads


class _Said(Progress):
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warn(self, message: str) -> None:
        self.warnings.append(message)


@pytest.fixture
def _threads_kept():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _options(tmp_path, threads=None) -> ProfileOptions:
    return ProfileOptions(target=tmp_path / "m.py", threads=threads)


@pytest.mark.usefixtures("_threads_kept")
def test_a_loaded_machine_gets_fewer_threads_and_the_run_says_so(tmp_path):
    torch.set_num_threads(2)
    sampler = _Snapshots(busy=1.8, own=0.0)  # others keep 1.8 of the 2 cores busy
    chosen = choose_threads(_options(tmp_path), torch.device("cpu"), sampler, sampler.sample())
    assert torch.get_num_threads() == 1
    assert chosen == {"threads": 1, "default": 2, "cores": 2, "set": "fewer, for other processes", "other_cores": 1.8}


@pytest.mark.usefixtures("_threads_kept")
def test_threads_given_are_kept_even_on_a_loaded_machine(tmp_path):
    torch.set_num_threads(2)
    sampler = _Snapshots(busy=1.8, own=0.0)
    chosen = choose_threads(_options(tmp_path, threads=2), torch.device("cpu"), sampler, sampler.sample())
    assert torch.get_num_threads() == 2 and chosen is not None and chosen["set"] == "--threads"


@pytest.mark.usefixtures("_threads_kept")
def test_a_busy_machine_reuses_the_quiet_calibration_scaled_instead_of_measuring(tmp_path, monkeypatch):
    """--threads 1 (or a thread count chosen for the load) with only a 2-thread calibration cached: a fresh
    calibration would measure under load; the cached quiet one is scaled to 1 thread and marked."""
    monkeypatch.setenv("OPSCOPE_CACHE_DIR", str(tmp_path / "cache"))  # not the session's: analyze reads that one
    calibrate.save(_fake_result(2))

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured the CPU under load")

    monkeypatch.setattr(calibrate, "measure_cpu", no_measuring)
    torch.set_num_threads(1)
    said = _Said()
    chosen = {"threads": 1, "default": 2, "cores": 2, "set": "--threads", "other_cores": 1.8}
    peaks, calibration = machine_peaks(_options(tmp_path, threads=1), torch.device("cpu"), said, chosen)
    assert peaks.flops_gflops["float32"] == pytest.approx(150.0)  # 300 GFLOP/s on 2 threads, halved
    assert peaks.memory_bandwidth_gbps == _fake_result(2).peaks().memory_bandwidth_gbps  # kept: never too low
    assert calibration == {"stable": True, "cached": True, "quick": True, "scaled": True}
    assert chosen["calibration_threads"] == 2
    assert "reusing the calibration measured on 2 threads" in said.warnings[0]


@pytest.mark.slow
def test_profile_on_a_loaded_machine_picks_its_threads_and_says_so_in_the_header(tmp_path):
    import os

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores to leave one torch thread out")
    model = write_model(tmp_path, """
        import torch

        def get_model():
            return torch.nn.Linear(32, 32)

        def get_inputs():
            return [torch.randn(8, 32)]
    """)
    out = tmp_path / "r"
    with busy_loops(len(os.sched_getaffinity(0))):
        proc = run_cli("profile", str(model), "--steps", "2", "--warmup", "1", "--out", str(out), *PEAKS, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((out / "meta.json").read_text())
    chosen = meta["threads_chosen"]
    assert chosen["set"] == "fewer, for other processes" and meta["threads"] == chosen["threads"] < chosen["default"]
    assert f"threads {chosen['threads']} of {chosen['default']} (chosen: other processes used" in proc.stdout


@pytest.mark.usefixtures("_threads_kept")
def test_profile_target_leaves_the_callers_thread_count(tmp_path):
    """The run's threads (--threads here; the thread choice on a loaded machine likewise) are the run's: an
    in-process caller (the Python API, the MCP server, a test) gets its own count back."""
    from opscope.capture.torch_profiler import profile_target

    torch.set_num_threads(2)
    model = write_model(tmp_path, """
        import torch
        def get_model():
            return torch.nn.Linear(8, 8)
        def get_inputs():
            return [torch.randn(4, 8)]
        """)
    opts = ProfileOptions(target=model, threads=1, steps=1, warmup=1, peak_bw=20.0, peak_flops=["100"],
                          out=tmp_path / "run")
    run, _ = profile_target(opts)
    assert run.meta["threads"] == 1  # it ran on 1
    assert torch.get_num_threads() == 2
