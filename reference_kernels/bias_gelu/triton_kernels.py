"""bias_gelu in Triton: one program per BLOCK elements of x (contiguous), bias indexed by column.
Backward: dx elementwise, dbias as the column sum of dx (reference_kernels._triton.column_sum)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from reference_kernels._triton import BLOCK, acc_dtype, column_sum, is_f64, launch_options
from reference_kernels.bias_gelu.op import _check


@triton.jit
def _gelu(v, TANH: tl.constexpr):
    if TANH:
        u = 0.7978845608028654 * (v + 0.044715 * v * v * v)
        return v * tl.sigmoid(2.0 * u)
    else:
        return 0.5 * v * (1.0 + tl.math.erf(v * 0.7071067811865476))


@triton.jit
def _gelu_grad(v, TANH: tl.constexpr):
    if TANH:
        u = 0.7978845608028654 * (v + 0.044715 * v * v * v)
        s = tl.sigmoid(2.0 * u)
        return s + v * 2.0 * s * (1.0 - s) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * v * v)
    else:
        cdf = 0.5 * (1.0 + tl.math.erf(v * 0.7071067811865476))
        return cdf + v * 0.3989422804014327 * tl.exp(-0.5 * v * v)


@triton.jit
def _fwd(x_ptr, b_ptr, y_ptr, n, N, BLOCK: tl.constexpr, TANH: tl.constexpr, F64: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    b = tl.load(b_ptr + offs % N, mask=m, other=0.0)
    if F64:
        v = x.to(tl.float64) + b.to(tl.float64)
    else:
        v = x.to(tl.float32) + b.to(tl.float32)
    tl.store(y_ptr + offs, _gelu(v, TANH).to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _bwd(g_ptr, x_ptr, b_ptr, dx_ptr, dacc_ptr, n, N, BLOCK: tl.constexpr, TANH: tl.constexpr, F64: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    b = tl.load(b_ptr + offs % N, mask=m, other=0.0)
    g = tl.load(g_ptr + offs, mask=m, other=0.0)
    if F64:
        d = g.to(tl.float64) * _gelu_grad(x.to(tl.float64) + b.to(tl.float64), TANH)
    else:
        d = g.to(tl.float32) * _gelu_grad(x.to(tl.float32) + b.to(tl.float32), TANH)
    tl.store(dx_ptr + offs, d.to(dx_ptr.dtype.element_ty), mask=m)
    tl.store(dacc_ptr + offs, d, mask=m)


def bias_gelu_forward(x: torch.Tensor, bias: torch.Tensor, approximate: str) -> torch.Tensor:
    _check(x, bias, approximate)
    xc, bc = x.contiguous(), bias.to(acc_dtype(x)).contiguous()  # mixed precision: explicit conversion
    y = torch.empty_like(xc)
    if y.numel():
        opts = launch_options("bias_gelu", "bias_gelu_forward", (x, bias, approximate), BLOCK, block_is_knob=True)
        _fwd[(triton.cdiv(y.numel(), opts["BLOCK"]),)](xc, bc, y, y.numel(), x.shape[-1],
                                                       TANH=approximate == "tanh", F64=is_f64(x), **opts)
    return y


def bias_gelu_backward(grad: torch.Tensor, x: torch.Tensor, bias: torch.Tensor,
                       approximate: str) -> tuple[torch.Tensor, torch.Tensor]:
    _check(x, bias, approximate)
    xc, gc, bc = x.contiguous(), grad.contiguous(), bias.to(acc_dtype(x)).contiguous()
    dx = torch.empty_like(xc)
    dacc = torch.empty(xc.shape, dtype=acc_dtype(x), device=x.device)
    if dx.numel():
        _bwd[(triton.cdiv(dx.numel(), BLOCK),)](gc, xc, bc, dx, dacc, dx.numel(), x.shape[-1], BLOCK=BLOCK,
                                                TANH=approximate == "tanh", F64=is_f64(x))
    n = x.shape[-1]
    return dx, column_sum(dacc.view(-1, n), bias.dtype)
