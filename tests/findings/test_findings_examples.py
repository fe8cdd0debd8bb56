"""The before/after pairs under examples/findings/: the "before" file gets the finding at the line the
docstring names, the "after" file (that line fixed) does not, and the copy/conversion/element-wise ops
the finding was about are gone from the ops table. Checks ops and bytes, never timings: the layout
probe is a stub (channels_last twice as fast) and the rules' time-share gates are off, so only the
layout itself decides."""

from __future__ import annotations

from pathlib import Path

import pytest

import opscope.capture.torch_profiler as tp
from conftest import EXAMPLES, PEAKS, line_of, run_cli, share_gates_off
from opscope.capture.torch_profiler import profile_target
from opscope.sources import HARNESS
from opscope.target.specs import ProfileOptions

PAIRS = EXAMPLES / "findings"
COPY_OPS = {"aten::clone", "aten::contiguous", "aten::copy_", "aten::_to_copy"}


def _stub_probe(device):
    return lambda spec: (200.0, 100.0)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("examples")
    out = {}
    with pytest.MonkeyPatch.context() as mp, share_gates_off():
        mp.setattr(tp, "layout_probe_for", _stub_probe)
        for path in sorted(PAIRS.glob("*_before.py")) + sorted(PAIRS.glob("*_after.py")):
            opts = ProfileOptions(target=path, out=folder / path.stem, steps=2, warmup=1, peak_bw=20.0,
                                  peak_flops=["1000"], mode="inference")
            out[path.stem], _ = profile_target(opts)
    return out


def findings(run, rule: str) -> list[dict]:
    return [f for f in run.findings if f["rule"] == rule]


def user_rows(run):
    return run.to_pandas()[run.to_pandas()["source_location"] != HARNESS]


def loc(path: Path, needle: str) -> str:
    return f"{path.name}:{line_of(path, needle)}"


def test_every_example_has_its_partner():
    before = {p.name.removesuffix("_before.py") for p in PAIRS.glob("*_before.py")}
    after = {p.name.removesuffix("_after.py") for p in PAIRS.glob("*_after.py")}
    assert before == after == {"channels_last", "transpose_copy", "fused_gelu"}


def test_transpose_copy(runs):
    before, after = runs["transpose_copy_before"], runs["transpose_copy_after"]
    path = PAIRS / "transpose_copy_before.py"
    hits = findings(before, "implicit-copy")
    wanted = {loc(path, f"{v} = {v}.transpose(1, 2).reshape") for v in "qkv"} | {loc(path, "o.transpose(1, 2)")}
    assert {f["source_location"].split("/")[-1] for f in hits} == wanted
    for f in hits:
        assert f["op"] == "aten::reshape" and "2 MiB moved per copy" in f["message"]
    # the copies are real rows of the table, each [8, 8, 128, 32] float32: 1 MiB read + 1 MiB written
    rows = user_rows(before)
    clones = rows[rows["op"] == "aten::clone"]
    assert len(clones) == 4
    copies = rows[(rows["op"] == "aten::copy_") & rows["source_location"].isin(clones["source_location"])
                  & ~rows["input_strides"].str.contains(r"\[0, 1\]")]  # (not the out-projection's bias)
    assert len(copies) == 4 and (copies["bytes_per_call"] == 2 * 1024 * 1024).all()
    # fixed: no implicit copy, no clone, and the only copy_ left is addmm writing its bias into the output
    assert not findings(after, "implicit-copy")
    rows = user_rows(after)
    assert not (rows["op"] == "aten::clone").any()
    left = rows[rows["op"].isin(COPY_OPS)]
    assert set(left["op"]) <= {"aten::copy_"} and left["input_strides"].str.contains(r"\[0, 1\]").all()
    assert left["bytes_per_call"].sum() < copies["bytes_per_call"].sum()


def test_backward_copies_point_at_the_forward_line(tmp_path):
    path = PAIRS / "transpose_copy_before.py"
    opts = ProfileOptions(target=path, out=tmp_path / "run", steps=1, warmup=1, peak_bw=20.0,
                          peak_flops=["1000"], mode="train")
    with share_gates_off():  # these copies are ~0.2 % of a noisy train step, near implicit-copy's gate
        run, _ = profile_target(opts)
    # `.view(b, self.h, t, -1)` never copies going forward; its gradient arrives transposed and is copied
    view_line = loc(path, "torch.bmm(att, v).view(")
    (f,) = [f for f in findings(run, "implicit-copy") if f["source_location"].endswith(view_line)]
    assert "in the backward pass of this line" in f["message"]
    fwd = {f["source_location"].split("/")[-1] for f in findings(run, "implicit-copy") if "backward" not in f["message"]}
    assert loc(path, "q = q.transpose(1, 2).reshape") in fwd


def test_fused_gelu(runs):
    before, after = runs["fused_gelu_before"], runs["fused_gelu_after"]
    path = PAIRS / "fused_gelu_before.py"
    (f,) = findings(before, "fusion")
    assert f["source_location"].endswith(loc(path, "torch.tanh"))
    assert "hand-written GELU (tanh)" in f["message"] and "approximate='tanh'" in f["suggestion"]
    gelu_line = before.to_pandas()[before.to_pandas()["source_location"] == f["source_location"]]
    assert {"aten::tanh", "aten::pow", "aten::mul", "aten::add"} <= set(gelu_line["op"])
    assert not findings(after, "fusion")
    rows = user_rows(after)
    assert "aten::gelu" in set(rows["op"]) and not ({"aten::tanh", "aten::pow"} & set(rows["op"]))

    def elementwise_bytes(run):
        r = user_rows(run)
        r = r[r["family"] == "elementwise"]
        return float((r["bytes_per_call"] * r["calls"]).sum())

    # eight passes over the [512, 1024] activation become one
    assert elementwise_bytes(after) * 4 < elementwise_bytes(before)


def test_channels_last(runs):
    before, after = runs["channels_last_before"], runs["channels_last_after"]
    path = PAIRS / "channels_last_before.py"
    hits = findings(before, "channels-last")
    wanted = {loc(path, f"self.{c}(x)") for c in ("c1", "c2", "c3", "head")}
    assert {f["source_location"].split("/")[-1] for f in hits} == wanted
    conv_in = before.to_pandas()[before.to_pandas()["op"] == "aten::convolution"]["input_strides"]
    assert conv_in.str.startswith("[[12288, 4096, 64, 1]").any()  # NCHW [8, 3, 64, 64]
    assert not findings(after, "channels-last")
    conv_in = after.to_pandas()[after.to_pandas()["op"] == "aten::convolution"]["input_strides"]
    assert conv_in.str.startswith("[[12288, 1, 192, 3]").any()  # channels_last [8, 3, 64, 64]
    # no layout conversion anywhere in the fixed net
    assert not (user_rows(after)["op"].isin(COPY_OPS - {"aten::copy_"})).any()


def test_examples_work_with_the_cli(tmp_path):
    path = PAIRS / "transpose_copy_before.py"
    res = run_cli("profile", str(path), *PEAKS, "--steps", "1", "--warmup", "1", "--out", str(tmp_path / "run"))
    assert res.returncode == 0, res.stderr
    assert "implicit-copy" in res.stdout
