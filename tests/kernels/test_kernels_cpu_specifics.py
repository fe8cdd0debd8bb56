"""Kernel-specific behaviour of the CPU kernels beyond the shared matrix in test_kernels_ops.py: the
reduction strategy chosen by shape and layout, explicit mixed-precision handling, the softmax mask,
argument errors, and the vectorized math's accuracy where it is hardest (GELU tails)."""

from __future__ import annotations

import pytest
import torch

import reference_kernels as rk
from reference_kernels.sum.op import strategy


@pytest.mark.parametrize(("shape", "dim", "make", "want"), [
    ((64, 1000), -1, None, "rows"),                     # reduce the contiguous dim
    ((1000, 64), 0, None, "columns"),                   # reduce an outer dim: stream rows, vectors across
    ((8, 50, 16), 1, None, "columns"),                  # [outer, R, inner]
    ((4, 40000), 1, None, "rows-split"),                # few outputs, long rows: R split in fixed chunks
    ((3000, 3), 0, None, "columns-split"),              # few columns, many rows
    ((64, 1000), 0, "t", "rows"),                       # x.t(): dim 0 is now the unit-stride one
    ((4, 3, 5), 1, "permute", "rows"),                  # strides (3, 1, 12): rows over two kept dims
    ((6, 4, 5), 1, "permute3", "copy+columns"),         # strides (1, 30, 6): no fit, one contiguous copy
])
def test_reduction_strategy_follows_shape_and_layout(shape, dim, make, want) -> None:  # noqa: ANN001
    x = torch.randn(shape)
    if make == "t":
        x = torch.randn(shape[::-1]).t()
    elif make == "permute":
        x = torch.randn(shape[2], shape[0], shape[1]).permute(1, 2, 0)
    elif make == "permute3":
        x = torch.randn(shape[1], shape[2], shape[0]).permute(2, 0, 1)
    assert strategy(x, dim) == want
    torch.testing.assert_close(rk.sum(x, dim), x.double().sum(dim).float(), rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(rk.mean(x, dim, True), x.double().mean(dim, keepdim=True).float(),
                               rtol=1e-5, atol=1e-6)


def test_reduction_edge_cases() -> None:
    assert torch.equal(rk.sum(torch.zeros(3, 0), 1), torch.zeros(3))
    assert torch.isnan(rk.mean(torch.zeros(3, 0), 1)).all()  # as torch.mean
    assert rk.sum(torch.tensor(2.5), 0).item() == 2.5
    with pytest.raises(IndexError, match="dim 2 is out of range"):
        rk.sum(torch.randn(3, 4), 2)


def test_mixed_precision_parameters_are_converted_explicitly() -> None:
    """bfloat16 activations with float32 parameters: the parameters are converted to the float
    accumulation type once (not rounded to bfloat16), the result keeps x's dtype."""
    x = torch.randn(16, 64).bfloat16()
    w = 1 + torch.randn(64) * 1e-3       # differences a bfloat16 weight could not hold
    b = torch.randn(64) * 1e-3
    y = rk.rms_norm(x, w, 1e-6)
    assert y.dtype == torch.bfloat16
    want = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w).bfloat16()
    assert (y.float() - want.float()).abs().max() <= 2 ** -7 * want.float().abs().max()
    ln = rk.layer_norm(x, [64], w, b, 1e-5)
    assert ln.dtype == torch.bfloat16
    torch.testing.assert_close(ln.float(), torch.nn.functional.layer_norm(x.float(), [64], w, b, 1e-5),
                               rtol=1.6e-2, atol=2e-2)
    g = rk.bias_gelu(x, torch.randn(64, dtype=torch.float64), "none")
    assert g.dtype == torch.bfloat16
    with pytest.raises(RuntimeError, match="same dtype"):
        rk.swiglu(x, x.float())


def test_softmax_mask_broadcasts_and_gets_a_gradient() -> None:
    x = torch.randn(2, 3, 5, 5, requires_grad=True)
    mask = torch.randn(5, 1, requires_grad=True)
    y = rk.softmax(x, 0.5, mask)
    xr, mr = x.detach().double().requires_grad_(), mask.detach().double().requires_grad_()
    yr = torch.softmax(xr * 0.5 + mr, -1)
    torch.testing.assert_close(y.double(), yr, rtol=1e-5, atol=1e-6)
    g = torch.randn(2, 3, 5, 5)
    dx, dm = torch.autograd.grad(y, (x, mask), g)
    dxr, dmr = torch.autograd.grad(yr, (xr, mr), g.double())
    torch.testing.assert_close(dx.double(), dxr, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dm.double(), dmr, rtol=1e-5, atol=1e-5)


def test_softmax_causal_mask_gives_exact_zeros_and_rows_sum_to_one() -> None:
    x = torch.randn(4, 9, 9)
    y = rk.softmax(x, 1.0, torch.full((9, 9), float("-inf")).triu(1))
    assert torch.equal(y.triu(1), torch.zeros_like(y))
    torch.testing.assert_close(y.sum(-1), torch.ones(4, 9))


def test_softmax_rejects_bool_masks_and_masks_that_grow_x() -> None:
    with pytest.raises(RuntimeError, match="additive floating mask"):
        rk.softmax(torch.randn(3, 4), 1.0, torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="must broadcast to x's shape"):
        rk.softmax(torch.randn(3, 4), 1.0, torch.zeros(2, 3, 4))


def test_argument_errors_are_clear() -> None:
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh'"):
        rk.bias_gelu(torch.randn(2, 4), torch.randn(4), "fast")
    with pytest.raises(ValueError, match="bias must be 1-D with x's last dim"):
        rk.bias_gelu(torch.randn(2, 4), torch.randn(3))
    with pytest.raises(ValueError, match=r"weight's shape \[5\] must equal the trailing dims"):
        rk.rms_norm(torch.randn(2, 4), torch.randn(5), 1e-6)
    with pytest.raises(ValueError, match=r"normalized_shape \[3\] must equal the trailing dims"):
        rk.layer_norm(torch.randn(2, 4), [3])
    with pytest.raises(ValueError, match="a and b must have the same shape"):
        rk.swiglu(torch.randn(2, 4), torch.randn(4))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_is_accurate_in_the_tails(approximate: str) -> None:
    """Relative error over [-12, 12] against float64 forms without cancellation: x * erfc(-x/sqrt 2) / 2
    and x * sigmoid(2u). (PyTorch's own GELU, even in float64, computes 1 + erf(x/sqrt 2) or 1 + tanh(u),
    which cancels to 0 in the negative tail; its float32 CPU GELU returns 0 below about x = -6.)"""
    x = torch.linspace(-12, 12, 20001)
    y = rk.bias_gelu(x.view(1, -1), torch.zeros(20001), approximate).view(-1).double()
    xd = x.double()
    if approximate == "none":
        want = xd * 0.5 * torch.special.erfc(-xd / 2 ** 0.5)
    else:
        want = xd * torch.sigmoid(2 * 0.7978845608028654 * (xd + 0.044715 * xd ** 3))
    big = want.abs() > 1e-30
    rel = ((y - want).abs() / want.abs())[big]
    assert rel.max() < 2e-5, rel.max()


def test_large_float32_outputs_written_with_streaming_stores_are_right() -> None:
    """Float32 outputs of 16 MiB or more take the non-temporal store path (common.h: write_run), whose
    rows here start unaligned (4099 columns), so the aligned middle, the head and the tail all run."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1025, 4099, generator=g)
    assert x.numel() * 4 >= 16 << 20
    y = torch.randn(1025, 4099, generator=g)
    b = torch.randn(4099, generator=g)
    xd, yd, bd = x.double(), y.double(), b.double()
    tol = {"rtol": 1e-5, "atol": 1e-6}
    torch.testing.assert_close(rk.broadcast_add(x, y).double(), xd + yd, **tol)
    torch.testing.assert_close(rk.broadcast_add(x, b).double(), xd + bd, **tol)
    torch.testing.assert_close(rk.swiglu(x, y).double(), torch.nn.functional.silu(xd) * yd, **tol)
    torch.testing.assert_close(rk.bias_gelu(x, b, "none").double(), torch.nn.functional.gelu(xd + bd), **tol)
    torch.testing.assert_close(rk.softmax(x, 0.5).double(), torch.softmax(xd * 0.5, -1), **tol)
    torch.testing.assert_close(rk.rms_norm(x, b, 1e-6).double(),
                               xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * bd, **tol)
    torch.testing.assert_close(rk.layer_norm(x, [4099], b, b, 1e-5).double(),
                               torch.nn.functional.layer_norm(xd, [4099], bd, bd, 1e-5), rtol=1e-5, atol=1e-5)
