"""Every bundled kernel, through its custom op torch.ops.opscope.<name> on the CPU backend: forward and
backward against PyTorch (a float64 reference for float32/float64, float32 for the half types) under the
manifest's per-dtype tolerance, several seeds, non-contiguous inputs; gradcheck in float64; opcheck;
torch.compile(fullgraph=True)."""

from __future__ import annotations

import pytest
import torch

from kernels_helpers import DTYPES, MANIFESTS, NAMES, keep_layout_grad, module, op, reference, tensors
from reference_kernels.testing import assert_matches, check_not_degenerate, tolerance

SEEDS = (0, 1, 2)


def small_samples(name: str, dtype: torch.dtype, max_elements: int) -> list[tuple]:
    """Samples small enough for element-by-element checks, without overlapping (stride-0) inputs."""
    def ok(args: tuple) -> bool:
        ts = [a for a in args if isinstance(a, torch.Tensor)]
        return (sum(t.numel() for t in ts) <= max_elements
                and not any(st == 0 and sz > 1 for t in ts for st, sz in zip(t.stride(), t.shape, strict=True)))
    return [args for args in module(name).samples(dtype, 0) if ok(args)]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name", NAMES)
def test_forward_matches_pytorch(name: str, dtype: str, seed: int) -> None:
    dt = DTYPES[dtype]
    tol = tolerance(MANIFESTS[name], dt)
    for i, args in enumerate(module(name).samples(dt, seed)):
        out = op(name)(*args)
        _, expected = reference(name, args, dt)
        assert out.dtype == dt
        assert_matches(out, expected, tol, f"{name} sample {i} ({dtype}, seed {seed})")


@pytest.mark.parametrize("seed", SEEDS[:2])
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
@pytest.mark.parametrize("name", NAMES)
def test_backward_matches_pytorch(name: str, dtype: str, seed: int) -> None:
    dt = DTYPES[dtype]
    tol = tolerance(MANIFESTS[name], dt)
    for i, sample in enumerate(module(name).samples(dt, seed)):
        args = keep_layout_grad(sample)
        out = op(name)(*args)
        grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 7)).to(dt)
        grads = torch.autograd.grad(out, tensors(args), grad_out)
        ref_args, expected = reference(name, sample, dt, grad=True)
        ref_grads = torch.autograd.grad(expected, tensors(ref_args), grad_out.to(expected.dtype))
        for k, (g, rg) in enumerate(zip(grads, ref_grads, strict=True)):
            assert g.shape == args[[j for j, a in enumerate(args) if isinstance(a, torch.Tensor)
                                    and a.requires_grad][k]].shape
            assert_matches(g, rg, tol, f"{name} sample {i} grad {k} ({dtype}, seed {seed})")


@pytest.mark.parametrize("name", NAMES)
def test_gradcheck_float64(name: str) -> None:
    small = small_samples(name, torch.float64, 600)  # gradcheck runs two forwards per input element
    assert len(small) >= 3
    for args in small:
        leaves = keep_layout_grad(args)
        assert torch.autograd.gradcheck(op(name), leaves, eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_opcheck(name: str) -> None:
    for args in small_samples(name, torch.float32, 2000)[:3]:
        torch.library.opcheck(op(name), args)
        torch.library.opcheck(op(name), keep_layout_grad(args))


@pytest.mark.parametrize("name", NAMES)
def test_compile_fullgraph_no_graph_break(name: str) -> None:
    torch._dynamo.reset()
    fn = op(name)

    def step(*args):  # noqa: ANN002, ANN202
        return (fn(*args) * 2).sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    args = keep_layout_grad(module(name).samples(torch.float32, 0)[0])
    loss = compiled(*args)
    grads = torch.autograd.grad(loss, tensors(args))
    eager_args = keep_layout_grad(module(name).samples(torch.float32, 0)[0])
    eager = step(*eager_args)
    eager_grads = torch.autograd.grad(eager, tensors(eager_args))
    torch.testing.assert_close(loss, eager)
    for g, e in zip(grads, eager_grads, strict=True):
        torch.testing.assert_close(g, e)


@pytest.mark.slow
def test_compile_inductor_all_kernels() -> None:
    """One inductor compile through every kernel (the custom ops stay opaque calls in the graph)."""
    torch._dynamo.reset()
    samples = {name: module(name).samples(torch.float32, 0)[0] for name in NAMES}
    ops = {name: op(name) for name in NAMES}  # registered before tracing

    def step(inputs):  # noqa: ANN001, ANN202
        return [ops[name](*args) for name, args in inputs.items()]

    compiled = torch.compile(step, fullgraph=True)
    for got, want in zip(compiled(samples), step(samples), strict=True):
        torch.testing.assert_close(got, want)


def test_the_checks_fail_zeros_nans_and_constants() -> None:
    """A kernel that returns zeros, NaNs or a constant fails the comparison, whatever the tolerance."""
    tol = MANIFESTS[NAMES[0]].tolerance["float32"]
    expected = torch.randn(8, 8, dtype=torch.float64)
    loose = type(tol)(rtol=10.0, atol=10.0)
    for bad, why in ((torch.zeros(8, 8), "all zeros"), (torch.full((8, 8), float("nan")), "NaN"),
                     (torch.full((8, 8), 0.5), "constant")):
        with pytest.raises(AssertionError, match=why):
            assert_matches(bad, expected, loose)
    with pytest.raises(AssertionError):
        assert_matches(expected.float() * (1 + 1e-3), expected, tol)
    check_not_degenerate(expected.float(), expected)
