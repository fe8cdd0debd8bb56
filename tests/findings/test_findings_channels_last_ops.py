"""channels-last beyond convolutions: pooling, batch norm and upsampling fed NCHW are timed in both layouts
by the layout probe, like convolutions, and one channels-last finding per op replaces low-bandwidth's
"no layout cause". The decisions are tested on given probe numbers (a stub), the real probe on what is
robust whatever the CPU (it runs every kind and returns two timings; a finding exactly where its numbers
clear the bar)."""

from __future__ import annotations

import pytest
import torch
from test_findings_rules import StubProbe, profile, rules_context

from conftest import line_of, share_gates_off, write_model
from opscope.capture.layout_probe import CALLS, measure
from opscope.findings import run_rules
from opscope.findings.channels_last import MIN_GAIN, MIN_US_PER_STEP

LAYERS = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Layers(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(32).eval()
        self.pool = nn.MaxPool2d(2)

    def forward(self, x):
        a = self.pool(x)  # MAXPOOL
        b = F.avg_pool2d(x, 3, 2, 1)  # AVGPOOL
        c = self.bn(x)  # BATCHNORM
        d = F.interpolate(x, scale_factor=2)  # NEAREST
        e = F.interpolate(x, size=(40, 48), mode="bilinear")  # BILINEAR
        f = F.adaptive_avg_pool2d(x, 4)  # ADAPTIVE
        return a, b, c, d, e, f


def get_model():
    return Layers()


def get_inputs():
    return [torch.randn(8, 32, 32, 32)]
'''

pytestmark = pytest.mark.slow  # one profile (about 10 s on a loaded 2-core machine) and real probe runs

# what the probe is asked at each line (besides input [8, 32, 32, 32], float32)
EXPECTED = {
    "# MAXPOOL": ("aten::max_pool2d", {"op": "max_pool2d", "kernel": [2, 2], "stride": [2, 2], "padding": [0, 0],
                                      "dilation": [1, 1], "ceil_mode": False}),
    "# AVGPOOL": ("aten::avg_pool2d", {"op": "avg_pool2d", "kernel": [3, 3], "stride": [2, 2], "padding": [1, 1],
                                      "ceil_mode": False, "count_include_pad": True}),
    "# BATCHNORM": ("aten::batch_norm", {"op": "batch_norm", "training": False, "params_dtype": "float32"}),
    "# NEAREST": ("aten::upsample_nearest2d", {"op": "upsample", "mode": "nearest", "output_size": [64, 64]}),
    "# BILINEAR": ("aten::upsample_bilinear2d", {"op": "upsample", "mode": "bilinear", "output_size": [40, 48],
                                                "align_corners": False}),
    "# ADAPTIVE": ("aten::adaptive_avg_pool2d", {"op": "adaptive_avg_pool2d", "output_size": [4, 4]}),
}


@pytest.fixture(scope="module")
def layers(tmp_path_factory):
    folder = tmp_path_factory.mktemp("layers")
    path = write_model(folder, LAYERS)
    probe = StubProbe()  # channels_last twice as fast, for every spec
    return path, profile(path, folder / "run", probe=probe, peak_bw=100.0), probe


def _at(findings: list[dict], path, tag: str, rule: str | None = None) -> list[dict]:
    where = f"{path.name}:{line_of(path, tag)}"
    return [f for f in findings if f["source_location"].endswith(where) and rule in (None, f["rule"])]


def test_the_probe_is_asked_about_each_op_with_its_arguments(layers):
    _, _, probe = layers
    asked = [s for s in probe.specs if s["op"] != "conv2d"]
    for _, want in EXPECTED.values():
        hits = [s for s in asked if all(s.get(k) == v for k, v in want.items())]
        assert len(hits) == 1, (want, asked)
        assert hits[0]["input"] == [8, 32, 32, 32] and hits[0]["dtype"] == "float32"
    assert len(asked) == len(EXPECTED)  # once per op: max_pool2d's inner max_pool2d_with_indices is not asked again


def test_each_op_faster_in_channels_last_is_one_channels_last_finding(layers):
    path, run, _ = layers
    for tag, (op, _) in EXPECTED.items():
        hits = _at(run.findings, path, tag)
        # one cause, one finding: not also low-bandwidth's "no layout cause" (and its jemalloc advice)
        assert [f["rule"] for f in hits] == ["channels-last"], (tag, hits)
        f = hits[0]
        assert f["op"] == op and "runs in NCHW" in f["message"] and "50% faster" in f["message"]
        assert "channels_last" in f["suggestion"] and "jemalloc" not in f["suggestion"]
        assert f["est_savings_us"] > 0


def test_no_gain_no_finding_and_no_probe_no_guess(layers):
    path, run, _ = layers
    # 5 % faster: under the 10 % bar; 50 % faster but 4 µs per step (1 call per step): under 5 µs; cannot measure
    for probe in (lambda spec: (100.0, 95.0), lambda spec: (8.0, 4.0), lambda spec: None):
        ctx = rules_context(run, layout_probe=probe)
        with share_gates_off():
            found = run_rules(ctx, only=["channels-last", "low-bandwidth"])
        for tag in EXPECTED:
            assert not _at(found, path, tag, "channels-last")


def test_without_a_probe_low_bandwidth_names_the_nchw_layout(layers):
    """`analyze` has no probe: a slow NCHW pooling op is still low-bandwidth, but with NCHW named as the
    possible cause and the channels_last suggestion, not "no layout cause" and a caching malloc."""
    path, run, _ = layers
    ctx = rules_context(run)  # the profile's 100 GB/s: far above what a 2-core CPU reaches
    with share_gates_off():
        found = run_rules(ctx, only=["low-bandwidth"])
    hits = _at(found, path, "# MAXPOOL", "low-bandwidth")
    assert len(hits) == 1
    assert "input is NCHW" in hits[0]["message"] and "no layout cause" not in hits[0]["message"]
    assert "channels_last" in hits[0]["suggestion"] and "jemalloc" not in hits[0]["suggestion"]


def test_the_real_probe_runs_every_kind(layers):
    _, _, probe = layers
    for spec in probe.specs:
        measured = measure(spec, torch.device("cpu"))
        assert measured is not None and measured[0] > 0 and measured[1] > 0, spec
    assert {s["op"] for s in probe.specs} | {"conv2d", "adaptive_max_pool2d"} == set(CALLS)


def test_the_real_probe_decides_as_its_numbers_say(layers):
    """Whatever this CPU measures, a finding appears exactly where channels_last cleared the bar."""
    path, run, _ = layers
    measured: dict[str, tuple[float, float] | None] = {}

    def probe(spec):
        measured[spec["op"] + repr(spec.get("mode"))] = result = measure(spec, torch.device("cpu"))
        return result

    ctx = rules_context(run, layout_probe=probe)
    with share_gates_off():
        found = run_rules(ctx, only=["channels-last"])
    for tag, (_, want) in EXPECTED.items():
        t = measured[want["op"] + repr(want.get("mode"))]
        assert t is not None
        faster = t[1] < (1 - MIN_GAIN) * t[0] and (t[0] - t[1]) * 1 >= MIN_US_PER_STEP  # 2 steps, 2 calls
        assert bool(_at(found, path, tag, "channels-last")) == faster, (tag, t)
