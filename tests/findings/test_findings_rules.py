"""Findings rules on real CPU profiles: each rule fires at the exact source line of a small model built to
trip it, and stays silent on clean models (an MLP, a channels_last conv net) in inference and in
`--mode train`, where opscope's own harness (loss, backward seed, SGD) adds ops of its own.

Profiles are module-scoped (one per model and mode) and use peak overrides, so no calibration runs.
The layout probe is replaced by a deterministic stub (channels_last "twice as fast") wherever a rule's
decision would otherwise depend on timing; test_real_probe_measures_the_captured_conv checks the real one.
For the same reason the profiles run with the rules' time-share gates off (conftest.share_gates_off), and
test_share_gates_drop_small_findings checks those gates on exact numbers.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import opscope.capture.torch_profiler as tp
from conftest import EXAMPLES, SHARE_GATED_RULES, line_of, share_gates_off, write_model
from opscope.capture.torch_profiler import profile_target
from opscope.findings import RULES, Context, run_rules
from opscope.findings.fusion import pattern_for
from opscope.machine.peaks import Peaks
from opscope.sources import HARNESS
from opscope.target.specs import ProfileOptions
from opscope.units import duration as fmt_us

LAYOUT_RULES = {"implicit-copy", "contiguous-call", "channels-last", "dtype-conversion", "strided-reduction"}
PEAK_BW = 20.0
PEAK_FLOPS = "1000"  # ridge 50 FLOP/B: element-wise ops are memory-bound whatever their FLOP count

BAD = '''
import torch
import torch.nn as nn


class Bad(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(64, 192)
        self.fc = nn.Linear(256, 1024, bias=False)
        self.bias = nn.Parameter(torch.zeros(1024))
        self.mix = nn.Conv2d(16, 16, 3, padding=1)
        self.conv = nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x, s, z, img):
        b, t, _ = x.shape
        h = 4
        q = self.qkv(x)[..., :64].reshape(b, t, h, 16)
        q = q.transpose(1, 2).reshape(b * h, t, -1)  # IMPLICIT
        st = s.transpose(1, 2).contiguous()  # CONTIGUOUS
        w = st + s.transpose(1, 2)  # STRIDED
        d = s.to(torch.float64)  # DTYPE
        sm = torch.softmax(s, dim=1)  # SOFTMAX
        u = torch.tanh(self.fc(z) + self.bias) * 2.0  # FUSION
        y = img.contiguous(memory_format=torch.channels_last)  # PING1
        y = self.mix(y)
        y = y.contiguous()  # PING2
        y = y.contiguous(memory_format=torch.channels_last)  # PING3
        y = y.contiguous()  # PING4
        c = self.conv(img)  # CONV
        return q, w, d, sm, u, y, c


def get_model():
    torch.manual_seed(0)
    return Bad()


def get_inputs():
    return [torch.randn(8, 512, 64), torch.randn(16, 256, 128), torch.randn(512, 256), torch.randn(8, 16, 32, 32)]
'''

TINY_OPS = '''
import torch
import torch.nn as nn


class Tiny(nn.Module):
    def forward(self, x):
        for _ in range(100):
            x = x.view(-1)[:64].view(8, 8) + 1  # LOOP
        return x


def get_model():
    return Tiny()


def get_inputs():
    return [torch.randn(8, 8)]
'''


REAL_PROBE = tp.layout_probe_for


class StubProbe:
    """Stands in for opscope.capture.layout_probe.layout_probe_for: channels_last takes half the time.
    With real=True it also runs the real probe on every spec and keeps its measurements."""

    def __init__(self, real: bool = False) -> None:
        self.real = real
        self.specs: list[dict] = []
        self.measured: list[tuple[float, float] | None] = []

    def __call__(self, device):
        real_probe = REAL_PROBE(device) if self.real else None

        def probe(spec):
            self.specs.append(spec)
            if real_probe is not None:
                self.measured.append(real_probe(spec))
            return (200.0, 100.0)

        return probe


def profile(path: Path, out: Path, mode: str = "inference", probe: StubProbe | None = None,
            peak_bw: float = PEAK_BW):
    opts = ProfileOptions(target=path, out=out, steps=2, warmup=1, peak_bw=peak_bw, peak_flops=[PEAK_FLOPS],
                          mode=mode)
    with pytest.MonkeyPatch.context() as mp, share_gates_off():
        if probe is not None:
            mp.setattr(tp, "layout_probe_for", probe)
        run, _ = profile_target(opts)
    return run


def rules_context(run, peak_bw: float = 100.0, layout_probe=None) -> Context:
    """A fresh Context over a profiled run's tables, to rerun rules on it (rules cache derived tables
    on their Context, so each rerun needs its own)."""
    return Context(ops=run.ops, events=run.events, peaks=Peaks(peak_bw, {"float32": 1000.0}), gpu=False,
                   source="profile", steps=2, step_time_us=run.summary["step_time_us"], layout_probe=layout_probe)


def at(findings: list[dict], rule: str, path: Path, needle: str) -> list[dict]:
    where = f"{path.name}:{line_of(path, needle)}"
    return [f for f in findings if f["rule"] == rule and f["source_location"].endswith(where)]


def one(findings: list[dict], rule: str, path: Path, needle: str) -> dict:
    hits = at(findings, rule, path, needle)
    assert len(hits) == 1, (needle, [f for f in findings if f["rule"] == rule])
    return hits[0]


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bad")
    path = write_model(folder, BAD)
    probe = StubProbe()
    # A generous bandwidth peak: memory-bound ops of a 2-core CPU stay far under 70 % of it, so the
    # bandwidth-gated rules (low-bandwidth, strided-reduction) fire however fast this machine is.
    return path, profile(path, folder / "run", probe=probe, peak_bw=100.0), probe


@pytest.fixture(scope="module")
def clean_runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clean")
    runs = {}
    for name, path in (("mlp", EXAMPLES / "mlp.py"), ("cl", EXAMPLES / "findings" / "channels_last_after.py")):
        for mode in ("inference", "train"):
            runs[(name, mode)] = profile(path, folder / f"{name}-{mode}", mode=mode, probe=StubProbe())
    return runs


# --- firing at the exact line ----------------------------------------------------------------------

def test_implicit_copy_names_the_reshape_line_with_bytes_and_time(bad):
    path, run, _ = bad
    f = one(run.findings, "implicit-copy", path, "# IMPLICIT")
    assert f["op"] == "aten::reshape"
    # [8, 4, 512, 16] float32 = 1 MiB read + 1 MiB written per copy
    assert "2 MiB moved per copy" in f["message"] and f"{fmt_us(f['est_savings_us'])} in all" in f["message"]
    assert f["est_savings_us"] > 0
    # the ops table has the copy at that line, and the saving is exactly its time
    ops = run.to_pandas()[run.to_pandas()["source_location"] == f["source_location"]]
    copy = ops[ops["op"] == "aten::copy_"]
    assert copy["bytes_per_call"].iloc[0] == 2 * 1024 * 1024
    clone = ops[ops["op"].isin(["aten::clone", "aten::empty_like", "aten::empty", "aten::copy_"])]
    assert f["est_savings_us"] == pytest.approx(clone["time_us_total"].sum(), rel=1e-3)


def test_contiguous_call_fires_on_the_explicit_copy_only(bad):
    path, run, _ = bad
    hit = one(run.findings, "contiguous-call", path, "# CONTIGUOUS")
    assert hit["op"] == "aten::contiguous" and "4 MiB moved per call" in hit["message"]
    # format conversions (.contiguous(memory_format=...)) belong to the ping-pong finding, not here
    assert all(f["source_location"] == hit["source_location"]
               for f in run.findings if f["rule"] == "contiguous-call")


def test_dtype_conversion_reports_bytes(bad):
    path, run, _ = bad
    hit = one(run.findings, "dtype-conversion", path, "# DTYPE")
    assert "float32 -> float64" in hit["message"] and "6 MiB moved per call" in hit["message"]


def test_strided_reduction_on_softmax_over_dim_1(bad):
    path, run, _ = bad
    hit = one(run.findings, "strided-reduction", path, "# SOFTMAX")
    assert hit["op"] == "aten::_softmax" and "dim [1]" in hit["message"]


def test_low_bandwidth_names_the_strided_input(bad):
    path, run, _ = bad
    hit = one(run.findings, "low-bandwidth", path, "# STRIDED")
    assert hit["op"] == "aten::add" and "read against its memory layout" in hit["message"]


def test_fusion_bias_add_chain(bad):
    path, run, _ = bad
    f = one(run.findings, "fusion", path, "# FUSION")
    assert "add" in f["message"] and "tanh" in f["message"] and "mul" in f["message"]
    assert "torch.compile" in f["suggestion"]
    # two [512, 1024] float32 intermediates (add's and tanh's output), each written and read once
    assert "8 MiB of intermediate" in f["message"]


def test_channels_last_probe_decides_and_ping_pong(bad):
    path, run, probe = bad
    hit = one(run.findings, "channels-last", path, "# CONV")
    assert hit["op"] == "aten::convolution" and hit["est_savings_us"] > 0 and "50% faster" in hit["message"]
    # the probe was asked about the NCHW conv only (the other one is fed channels_last)
    assert [s["input"] for s in probe.specs] == [[8, 16, 32, 32]]
    assert probe.specs[0]["weight"] == [16, 16, 3, 3] and probe.specs[0]["padding"] == [1, 1]
    for tag in ("# PING1", "# PING2", "# PING3", "# PING4"):
        assert "ping-pong" in one(run.findings, "channels-last", path, tag)["message"]
    # the conversions are not reported a second time as explicit .contiguous() calls
    assert not at(run.findings, "contiguous-call", path, "# PING2")


def test_channels_last_needs_a_real_gain(bad):
    path, run, _ = bad
    ctx = rules_context(run, layout_probe=lambda spec: (100.0, 95.0))  # 5 % faster: below the 10 % bar
    assert not [f for f in run_rules(ctx, only=["channels-last"]) if "conv2d" in f["message"]]
    ctx.layout_probe = lambda spec: None  # cannot measure: no finding, no guess on a CPU
    assert not [f for f in run_rules(ctx, only=["channels-last"]) if "conv2d" in f["message"]]


@pytest.mark.parametrize("module", SHARE_GATED_RULES)
def test_share_gates_drop_small_findings(bad, module, monkeypatch):
    _, run, _ = bad
    rule_module = importlib.import_module(f"opscope.findings.{module}")
    name = module.replace("_", "-")

    def findings(min_share: float) -> list[dict]:
        monkeypatch.setattr(rule_module, "MIN_SHARE", min_share)
        return run_rules(rules_context(run, layout_probe=lambda spec: (200.0, 100.0)), only=[name])

    found = findings(0.0)
    assert found, f"{name} fires on the bad model"
    total = float(run.to_pandas()["time_us_total"].sum())
    # a finding's estimated saving is the quantity its gate compares with MIN_SHARE x total op time
    shares = sorted(f["est_savings_us"] / total for f in found)
    assert len(findings(shares[0] * 0.999)) == len(found)
    assert len(findings(shares[0] * 1.001)) == len(found) - shares.count(shares[0])
    assert not findings(shares[-1] * 1.001)


def test_real_probe_measures_the_captured_conv(tmp_path):
    probe = StubProbe(real=True)
    path = EXAMPLES / "findings" / "channels_last_before.py"
    run = profile(path, tmp_path / "run", probe=probe)
    assert len(probe.specs) == 4  # every NCHW conv of the net, forward only
    assert all(m is not None and m[0] > 0 and m[1] > 0 for m in probe.measured)
    assert len([f for f in run.findings if f["rule"] == "channels-last"]) == 4


def test_overhead_fires_on_many_tiny_ops(tmp_path):
    path = write_model(tmp_path, TINY_OPS)
    run = profile(path, tmp_path / "run")
    hits = [f for f in run.findings if f["rule"] == "overhead"]
    assert len(hits) == 1
    assert hits[0]["source_location"].endswith(f"{path.name}:{line_of(path, '# LOOP')}")
    assert "ops per step" in hits[0]["message"] and "torch.compile" in hits[0]["suggestion"]


# --- clean models and the harness ------------------------------------------------------------------

@pytest.mark.parametrize("model", ["mlp", "cl"])
@pytest.mark.parametrize("mode", ["inference", "train"])
def test_clean_models_have_no_layout_findings(clean_runs, model, mode):
    run = clean_runs[(model, mode)]
    layout = [f for f in run.findings if f["rule"] in LAYOUT_RULES]
    assert not layout, layout
    # low-bandwidth may fire on a slow kernel, but never blames the layout
    assert not [f for f in run.findings if f["rule"] == "low-bandwidth" and "likely cause" in f["message"]]
    assert not [f for f in run.findings if f["rule"] in ("fusion", "overhead") and model == "mlp"]


def test_harness_ops_never_produce_findings(clean_runs):
    run = clean_runs[("mlp", "train")]
    ev = run.to_pandas("events")
    harness = ev[ev["source_location"] == HARNESS]
    assert len(harness) and {"aten::sum", "aten::add_"} <= set(harness["name"])  # loss and SGD are there
    assert all(f["source_location"] != HARNESS for f in run.findings)
    ctx = rules_context(run, peak_bw=PEAK_BW)
    raw = [f for name, fn in RULES.items() for f in fn(ctx)]
    assert all(f.source_location != HARNESS for f in raw)  # not even before run_rules filters them


def test_gpu_rules_stay_silent_on_cpu(bad):
    _, run, _ = bad
    assert not [f for f in run.findings
                if f["rule"] in ("launch-bound", "gemm-alignment", "fp32-gemm", "host-sync")]


def test_findings_are_ranked_and_well_formed(bad):
    _, run, _ = bad
    savings = [f["est_savings_us"] for f in run.findings if f["est_savings_us"] is not None]
    assert savings == sorted(savings, reverse=True)
    for f in run.findings:
        assert f["severity"] in ("high", "medium", "low")
        assert set(f) == {"rule", "severity", "op", "source_location", "message", "suggestion", "est_savings_us",
                          "module", "id", "critical_path_saving_us"}
        assert f["message"] and f["suggestion"]


@pytest.mark.parametrize(("chain", "gelu"), [
    (["mul", "pow", "mul", "add", "mul", "tanh", "add", "mul"], True),               # the cube as pow(h, 3)
    (["mul", "mul", "mul", "mul", "add", "mul", "tanh", "add", "mul"], True),        # the cube as h * h * h
    (["add", "tanh", "mul"], False),                                                 # tanh(x + b) * 2
    (["sigmoid", "sigmoid", "tanh", "sigmoid", "mul", "mul", "add", "tanh", "mul"], False),  # an LSTM cell
])
def test_hand_written_tanh_gelu_is_told_by_its_ops_in_order(chain, gelu):
    label, suggestion = pattern_for(set(chain), chain)
    assert ("hand-written GELU (tanh)" in label) is gelu
    assert ("approximate='tanh'" in suggestion) is gelu
