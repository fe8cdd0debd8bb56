"""swiglu in Triton: elementwise silu(a) * b and its two gradients, one program per BLOCK elements."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from reference_kernels._triton import BLOCK, is_f64, launch_options
from reference_kernels.swiglu.op import _check


@triton.jit
def _fwd(a_ptr, b_ptr, y_ptr, n, BLOCK: tl.constexpr, F64: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    a = tl.load(a_ptr + offs, mask=m, other=0.0)
    b = tl.load(b_ptr + offs, mask=m, other=0.0)
    if F64:
        a = a.to(tl.float64)
        b = b.to(tl.float64)
    else:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    tl.store(y_ptr + offs, (a * tl.sigmoid(a) * b).to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _bwd(g_ptr, a_ptr, b_ptr, da_ptr, db_ptr, n, BLOCK: tl.constexpr, F64: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    a = tl.load(a_ptr + offs, mask=m, other=0.0)
    b = tl.load(b_ptr + offs, mask=m, other=0.0)
    g = tl.load(g_ptr + offs, mask=m, other=0.0)
    if F64:
        a = a.to(tl.float64)
        b = b.to(tl.float64)
        g = g.to(tl.float64)
    else:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
        g = g.to(tl.float32)
    s = tl.sigmoid(a)
    tl.store(da_ptr + offs, (g * b * s * (1.0 + a * (1.0 - s))).to(da_ptr.dtype.element_ty), mask=m)
    tl.store(db_ptr + offs, (g * a * s).to(db_ptr.dtype.element_ty), mask=m)


def swiglu_forward(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    _check(a, b)
    ac, bc = a.contiguous(), b.contiguous()
    y = torch.empty_like(ac)
    if y.numel():
        opts = launch_options("swiglu", "swiglu_forward", (a, b), BLOCK, block_is_knob=True)
        _fwd[(triton.cdiv(y.numel(), opts["BLOCK"]),)](ac, bc, y, y.numel(), F64=is_f64(a), **opts)
    return y


def swiglu_backward(grad: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    _check(a, b)
    ac, bc, gc = a.contiguous(), b.contiguous(), grad.contiguous()
    da, db = torch.empty_like(ac), torch.empty_like(ac)
    if da.numel():
        _bwd[(triton.cdiv(da.numel(), BLOCK),)](gc, ac, bc, da, db, da.numel(), BLOCK=BLOCK, F64=is_f64(a))
    return da, db
