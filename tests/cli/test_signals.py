"""SIGINT, SIGTERM and SIGHUP leave nothing behind (no temporary directories, no hidden partial files,
no run directory) and take effect within seconds, even while the model runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TRACES, write_model

SLOW_MODEL = """
    import torch

    class Slow(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(64, 64)

        def forward(self, x):
            for _ in range(200):
                x = torch.tanh(self.lin(x))
            return x

    def get_model():
        return Slow()

    def get_inputs():
        return [torch.randn(256, 64)]
"""


def _start(args: list[str], cwd: Path, tmp: Path) -> subprocess.Popen:
    env = dict(os.environ, TMPDIR=str(tmp), COLUMNS="120")
    return subprocess.Popen([sys.executable, "-m", "opscope", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(predicate, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached")


def _leftovers(folder: Path, tmp: Path) -> list[str]:
    found = [str(p) for p in tmp.iterdir()]
    reports = folder / "reports"
    if reports.exists():
        found += [str(p) for p in reports.iterdir()]
    return found


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_profile_stopped_by_a_signal_leaves_nothing(tmp_path, sig):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    model = write_model(tmp_path, SLOW_MODEL)
    proc = _start(["profile", str(model), "--steps", "200", "--warmup", "1", "--peak-bw", "20", "--peak-flops", "100"],
                  tmp_path, tmp)
    # The profiler's temporary directory exists once the timed pass is running.
    _wait_for(lambda: any(p.name.startswith("opscope-") for p in tmp.iterdir()) or proc.poll() is not None)
    assert proc.poll() is None, proc.communicate()
    time.sleep(0.5)
    sent = time.monotonic()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 30  # prompt: well before the work would end, with room for a loaded machine
    assert proc.returncode == 128 + sig, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("opscope: error:")
    assert _leftovers(tmp_path, tmp) == []


def _big_plain_trace(tmp_path: Path) -> Path:
    """An uncompressed trace (analyze gzips it into the run on a background thread) big enough to still
    be running when the signal arrives."""
    import gzip

    doc = json.loads(gzip.decompress((TRACES / "h100_vit-image-classifier_bf16.json.gz").read_bytes()))
    events = doc["traceEvents"]
    body = [e for e in events if e.get("ph") != "M"]
    big = list(events)
    for c in range(1, 40):
        for e in body:
            e2 = dict(e)
            if "ts" in e2:
                e2["ts"] = e["ts"] + c * 1e6
            big.append(e2)
    doc["traceEvents"] = big
    path = tmp_path / "big.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_analyze_stopped_by_a_signal_leaves_nothing(tmp_path, sig):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    trace = _big_plain_trace(tmp_path)
    proc = _start(["analyze", str(trace), "--peak-bw", "3350", "--peak-flops", "989000"], tmp_path, tmp)
    _wait_for(lambda: (tmp_path / "reports").exists() or proc.poll() is not None)
    sent = time.monotonic()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 30  # prompt: well before the work would end, with room for a loaded machine
    if proc.returncode == 0:
        pytest.skip("the analysis finished before the signal arrived")
    assert proc.returncode == 128 + sig, err
    assert "Traceback" not in err
    assert _leftovers(tmp_path, tmp) == []


class _Stopped(BaseException):
    """Stands in for opscope.cli.app.Terminated: a signal handler raising inside Thread.start()."""


def test_a_signal_while_the_trace_compressor_starts_leaves_nothing(tmp_path, monkeypatch):
    """A signal raised while Thread.start() waits for the new thread (seen in CI under load): the
    compressor's cleanup must not fail with "cannot join thread before it is started", and must leave no
    temporary file or created folder behind."""
    import threading

    from opscope.run.write import TraceCompressor

    trace = tmp_path / "t.json"
    trace.write_text('{"traceEvents": []}')
    folder = tmp_path / "reports"

    def interrupted_start(self: threading.Thread) -> None:
        raise _Stopped  # before the thread ever ran

    monkeypatch.setattr(threading.Thread, "start", interrupted_start)
    with pytest.raises(_Stopped):
        TraceCompressor(trace, folder)
    assert not folder.exists()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_report_prints_names_the_complete_run(tmp_path, sig):
    """stdout is a pipe of one page that nobody reads: analyze puts its run in place, then blocks printing
    the report; the signal then must say where the complete run is, not "nothing was written"."""
    import fcntl
    import threading

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "run"
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, 1031, 4096)  # F_SETPIPE_SZ: the smallest pipe, filled by the report's first lines
    env = dict(os.environ, TMPDIR=str(tmp), COLUMNS="120")
    proc = subprocess.Popen([sys.executable, "-m", "opscope", "analyze", str(TRACES / "h100_bert-small_bf16.json.gz"),
                             "--out", str(out), "--top", "200", "--peak-bw", "3350", "--peak-flops", "989000"],
                            cwd=tmp_path, env=env, stdout=write_end, stderr=subprocess.PIPE, text=True)
    os.close(write_end)
    try:
        _wait_for(lambda: (out / "meta.json").exists() or proc.poll() is not None)
        time.sleep(1.0)  # the report is now blocked on the full pipe
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(sig)
        drain = threading.Thread(target=lambda: [None for _ in iter(lambda: os.read(read_end, 1 << 16), b"")],
                                 daemon=True)
        drain.start()  # what the interrupted process still flushes as it exits
        _, err = proc.communicate(timeout=60)
        drain.join(timeout=10)
    finally:
        os.close(read_end)
    assert proc.returncode == 128 + sig, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("opscope: error:") and "nothing was written" not in last, err
    assert "the run was already complete in" in last and "run" in last
    assert (out / "ops.csv").is_file() and (out / "summary.json").is_file()
