"""Each way of swapping a kernel into a model applies (the kernel runs where the manifest says, the
model's result stays the same) and reverts cleanly: the model's modules, forward functions and
state_dict (objects and contents), torch.nn.functional, torch.Tensor's methods and the dispatch-mode
stack are as before."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F  # noqa: N812
from torch.nn.functional import layer_norm as imported_layer_norm
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import TESTS, load_fixture
from opscope.kernels import catalog
from opscope.swap import apply, mechanisms

FIXTURES = TESTS / "fixtures" / "swap"
user_kernels = load_fixture(FIXTURES / "kernels.py")


def kernel(name: str) -> apply.BundledKernel:
    return apply.BundledKernel(catalog.find(name))


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def forwards(model: nn.Module) -> list[tuple[str, object, object]]:
    return [(n, m.__dict__.get("forward"), type(m).forward) for n, m in model.named_modules()]


class Probe:
    """The model and its inputs, with the probe step the Builder runs."""

    def __init__(self, model: nn.Module, *inputs: torch.Tensor) -> None:
        torch.manual_seed(0)
        self.model = model.eval()
        self.inputs = inputs

    def __call__(self) -> torch.Tensor:
        with torch.no_grad():
            return self.model(*self.inputs)


def apply_and_revert(probe: Probe, build) -> tuple[mechanisms.Swap, torch.Tensor, torch.Tensor]:  # noqa: ANN001
    """Builds the swap, runs the model with it applied, checks the revert; (swap, original, swapped)."""
    model = probe.model
    before_state, before_forwards = state(model), forwards(model)
    before_modules = [(n, id(m), type(m)) for n, m in model.named_modules()]
    functional = dict(vars(F))
    want = probe()
    snap = apply.snapshot(model)
    swap = build(apply.Builder(model, probe))
    swap.reset_counts()
    with swap.applied():
        got = probe()
    assert apply.differences(snap, apply.snapshot(model)) == []
    assert forwards(model) == before_forwards
    assert [(n, id(m), type(m)) for n, m in model.named_modules()] == before_modules
    after = state(model)
    assert after.keys() == before_state.keys() and all(torch.equal(after[k], before_state[k]) for k in after)
    assert all(vars(F)[k] is v for k, v in functional.items())
    assert "__add__" not in vars(torch.Tensor)
    assert torch._C._len_torch_dispatch_stack() == 0
    torch.testing.assert_close(probe(), want, rtol=0, atol=0)  # the model itself is untouched
    return swap, want, got


class HandRMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(dim) + 0.5)
        self.variance_epsilon = 1e-6

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states * torch.rsqrt(hidden_states.pow(2).mean(-1, keepdim=True) + self.variance_epsilon) * self.weight


class Norms(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = HandRMSNorm(32)
        self.b = nn.RMSNorm(32, eps=1e-5)
        self.c = nn.RMSNorm(32, elementwise_affine=False)  # no weight: the manifest's `when` keeps it out
        with torch.no_grad():
            self.b.weight.uniform_(0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(self.b(self.a(x)))


def test_module_swap_replaces_instances_and_reverts():
    probe = Probe(Norms(), torch.randn(4, 16, 32))
    swap, want, got = apply_and_revert(probe, lambda b: b.bundled("rms_norm", [kernel("rms_norm")]))
    sites = {s.where: s for s in swap.sites}
    # c has no weight: no module site (the manifest's `when`); its F.rms_norm call reaches the functional
    # entry, whose `weight is not None` sends it back to the original.
    assert set(sites) == {"a", "b", "torch.nn.functional.rms_norm"}
    assert [m.kind for m in swap.mechanisms] == ["module", "module", "functional"]
    assert sites["a"].target == "*RMSNorm" and sites["b"].target == "torch.nn.RMSNorm"
    assert [(s.swapped, s.fallback) for s in sites.values()] == [(1, 0), (1, 0), (0, 1)]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_module_swap_falls_back_when_a_call_condition_fails():
    """The kernel takes float32/float64/bf16/fp16 on cpu/cuda only; other calls run the original."""
    probe = Probe(nn.Sequential(HandRMSNorm(8)), torch.randn(2, 8))
    swap, _, _ = apply_and_revert(probe, lambda b: b.bundled("rms_norm", [kernel("rms_norm")]))
    site = swap.sites[0]
    site.reset()
    with swap.applied():
        probe.model(torch.randn(2, 8))  # float32: taken
        probe.model.half()
        probe.model(torch.randn(2, 8).half())  # float16: taken
        probe.model.to("meta")
        probe.model(torch.zeros(2, 8, device="meta"))  # meta: not a device the kernel runs on
    assert (site.swapped, site.fallback) == (2, 1)


class FunctionalNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.rand(32))
        self.b = nn.Parameter(torch.rand(32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.layer_norm(x, (32,), self.w, self.b, 1e-5)
        return imported_layer_norm(y, (32,), None, None, 1e-5)  # bound at import: patched in this module too


def test_functional_swap_patches_the_function_and_its_aliases():
    probe = Probe(FunctionalNorm(), torch.randn(4, 32))
    original = F.layer_norm
    seen = []

    def build(b: apply.Builder) -> mechanisms.Swap:
        swap = b.bundled("layer_norm", [kernel("layer_norm")])
        with swap.applied():
            seen.append((F.layer_norm is original, globals()["imported_layer_norm"] is original))
        return swap

    swap, want, got = apply_and_revert(probe, build)
    assert seen == [(False, False)]
    assert F.layer_norm is original and imported_layer_norm is original
    assert [m.kind for m in swap.mechanisms] == ["functional"]
    assert swap.counts() == (2, 0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5)


class Adds(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        a = x + y                       # same dtype: taken
        b = torch.add(a, y, alpha=2.0)  # alpha != 1: falls back
        c = a + y.double()              # mixed dtypes: falls back
        return b + c.float()            # taken


def test_aten_route_counts_swapped_and_fallen_back_calls():
    probe = Probe(Adds(), torch.randn(8, 16), torch.randn(16))
    swap, want, got = apply_and_revert(probe, lambda b: b.bundled("broadcast_add", [kernel("broadcast_add")]))
    kinds = [m.kind for m in swap.mechanisms]
    assert kinds[0] == "aten"
    aten = swap.mechanisms[0].sites[0]
    assert aten.target == "aten::add.Tensor" and not aten.in_autograd
    # x + y and b + c reach the kernel (through the __add__ entry, which also applies: the model calls it);
    # alpha=2 and the mixed dtypes fall back, the latter at both entries.
    assert kinds == ["aten", "method"]
    assert (aten.swapped, aten.fallback) == (0, 2)
    assert swap.counts() == (2, 3)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_method_swap_sets_and_removes_the_tensor_method():
    manifest = catalog.find("broadcast_add")
    method_entry = next(e for e in manifest.replaces if e.kind == "method")
    probe = Probe(Adds(), torch.randn(8, 16), torch.randn(16))
    inside = []

    def build(b: apply.Builder) -> mechanisms.Swap:
        swap = mechanisms.Swap("broadcast_add")
        mech = b._entry(kernel("broadcast_add"), method_entry, swap)
        swap.mechanisms.append(mech)
        with swap.applied():
            inside.append("__add__" in vars(torch.Tensor))
        return swap

    swap, want, got = apply_and_revert(probe, build)
    assert inside == [True]
    site = swap.sites[0]
    assert site.kind == "method" and site.swapped == 2 and site.fallback == 1  # the mixed-dtype add falls back
    torch.testing.assert_close(got, want, rtol=0, atol=0)


# --- pattern level ----------------------------------------------------------------------------------


class SiluMul(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate, self.up = nn.Linear(16, 24, bias=False), nn.Linear(16, 24, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(x) * F.silu(self.gate(x))  # operands in either order


class InlineRMS(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.weight = nn.Parameter(torch.rand(16) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6))


class AddGelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.randn(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x + self.bias, approximate="tanh")


class ScaledMaskedSoftmax(nn.Module):
    def forward(self, scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.softmax(scores / 4.0 + mask, dim=-1)


class SiLUActivation(nn.Module):
    """Hugging Face's transformers.activations.SiLUActivation (ACT2FN["silu"]): F.silu behind a module."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 (Hugging Face's name)
        return nn.functional.silu(input)


class LlamaMLP(nn.Module):
    """Hugging Face's LlamaMLP: the forward names `act_fn`, never silu."""

    def __init__(self) -> None:
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(16, 24, bias=False), nn.Linear(16, 24, bias=False)
        self.down_proj = nn.Linear(24, 16, bias=False)
        self.act_fn = SiLUActivation()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class GELUTanh(nn.Module):
    """Hugging Face's GELUTanh: a module calling functools.partial(F.gelu, approximate="tanh")."""

    def __init__(self) -> None:
        super().__init__()
        self.act = functools.partial(nn.functional.gelu, approximate="tanh")

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 (Hugging Face's name)
        return self.act(input)


class UpActDown(nn.Module):
    """An MLP whose forward names only `self.act` (nn.GELU(), or any activation module)."""

    def __init__(self, act: nn.Module) -> None:
        super().__init__()
        self.up, self.down, self.act = nn.Linear(16, 32), nn.Linear(32, 8), act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


class FunctionalLinearGelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w, self.b = nn.Parameter(torch.randn(32, 16) / 4), nn.Parameter(torch.randn(32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(F.linear(x, self.w, self.b))


PATTERN_CASES = {
    "silu_mul": ("swiglu", lambda: Probe(SiluMul(), torch.randn(4, 16)), 1e-5),
    "linear_bias_gelu": ("bias_gelu", lambda: Probe(nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)),
                                                    torch.randn(4, 16)), 1e-5),
    "add_gelu": ("bias_gelu", lambda: Probe(AddGelu(), torch.randn(4, 16)), 1e-5),
    "rms expression": ("rms_norm", lambda: Probe(InlineRMS(), torch.randn(4, 16)), 1e-5),
    "scaled_masked_softmax": ("softmax", lambda: Probe(ScaledMaskedSoftmax(), torch.randn(2, 8, 8),
                                                       torch.triu(torch.full((8, 8), float("-inf")), 1)), 1e-5),
    # through activation modules: what a forward computes is read from its graph, not from its text
    "silu_mul via act_fn (Hugging Face LlamaMLP)": ("swiglu", lambda: Probe(LlamaMLP(), torch.randn(4, 16)), 1e-5),
    "linear_bias_gelu via self.act = nn.GELU()": ("bias_gelu", lambda: Probe(UpActDown(nn.GELU()), torch.randn(4, 16)),
                                                  1e-5),
    "linear_bias_gelu via GELUTanh": ("bias_gelu", lambda: Probe(UpActDown(GELUTanh()), torch.randn(4, 16)), 1e-5),
    "linear_bias_gelu of F.linear": ("bias_gelu", lambda: Probe(FunctionalLinearGelu(), torch.randn(4, 16)), 1e-5),
}


@pytest.mark.parametrize("case", sorted(PATTERN_CASES))
def test_pattern_swap_rewrites_the_forward_and_reverts(case):
    name, make, tol = PATTERN_CASES[case]
    probe = make()
    swap, want, got = apply_and_revert(probe, lambda b: b.bundled(name, [kernel(name)]))
    assert [m.kind for m in swap.mechanisms] == ["pattern"]
    assert swap.counts() == (1, 0)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


class UntraceableGate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # control flow on a tensor's value: torch.fx cannot trace this forward
            x = -x
        return F.silu(self.gate(x)) * x


@pytest.mark.parametrize("act", [nn.SiLU(inplace=True), nn.PReLU(), nn.Sigmoid()], ids=type)
def test_an_activation_module_that_is_not_silu_is_not_a_swiglu_gate(act):
    model = LlamaMLP()
    model.act_fn = act  # an in-place SiLU, a module with a parameter, another function
    probe = Probe(model, torch.randn(4, 16))
    with pytest.raises(mechanisms.SwapError, match="nothing in the model matches swiglu"):
        apply.Builder(probe.model, probe).bundled("swiglu", [kernel("swiglu")])


def test_a_forward_fx_cannot_trace_is_not_swapped_and_says_so():
    model = Probe(nn.Sequential(UntraceableGate()), torch.randn(2, 3, 16))
    with pytest.raises(mechanisms.SwapError, match=r"torch.fx could not trace 0"):
        apply.Builder(model.model, model).bundled("swiglu", [kernel("swiglu")])


def test_kernels_applied_together_each_take_their_sites():
    class Both(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = HandRMSNorm(16)
            self.mlp = SiluMul()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.mlp(self.norm(x))

    probe = Probe(Both(), torch.randn(4, 16))
    swap, want, got = apply_and_revert(
        probe, lambda b: b.bundled("rms_norm+swiglu", [kernel("rms_norm"), kernel("swiglu")]))
    assert sorted((s.kernel, s.where) for s in swap.sites) == [("rms_norm", "norm"), ("swiglu", "mlp: mul")]
    assert swap.counts() == (2, 0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_nothing_to_swap_is_a_swap_error():
    probe = Probe(nn.Linear(4, 4), torch.randn(2, 4))
    with pytest.raises(mechanisms.SwapError, match="nothing in the model matches rms_norm"):
        apply.Builder(probe.model, probe).bundled("rms_norm", [kernel("rms_norm")])


def test_revert_happens_when_the_kernel_raises():
    def boom(a, b, alpha=1):  # noqa: ANN001, ANN202
        raise RuntimeError("kernel failed")

    probe = Probe(Adds(), torch.randn(8, 16), torch.randn(16))
    model = probe.model
    snap = apply.snapshot(model)
    swap = apply.Builder(model, probe).user("boom", boom, "aten::add.Tensor", None)
    with pytest.raises(RuntimeError, match="kernel failed"), swap.applied():
        probe()
    assert apply.differences(snap, apply.snapshot(model)) == []
    assert torch._C._len_torch_dispatch_stack() == 0


# --- user kernels -----------------------------------------------------------------------------------


def test_user_kernel_taking_only_some_shapes_falls_back_on_the_others():
    tiny_model = load_fixture(FIXTURES / "tiny_model.py")

    probe = Probe(tiny_model.get_model(), *tiny_model.get_inputs())
    swap, want, got = apply_and_revert(
        probe, lambda b: b.user("add_vector_only", user_kernels.add_vector_only, "aten::add.Tensor", None))
    assert swap.counts() == (1, 1)  # x + bias taken; the residual add of two full tensors declined
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_user_kernel_for_a_module_and_for_a_functional():
    tiny_model = load_fixture(FIXTURES / "tiny_model.py")

    probe = Probe(tiny_model.get_model(), *tiny_model.get_inputs())
    swap, want, got = apply_and_revert(probe, lambda b: b.user("good_gated", user_kernels.good_gated, None, "Gated"))
    assert [(s.kind, s.where) for s in swap.sites] == [("module", "mlp")] and swap.counts() == (1, 0)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    swap, want, got = apply_and_revert(
        probe, lambda b: b.user("silu", lambda x, inplace=False: x * torch.sigmoid(x), "torch.nn.functional.silu", None))
    assert swap.counts() == (1, 0)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    with pytest.raises(mechanisms.SwapError, match="no module of the model matches"):
        apply.Builder(probe.model, probe).user("x", user_kernels.good_gated, None, "NoSuchModule")
    with pytest.raises(mechanisms.SwapError, match="never calls it"):
        apply.Builder(probe.model, probe).user("x", user_kernels.good_add, "aten::div.Tensor", None)


@pytest.mark.slow
def test_compile_swap_applies_and_reverts():
    probe = Probe(nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)), torch.randn(4, 8))
    try:
        swap, want, got = apply_and_revert(probe, lambda b: b.compiled())
        assert [m.kind for m in swap.mechanisms] == ["compile"]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    finally:
        torch._dynamo.reset()


def test_snapshot_differences_name_what_a_swap_left_behind():
    model = Norms()
    snap = apply.snapshot(model)
    model.a.forward = lambda x: x
    with torch.no_grad():
        model.b.weight.mul_(2)
    try:
        torch.Tensor.__add__ = lambda a, b: a
        diffs = apply.differences(snap, apply.snapshot(model))
    finally:
        del torch.Tensor.__add__
    assert "forward of a changed" in diffs
    assert any("state_dict['b.weight']" in d for d in diffs)
    assert any(d.startswith("torch.Tensor: __add__") for d in diffs)


def test_profile_target_hands_swaps_the_weights_as_loaded_in_train_mode(tmp_path):
    """The profile's SGD steps (warmup, timed, line and memory passes) change the weights; the swaps
    start from the model as loaded, not from however far those steps drifted it."""
    tiny_model = load_fixture(FIXTURES / "tiny_model.py")

    from opscope.capture.torch_profiler import profile_target
    from opscope.target.specs import ProfileOptions

    seen: dict[str, dict[str, torch.Tensor]] = {}

    def extra(harness, run) -> dict[str, str]:  # noqa: ANN001
        seen["extra"] = state(harness.model)
        return {}

    opts = ProfileOptions(target=FIXTURES / "tiny_model.py", mode="train", steps=1, warmup=1, peak_bw=20.0,
                          peak_flops=["100"], threads=1, out=tmp_path / "run")
    profile_target(opts, extra=extra)
    loaded = state(tiny_model.get_model())
    assert seen["extra"].keys() == loaded.keys()
    for k, v in loaded.items():
        assert torch.equal(seen["extra"][k], v), k


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


class LinearGeluLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x), approximate="tanh"))


def test_accepting_a_call_computes_nothing():
    """bias_gelu's call mapping holds x = F.linear(input, weight): deciding whether the kernel takes the
    call must not run that matmul (it ran twice per step, once to decide and once for the kernel)."""
    probe = Probe(LinearGeluLinear(), torch.randn(4, 16))
    swap, want, got = apply_and_revert(probe, lambda b: b.bundled("bias_gelu", [kernel("bias_gelu")]))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    counter = _CountOps()
    with swap.applied(), torch.no_grad(), counter:
        probe.model(*probe.inputs)
    matmuls = [op for op in counter.ops if op in ("mm", "addmm", "matmul", "linear", "bmm")]
    assert len(matmuls) == 2, counter.ops  # the up projection (now without its bias) and the down one
    assert swap.counts() == (2, 0)  # one site: apply_and_revert's probe call and this one, both swapped
