"""dtype-slow-path: reduced-precision convolutions/matmuls far slower than float32 on this machine.

The rule is tested on recorded traces (tests/fixtures/cpu_traces: examples/convnet.py in bfloat16, train
mode, on a CPU forced onto its AVX2 paths, where ATen runs bf16 convolutions in _slow_conv2d_forward, and
on the same CPU with its native AVX512-BF16 paths) and on a real profile rerun with stub probes, so no
assertion depends on this machine's ISA or timing; the real probe is checked for what it builds and that
it measures, never for how fast.
"""

from __future__ import annotations

import gzip
import json

import pytest
import torch

import opscope.capture.torch_profiler as tp
from conftest import REPO, write_model
from opscope.analysis.trace_file import analyze_trace_file
from opscope.capture import dtype_probe
from opscope.capture.dtype_probe import build_call, float32_probe
from opscope.capture.torch_profiler import profile_target
from opscope.findings import Context, run_rules
from opscope.findings import dtype_slow_path as rule
from opscope.findings.dtype_slow_path import replay_spec
from opscope.machine.peaks import Peaks
from opscope.target.specs import ProfileOptions

FIXTURES = REPO / "tests" / "fixtures" / "cpu_traces"
AVX2 = FIXTURES / "avx2_convnet_bf16_train.json.gz"
NATIVE = FIXTURES / "avx512bf16_convnet_bf16_train.json.gz"
BW, FP32 = 20.0, 100.0  # GB/s and GFLOP/s given to analyze: the float32 roofline below uses them


def analyze(path, tmp_path, bw: float = BW, fp32: float = FP32):
    return analyze_trace_file(path, out=tmp_path / path.name.split(".")[0], peak_bw=bw,
                              peak_flops=[f"float32={fp32}", "bfloat16=1000"])


def slow_path(run) -> list[dict]:
    return [f for f in run.findings if f["rule"] == "dtype-slow-path"]


def outer_durations(path) -> dict[tuple[str, str], list[float]]:
    """µs of each aten::conv2d / aten::convolution_backward call in the trace, by (op, input dims)."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    out: dict[tuple[str, str], list[float]] = {}
    for e in doc["traceEvents"]:
        if e.get("cat") == "cpu_op" and e["name"] in ("aten::conv2d", "aten::convolution_backward"):
            out.setdefault((e["name"], json.dumps(e["args"]["Input Dims"][:3])), []).append(e["dur"])
    return out


def conv_flops(n, cin, cout, hout, wout, k=3) -> int:
    return 2 * n * cout * hout * wout * cin * k * k


def test_estimated_on_the_avx2_trace(tmp_path):
    run = analyze(AVX2, tmp_path)
    (f,) = slow_path(run)
    assert f["op"] == "aten::conv2d" and "estimated from the float32 peak, not measured" in f["message"]
    assert "aten::_slow_conv2d_forward" in set(run.to_pandas()["op"])  # what AVX2 runs bf16 convolutions with
    # float32 roofline per call = FLOPs / 100 GFLOP/s (the bytes, at 4 bytes per element / 20 GB/s, are
    # shorter). Forward: 2*N*Cout*Hout*Wout*Cin*9; backward: twice that (input and weight gradients) plus
    # the bias gradient's N*Cout*Hout*Wout adds, only the weight gradient for the first layer.
    fwd = {"[[8, 3, 64, 64], [32, 3, 3, 3], [32]]": conv_flops(8, 3, 32, 64, 64),
           "[[8, 32, 64, 64], [64, 32, 3, 3], [64]]": conv_flops(8, 32, 64, 32, 32),
           "[[8, 64, 32, 32], [64, 64, 3, 3], [64]]": conv_flops(8, 64, 64, 32, 32)}
    bwd = {"[[8, 64, 32, 32], [8, 64, 32, 32], [64, 64, 3, 3]]": 2 * conv_flops(8, 64, 64, 32, 32) + 8 * 64 * 32 * 32,
           "[[8, 64, 32, 32], [8, 32, 64, 64], [64, 32, 3, 3]]": 2 * conv_flops(8, 32, 64, 32, 32) + 8 * 64 * 32 * 32,
           "[[8, 32, 64, 64], [8, 3, 64, 64], [32, 3, 3, 3]]": conv_flops(8, 3, 32, 64, 64) + 8 * 32 * 64 * 64}
    expected, fired = 0.0, 0
    for (op, dims), durs in outer_durations(AVX2).items():
        ideal = (fwd if op == "aten::conv2d" else bwd)[dims] / (FP32 * 1e3)
        t = sum(durs) / len(durs)
        if t >= rule.MIN_SLOWDOWN_ESTIMATED * ideal:
            expected += sum(durs) - len(durs) * ideal
            fired += 1
    assert fired == 3  # the forward convolutions, 249x-364x; the backward ones are 9x-17x
    assert f["est_savings_us"] == pytest.approx(expected, rel=1e-3)
    assert "conv2d [8, 64, 32, 32] at ? takes 1.51 s per call against 6.04 ms (249x)" in f["message"]
    assert "float32" in f["suggestion"] and "AVX512-BF16" in f["suggestion"]


def test_estimate_gates(tmp_path, monkeypatch):
    monkeypatch.setattr(rule, "MIN_SLOWDOWN_ESTIMATED", 10.0)
    assert "5 such calls per step" in slow_path(analyze(AVX2, tmp_path / "a"))[0]["message"]  # + 2 backward
    # a float32 peak so high that every roofline time is under MIN_IDEAL_US: latency could explain anything
    assert not slow_path(analyze(AVX2, tmp_path / "b", bw=1e6, fp32=1e6))


def test_silent_where_bf16_is_fast(tmp_path):
    # the same CPU on its AVX512-BF16 paths: the slowest op is a 3-channel first layer at 12x its float32
    # roofline, an inefficient layer in any dtype, not a slow path
    assert not slow_path(analyze(NATIVE, tmp_path))


# --- profile: the probe decides ---------------------------------------------------------------------

NET = '''
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(256, 64)

    def forward(self, x, y):
        return self.conv(x), self.fc(y)  # OPS


def get_model():
    return Net()


def get_inputs():
    return [torch.randn(4, 8, 16, 16), torch.randn(32, 256)]
'''


class RecordingProbe:
    """Stands in for opscope.capture.dtype_probe.float32_probe; answers with fixed timings."""

    def __init__(self, answer):
        self.answer = answer
        self.specs: list[dict] = []

    def __call__(self, spec):
        self.specs.append(spec)
        return self.answer(spec) if callable(self.answer) else self.answer


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bf16")
    path = write_model(folder, NET)
    opts = ProfileOptions(target=path, out=folder / "run", steps=2, warmup=1, peak_bw=20.0, peak_flops=["1000"],
                          dtype="bfloat16")
    probe = RecordingProbe((None, 1e-3))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tp, "float32_probe", lambda device: probe)
        mp.setattr(rule, "MIN_SHARE", 0.0)
        run, _ = profile_target(opts)
    return run, probe


def context(run, probe) -> Context:
    return Context(ops=run.ops, events=run.events, peaks=Peaks(20.0, {"float32": 1000.0}), gpu=False,
                   source="profile", steps=2, step_time_us=run.summary["step_time_us"], dtype_probe=probe)


def test_profile_asks_the_probe_for_the_lines_ops(bf16_run):
    run, probe = bf16_run
    ops = {s["op"] for s in probe.specs}
    assert ops == {"aten::conv2d", "aten::linear"}  # what the line called, not the kernels beneath
    conv = next(s for s in probe.specs if s["op"] == "aten::conv2d")
    assert conv["args"][0] == {"shape": [4, 8, 16, 16], "stride": [2048, 256, 16, 1], "dtype": "c10::BFloat16"}
    assert [a["value"] for a in conv["args"][3:]] == [[1, 1], [1, 1], [1, 1], 1]
    (f,) = slow_path(run)  # float32 "took" 1 ns: every op is far slower
    assert "measured: the same calls replayed on this device" in f["message"]


@pytest.mark.parametrize(("answer", "fires"), [
    ((None, 1e-3), True),  # the op's profiled time against 1 ns of float32
    ((50.0, 10.0), True),  # replayed alike: 5x slower
    ((11.0, 10.0), False),  # replayed alike: 1.1x, whatever the profile said
    (None, False),  # cannot measure: no finding, no guess
])
def test_probe_answers_decide(bf16_run, monkeypatch, answer, fires):
    run, _ = bf16_run
    monkeypatch.setattr(rule, "MIN_SHARE", 0.0)
    monkeypatch.setattr(rule, "OWN_REPLAY_MAX_US", float("inf"))
    probe = RecordingProbe(answer)
    found = run_rules(context(run, probe), only=["dtype-slow-path"])
    assert bool(found) == fires
    assert probe.specs and all(s["own"] for s in probe.specs)
    if answer == (50.0, 10.0):
        # per group: the measured fraction (1 - 10/50) of its profiled time, capped at calls x (50 - 10) µs
        ctx = context(run, probe)
        expected = sum(min(g.time * 0.8, g.calls * 40.0) for g in rule._groups(ctx))
        # a finding carries µs to 3 decimals (findings/base.py): within half of the last one
        assert found[0]["est_savings_us"] == pytest.approx(expected, rel=0, abs=5e-4 + 1e-9)
        assert "(5x)" in found[0]["message"]


def test_real_probe_replays_the_captured_calls(bf16_run, monkeypatch):
    run, _ = bf16_run
    monkeypatch.setattr(dtype_probe, "BUDGET_S", 600.0)  # a loaded machine must not run out of it here
    ctx = context(run, None)
    probe = float32_probe(torch.device("cpu"))
    for g in rule._groups(ctx):
        spec = replay_spec(ctx, g.event)
        own, t32 = probe({**spec, "own": True})
        assert own > 0 and t32 > 0
        assert build_call(spec, torch.device("cpu"))().dtype == torch.float32
        assert build_call(spec, torch.device("cpu"), float32=False)().dtype == torch.bfloat16
    assert probe({"op": "aten::no_such_op", "args": []}) is None


def test_real_probe_keeps_strides_and_its_budget(monkeypatch):
    expanded = {"shape": [8, 10, 1, 1], "stride": [0, 0, 0, 0], "dtype": "c10::BFloat16"}
    cl = {"shape": [8, 32, 4, 4], "stride": [512, 1, 128, 32], "dtype": "c10::BFloat16"}
    weight = {"shape": [10, 32, 4, 4], "stride": [512, 1, 128, 32], "dtype": "c10::BFloat16"}
    values = [[10], [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [True, True, True]]
    spec = {"op": "aten::convolution_backward", "args": [expanded, cl, weight, *({"value": v} for v in values)]}
    call = build_call(spec, torch.device("cpu"), float32=False)
    grads = call()
    assert [g.shape for g in grads] == [(8, 32, 4, 4), (10, 32, 4, 4), (10,)] and grads[0].dtype == torch.bfloat16
    monkeypatch.setattr(dtype_probe, "BUDGET_S", 0.0)
    assert float32_probe(torch.device("cpu"))(spec) is None  # budget spent: nothing runs

