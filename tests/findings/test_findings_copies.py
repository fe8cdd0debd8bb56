"""Which copies are the user's to fix (implicit-copy, contiguous-call) and which are torch's own kernel
at work (kernel-copy): the layouts each op family accepts, a recorded AVX2 trace in which oneDNN's
convolution_backward copies a channels_last net's weight gradient, variants of that trace with one input
put in a layout the convolution does not prefer, and live profiles whose copies are the user's on every
CPU (a convolution over a strided slice, a linear layer over a permuted tensor)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from conftest import EXAMPLES, REPO, line_of, run_cli, share_gates_off, write_model
from opscope.analysis.trace_file import analyze_trace_file
from opscope.capture.torch_profiler import profile_target
from opscope.findings import Context, run_rules
from opscope.findings.copies import all_copies, layout_family, preferred_layout
from opscope.findings.layout import Tensor
from opscope.machine.peaks import Peaks
from opscope.target.specs import ProfileOptions

AVX2_CL_TRAIN = REPO / "tests" / "fixtures" / "cpu_traces" / "avx2_channels_last_after_train.json.gz"
USER_COPY_RULES = {"implicit-copy", "contiguous-call"}
OWN_BUFFER = (1, 10, 10240, 320)  # oneDNN's AVX2 weight-gradient buffer for the [10, 32, 32, 32] head conv


def t(shape, stride) -> Tensor:
    return Tensor(tuple(shape), "float", tuple(stride))


def test_op_families():
    assert [layout_family(op) for op in ("aten::conv2d", "aten::_convolution", "aten::mkldnn_convolution",
                                         "aten::convolution_backward", "aten::cudnn_convolution")] == ["conv"] * 5
    assert layout_family("aten::_convert_indices_from_coo_to_csr") == ""
    assert [layout_family(op) for op in ("aten::mm", "aten::addmm", "aten::linear", "aten::bmm")] == ["matmul"] * 4
    assert layout_family("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"
    assert layout_family("aten::reshape") == layout_family("aten::add") == ""


def test_preferred_layouts():
    nchw, cl = t([8, 16, 4, 5], [320, 20, 5, 1]), t([8, 16, 4, 5], [320, 1, 80, 16])
    cl3d = t([2, 3, 4, 5, 6], [360, 1, 90, 18, 3])
    permuted = t([8, 16, 4, 5], [320, 20, 1, 4])  # memory order N, C, W, H
    sliced = t([8, 16, 4, 5], [640, 40, 10, 2])  # x[..., ::2]
    assert all(preferred_layout(x, "conv") for x in (nchw, cl, cl3d))
    assert not any(preferred_layout(x, "conv") for x in (permuted, sliced))
    assert preferred_layout(t([8, 1, 4, 5], [20, 7, 5, 1]), "conv")  # size-1 dims' strides do not matter
    # matmul: contiguous or transposed in the last two dims; any other permutation is not
    assert preferred_layout(t([4, 64, 32], [2048, 32, 1]), "matmul")
    assert preferred_layout(t([4, 64, 32], [2048, 1, 64]), "matmul")
    assert not preferred_layout(t([4, 64, 32], [32, 128, 1]), "matmul")  # [t, b, d] view of [b, t, d]
    # attention: [b, h, t, d] views of [b, t, h, d] are read natively; a strided last dim is not
    assert preferred_layout(t([2, 4, 16, 8], [512, 8, 32, 1]), "attention")
    assert not preferred_layout(t([2, 4, 16, 8], [512, 128, 1, 16]), "attention")
    assert not preferred_layout(t([8, 16, 4, 5], []), "conv")  # unknown strides prove nothing


def _derive(dst: Path, new_strides: list[int] | None = None) -> Path:
    """The AVX2 trace, optionally with the head convolution_backward's activation input [8, 32, 32, 32]
    recorded in `new_strides` instead of channels_last."""
    doc = json.loads(gzip.decompress(AVX2_CL_TRAIN.read_bytes()))
    hits = 0
    for e in doc["traceEvents"]:
        args = e.get("args", {})
        if e.get("name") == "aten::convolution_backward" and args.get("Input Dims", [[]])[0] == [8, 10, 1, 1]:
            args["Input Strides"][1] = new_strides
            hits += 1
    assert hits == 2  # one per profiled step
    dst.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return dst


def _context(run) -> Context:
    return Context(ops=run.ops, events=run.events, peaks=Peaks(20.0, {"float32": 1000.0}), gpu=False,
                   source="trace", steps=run.summary["steps"], step_time_us=run.summary["step_time_us"])


def _buffer_copies(run) -> list:
    return [c for c in all_copies(_context(run)) if c.src is not None and c.src.stride == OWN_BUFFER]


@pytest.fixture(scope="module")
def avx2_runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("avx2")
    permuted = _derive(folder / "permuted.json.gz", [32768, 1024, 1, 32])  # N, C, W, H: not a conv layout
    with pytest.MonkeyPatch.context() as mp, share_gates_off():
        mp.setattr("opscope.findings.kernel_copy.MIN_SHARE", 0.0)  # rule logic, not this trace's shares
        return {name: analyze_trace_file(path, out=folder / name, peak_bw=20.0, peak_flops=["1000"])
                for name, path in (("recorded", AVX2_CL_TRAIN), ("permuted", permuted))}


def test_avx2_conv_backward_copies_are_the_kernels_own(avx2_runs):
    run = avx2_runs["recorded"]
    assert not [f for f in run.findings if f["rule"] in USER_COPY_RULES]
    (copy,) = _buffer_copies(run)[:1]
    assert copy.kind == "internal" and copy.parent_name == "aten::convolution_backward" and copy.backward
    (note,) = [f for f in run.findings if f["rule"] == "kernel-copy"]
    assert note["severity"] == "low" and note["est_savings_us"] is None
    assert note["op"] == "aten::convolution_backward"
    assert "torch's aten::convolution_backward kernel in the backward pass" in note["message"]
    assert "strides [1, 10, 10240, 320]" in note["message"] and "channels_last" in note["message"]
    # the note covers the weight-gradient copies of every convolution_backward (buffer -> NCHW -> channels_last)
    internal = [c for c in all_copies(_context(run)) if c.kind == "internal"]
    assert {c.parent_name for c in internal} == {"aten::convolution_backward"}
    assert f"{len(internal) / 2:g} copies per step" in note["message"]


def test_a_non_preferred_input_makes_the_copy_the_users_again(avx2_runs):
    run = avx2_runs["permuted"]
    copies = _buffer_copies(run)
    assert copies and all(c.kind == "implicit" for c in copies)
    (f,) = [f for f in run.findings if f["rule"] == "implicit-copy" and "10240" in f["message"]]
    assert f["op"] == "aten::convolution_backward"


def test_kernel_copy_note_needs_a_real_share(avx2_runs):
    run = avx2_runs["recorded"]
    internal = sum(c.time_us for c in all_copies(_context(run)) if c.kind == "internal")
    share = internal / float(run.to_pandas()["time_us_total"].sum())
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("opscope.findings.kernel_copy.MIN_SHARE", share * 0.999)
        assert run_rules(_context(run), only=["kernel-copy"])
        mp.setattr("opscope.findings.kernel_copy.MIN_SHARE", share * 1.001)
        assert not run_rules(_context(run), only=["kernel-copy"])


USER_COPIES = '''
import torch
import torch.nn as nn


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(16, 16, 3, padding=1)
        self.lin = nn.Linear(64, 64)

    def forward(self, x, y):
        a = self.conv(x[:, :, :, ::2])  # SLICE
        b = self.lin(y.permute(1, 0, 2))  # PERMUTE
        c = torch.bmm(y.permute(1, 2, 0), y.permute(1, 0, 2))  # BMM
        return a, b, c


def get_model():
    return M()


def get_inputs():
    return [torch.randn(8, 16, 32, 64), torch.randn(32, 16, 64)]
'''


@pytest.mark.parametrize("mode", ["inference", "train"])
def test_user_caused_copies_inside_compute_ops_still_fire(tmp_path, mode):
    path = write_model(tmp_path, USER_COPIES)
    opts = ProfileOptions(target=path, out=tmp_path / "run", steps=1, warmup=1, peak_bw=20.0,
                          peak_flops=["1000"], mode=mode)
    with share_gates_off():
        run, _ = profile_target(opts)
    hits = [f for f in run.findings if f["rule"] == "implicit-copy" and "backward" not in f["message"]]
    where = {f["source_location"].rsplit("/", 1)[-1]: f for f in hits}
    # the convolution gets a strided slice: _convolution makes it contiguous (every CPU and GPU path)
    slice_hit = where[f"{path.name}:{line_of(path, '# SLICE')}"]
    assert "strides [32768, 2048, 64, 2]" in slice_hit["message"] and "conv" in slice_hit["op"]
    # linear over a [t, b, d] view folds it with reshape, which must copy
    assert where[f"{path.name}:{line_of(path, '# PERMUTE')}"]["op"] == "aten::reshape"
    # bmm reads operands transposed in their last two dims as they are: no copy at all
    assert f"{path.name}:{line_of(path, '# BMM')}" not in where


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["inference", "train"])
def test_channels_last_example_stays_clean_on_avx2(tmp_path, mode, monkeypatch):
    """Forcing oneDNN and ATen onto their AVX2 paths makes this deterministic on AVX2 and AVX-512 CPUs."""
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    res = run_cli("profile", str(EXAMPLES / "findings" / "channels_last_after.py"), "--mode", mode,
                  "--steps", "1", "--warmup", "1", "--peak-bw", "20", "--peak-flops", "1000",
                  "--out", str(tmp_path / "run"))
    assert res.returncode == 0, res.stderr
    findings = json.loads((tmp_path / "run" / "findings.json").read_text())
    assert not [f for f in findings if f["rule"] in USER_COPY_RULES | {"channels-last"}], findings
    assert all(f["severity"] == "low" for f in findings if f["rule"] == "kernel-copy")
