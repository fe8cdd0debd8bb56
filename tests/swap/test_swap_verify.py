"""The numbers verification reports, against hand-computed values; the inputs it runs on; the tolerance
it uses; and the swap candidates a run lists (catalog) and the fusion finding names."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import TESTS, load_fixture
from opscope.capture.harness import Harness
from opscope.findings.fusion import pattern_for
from opscope.kernels import catalog
from opscope.run import schema
from opscope.swap import apply, tolerance, verify
from opscope.swap.tolerance import Tol, compare_tensor
from opscope.target.model_file import load_target

FIXTURES = TESTS / "fixtures" / "swap"


def test_compare_tensor_numbers_by_hand():
    want = torch.tensor([1.0, 2.0, 3.0, 4.0])
    got = torch.tensor([1.0, 2.0, 3.0, 4.1])
    # bound_i = rtol |want_i| + atol rms(want); rms = sqrt(30 / 4) = 2.7386
    d = compare_tensor(got, want, Tol(rtol=0.01, atol=0.0))
    assert d.max_abs == pytest.approx(0.1, rel=1e-6)            # float32 4.1 - 4.0
    assert d.max_rel == pytest.approx(0.1 / 4.0, rel=1e-5)     # normwise: max |diff| / max |want|
    assert (d.out, d.n, d.problem) == (1, 4, "")              # 0.1 > 0.01 * 4 = 0.04
    d = compare_tensor(got, want, Tol(rtol=0.01, atol=0.03))  # 0.04 + 0.03 * 2.7386 = 0.122 > 0.1
    assert (d.out, d.problem) == (0, "")
    d = compare_tensor(got, want, Tol(rtol=0.01, atol=0.02))  # 0.04 + 0.0548 = 0.0948 < 0.1
    assert d.out == 1


def test_compare_tensor_guards_and_mismatches():
    want = torch.tensor([1.0, -2.0, 3.0])
    tol = Tol(1.0, 1.0)  # loose enough that only the guard can fail these
    assert "all zeros" in compare_tensor(torch.zeros(3), want, tol).problem
    assert "NaN or Inf" in compare_tensor(torch.tensor([1.0, math.nan, 3.0]), want, tol).problem
    assert "constant" in compare_tensor(torch.full((3,), 0.5), want, tol).problem
    assert "shape [1, 3]" in compare_tensor(want.view(1, 3), want, tol).problem
    assert "dtype float64" in compare_tensor(want.double(), want, tol).problem
    assert compare_tensor(None, want, tol).problem == "missing (None)"
    same_nan = torch.tensor([1.0, math.nan, math.inf])
    d = compare_tensor(same_nan.clone(), same_nan, Tol(0.0, 0.0))  # NaN where NaN, inf where inf: equal
    assert (d.out, d.max_abs, d.problem) == (0, 0.0, "")


def test_tolerance_is_the_larger_of_the_model_floor_and_the_manifests():
    rms = catalog.find("rms_norm")  # float32: rtol 1e-5, atol 1e-5; bfloat16: 1.6e-2, 2e-2
    assert tolerance.tolerance_for(torch.float32, [rms]) == Tol(2e-4, 2e-5)
    assert tolerance.tolerance_for(torch.bfloat16, [rms]) == Tol(3.2e-2, 2e-2)
    assert tolerance.tolerance_for(torch.float32, [catalog.find("sum")]) == Tol(2e-4, 1e-3)  # sum's atol 1e-3
    assert tolerance.tolerance_for(torch.float16, []) == tolerance.MODEL_TOLERANCE[torch.float16]


def tiny_harness(mode: str = "inference") -> Harness:
    target = load_target(FIXTURES / "tiny_model.py")
    return Harness(target, mode=mode, device=torch.device("cpu"), dtype=None)


def test_seed_zero_is_the_models_own_inputs_and_other_seeds_redraw_floating_tensors():
    h = tiny_harness()
    h.args = (h.args[0], torch.arange(6), torch.full((3,), 2.0))  # an int tensor and a constant one stay
    runner = verify.Runner(h)
    (a0, i0, c0), _ = runner.inputs(0)
    (a1, i1, c1), _ = runner.inputs(1)
    (a1b, _, _), _ = runner.inputs(1)
    assert torch.equal(a0, h.args[0]) and a0 is not h.args[0]
    assert a1.shape == a0.shape and a1.dtype == a0.dtype and not torch.equal(a1, a0)
    assert torch.equal(a1, a1b)  # a seed is the same inputs every time
    assert abs(float(a1.std()) - float(a0.std())) < 0.1 and abs(float(a1.mean()) - float(a0.mean())) < 0.1
    assert torch.equal(i1, torch.arange(6)) and torch.equal(c1, c0)


def test_a_correct_kernel_passes_every_check_in_train_mode():
    kernels = load_fixture(FIXTURES / "kernels.py")

    h = tiny_harness("train")
    runner = verify.Runner(h)
    swap = apply.Builder(h.model, runner.probe_step).user("good_gated", kernels.good_gated, None, "Gated")
    result = verify.verify(swap, runner)
    assert result.passed, [c for c in result.checks if not c.passed]
    names = [c.check for c in result.checks]
    for seed in range(verify.SEEDS):
        assert [c.check for c in result.checks if c.seed == seed] == [
            "outputs", "input gradients", "parameter gradients", "inputs unchanged", "parameters unchanged"]
    assert names[-7:] == ["swap reverted cleanly", *(f"trap: {t}" for t in (
        "arguments unchanged", "device/dtype", "memory reuse", "autograd", "memory growth", "determinism"))]
    grads = next(c for c in result.checks if c.check == "parameter gradients")
    assert grads.tensors == 5 and grads.max_abs_err == 0 and grads.out_of_tolerance == 0
    assert (result.swapped_calls, result.fallback_calls) == (1, 0)


def test_a_kernel_that_adds_a_submodule_fails_and_the_model_is_put_back():
    kernels = load_fixture(FIXTURES / "kernels.py")
    h = tiny_harness()
    names = [n for n, _ in h.model.named_parameters()]
    runner = verify.Runner(h)
    swap = apply.Builder(h.model, runner.probe_step).user("k", kernels.gated_adding_a_submodule, None, "Gated")
    result = verify.verify(swap, runner)
    failed = {c.check: c.detail for c in result.checks if not c.passed}
    assert "added the parameter(s) mlp.extra.weight" in failed["parameters unchanged"]
    assert "modules changed" in failed["swap reverted cleanly"]
    assert [n for n, _ in h.model.named_parameters()] == names


def test_a_kernel_calling_sys_exit_fails_like_a_kernel_that_raises():
    kernels = load_fixture(FIXTURES / "kernels.py")
    h = tiny_harness()
    runner = verify.Runner(h)
    swap = apply.Builder(h.model, runner.probe_step).user("k", kernels.gated_calling_exit, None, "Gated")
    result = verify.verify(swap, runner)
    failed = {c.check: c.detail for c in result.checks if not c.passed}
    assert "sys.exit(0)" in failed["swapped model runs"]


# --- swap candidates ---------------------------------------------------------------------------------


def test_candidates_need_every_op_of_an_entry_at_one_source_line():
    ops = {
        "op": ["aten::mul", "aten::silu", "aten::mul", "aten::pow", "aten::mean", "aten::add", "aten::rsqrt",
               "aten::sum", "aten::gelu"],
        "source_location": ["m.py:5", "m.py:5", "m.py:9", "m.py:9", "m.py:9", "m.py:9", "m.py:9",
                            "opscope:harness", "m.py:12"],
        "input_dims": ["[[2, 8], [2, 8]]", "[[2, 8]]", "[[2, 8], [2, 1]]", "[[2, 8], []]", "[[2, 8], [], [], []]",
                       "[[2, 1], [], []]", "[[2, 1]]", "[[], [], []]", "[[2, 8]]"],
        "time_us_total": [10.0, 5.0, 4.0, 3.0, 2.0, 1.0, 1.0, 7.0, 8.0],
    }
    found = {c["kernel"]: c for c in catalog.candidates(ops)}
    assert found["swiglu"]["rows"] == [0, 1] and found["swiglu"]["time_us"] == 15.0
    assert found["rms_norm"]["rows"] == [2, 3, 4, 5, 6]  # *RMSNorm and the expression: pow, mean, add, rsqrt, mul
    assert {e["target"] for e in found["rms_norm"]["replaces"]} == {
        "*RMSNorm", "x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight"}
    assert found["broadcast_add"]["rows"] == [5]
    assert found["mean"]["rows"] == [4]
    assert "sum" not in found           # only the harness's loss sums
    assert "bias_gelu" not in found     # gelu without an addmm or add at its line
    assert list(found) == sorted(found, key=lambda k: -found[k]["time_us"])
    assert schema.kernels_for_rows(list(found.values()), range(3), None) == {0: ["swiglu"], 1: ["swiglu"], 2: ["rms_norm"]}
    assert schema.kernels_for_rows(list(found.values()), range(3)) == {}  # not measured: none is a suggestion


def test_candidates_of_several_ops_need_one_shape_and_see_through_activation_modules():
    # a Hugging Face LlamaMLP: silu in its act_fn module (at transformers/activations.py), the mul in the MLP's
    # own forward; an RMSNorm inside the decoder layer, whose residual add has the norm's shape
    rows = [("aten::silu", "[[2, 16, 128]]", "act.py:103", "model.layers.0.mlp.act_fn"),
            ("aten::mul", "[[2, 16, 128], [2, 16, 128]]", "llama.py:164", "model.layers.0.mlp"),
            ("aten::mm", "[[32, 64], [64, 128]]", "llama.py:164", "model.layers.0.mlp.gate_proj"),
            ("aten::pow", "[[2, 16, 64], []]", "llama.py:65", "model.layers.0.input_layernorm"),
            ("aten::mean", "[[2, 16, 64], [], [], []]", "llama.py:65", "model.layers.0.input_layernorm"),
            ("aten::add", "[[2, 16, 1], [], []]", "llama.py:66", "model.layers.0.input_layernorm"),
            ("aten::rsqrt", "[[2, 16, 1]]", "llama.py:66", "model.layers.0.input_layernorm"),
            ("aten::mul", "[[2, 16, 64], [2, 16, 1]]", "llama.py:66", "model.layers.0.input_layernorm"),
            ("aten::add", "[[2, 16, 64], [2, 16, 64], []]", "llama.py:300", "model.layers.0"),  # residual
            # one function-level line: a GELU's mul and add over [4, 8, 32], a softmax over [4, 8, 8]
            ("aten::mul", "[[4, 8, 32], []]", "f.py:1", ""), ("aten::add", "[[4, 8, 32], [], []]", "f.py:1", ""),
            ("aten::gelu", "[[4, 8, 32]]", "g.py:1", ""), ("aten::softmax", "[[4, 8, 8], [], []]", "f.py:1", ""),
            # a Linear's [B*T, N] addmm before a [B, T, N] GELU
            ("aten::addmm", "[[32], [32, 8], [8, 32]]", "g.py:1", ""),
            # shapes not recorded: a line shows no pattern
            ("aten::silu", "", "h.py:1", ""), ("aten::mul", "", "h.py:1", "")]
    ops = {"op": [r[0] for r in rows], "input_dims": [r[1] for r in rows], "source_location": [r[2] for r in rows],
           "module": [r[3] for r in rows], "time_us_total": [1.0] * len(rows)}
    found = {c["kernel"]: c["rows"] for c in catalog.candidates(ops)}
    assert found["swiglu"] == [0, 1]
    assert found["rms_norm"] == [3, 4, 5, 6, 7]  # not the decoder layer's residual add
    assert found["bias_gelu"] == [11, 13]
    assert "softmax" not in found  # no mul and add over the softmax's shape


def test_fusion_finding_names_the_bundled_fused_kernel():
    label, suggestion = pattern_for({"pow", "mean", "add", "rsqrt", "mul"}, speedups={"rms_norm": 1.5})
    assert label == "hand-written RMSNorm"
    assert suggestion.startswith("The bundled fused kernel rms_norm (1.50x the replaced ops' speed on this run's "
                                 "shapes) does it in one pass: `opscope swap MODEL --kernel rms_norm`")
    label, suggestion = pattern_for({"silu", "mul"}, speedups={"swiglu": 1.2})
    assert label == "SiLU gate (SwiGLU)" and "--kernel swiglu`" in suggestion
    assert "bundled" not in pattern_for({"exp", "sum", "div"})[1]  # no bundled kernel for a hand-written softmax


def test_parse_requests_without_torch():
    reqs = catalog.parse_requests(["rms_norm", "rms_norm+swiglu", "compile"])
    assert [(r.label, r.kernels, r.compile, r.source) for r in reqs] == [
        ("rms_norm", ["rms_norm"], False, "bundled"), ("rms_norm+swiglu", ["rms_norm", "swiglu"], False, "bundled"),
        ("compile", [], True, "compile")]
    user = catalog.parse_requests([f"{FIXTURES / 'kernels.py'}:good_add"], op="aten::add.Tensor")[0]
    assert (user.label, user.user_func, user.op, user.source) == ("kernels.py:good_add", "good_add",
                                                                 "aten::add.Tensor", "user")
    with pytest.raises(catalog.SwapRequestError, match="names a kernel twice"):
        catalog.parse_requests(["swiglu+swiglu"])


def test_rms_norm_suggestion_on_cpu_is_what_works_there():
    """On CPU, torch's F.rms_norm runs the hand-written ops as children of aten::_fused_rms_norm (no fused
    kernel): the CPU suggestion must not send users to it. When torch gains a fused CPU kernel, this test
    fails and CPU_PATTERN_SUGGESTIONS can go."""
    import torch

    x, w = torch.randn(64, 256), torch.ones(256)
    with torch.profiler.profile() as prof:
        torch.nn.functional.rms_norm(x, (256,), w, 1e-6)
    names = {e.name for e in prof.events()}
    assert "aten::_fused_rms_norm" in names and {"aten::pow", "aten::rsqrt"} <= names
    label, suggestion = pattern_for({"pow", "mean", "add", "rsqrt", "mul"}, cpu=True)
    assert label == "hand-written RMSNorm"
    assert "torch.compile the block" in suggestion and "saves nothing here" in suggestion
    assert "Use torch.nn.functional.rms_norm" in pattern_for({"pow", "mean", "add", "rsqrt", "mul"})[1]
