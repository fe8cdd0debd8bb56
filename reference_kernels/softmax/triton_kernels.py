"""softmax in Triton, the online form: one program per row; one pass keeps a running max m and a running
sum s of exp(z - m), rescaling s by exp(m_old - m_new) whenever the max grows (so rows longer than one
block need no extra pass for the max); a second pass writes exp(z - m) / s. The mask is read through its
broadcast strides over up to 3 (coalesced) leading dims; a mask that needs more is expanded first."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from reference_kernels._triton import acc_dtype, is_f64, launch_options, row_block
from reference_kernels.softmax.op import _check


@triton.jit
def _z(x_ptr, mask_ptr, row, cols, m, N, scale, moff, MS, HAS_MASK: tl.constexpr, F64: tl.constexpr):
    x = tl.load(x_ptr + row * N + cols, mask=m, other=0.0)
    if F64:
        z = x.to(tl.float64) * scale
    else:
        z = x.to(tl.float32) * scale
    if HAS_MASK:
        z += tl.load(mask_ptr + moff + cols * MS, mask=m, other=0.0).to(z.dtype)
    return tl.where(m, z, -float("inf"))


@triton.jit
def _fwd(x_ptr, mask_ptr, y_ptr, N, scale, L1, L2, M0, M1, M2, MS, BLOCK: tl.constexpr, HAS_MASK: tl.constexpr,
         F64: tl.constexpr):
    row = tl.program_id(0)
    moff = (row // (L1 * L2)) * M0 + ((row // L2) % L1) * M1 + (row % L2) * M2
    cols = tl.arange(0, BLOCK)
    z = _z(x_ptr, mask_ptr, row, cols, cols < N, N, scale, moff, MS, HAS_MASK, F64)
    mx = tl.max(z, axis=0)
    s = tl.sum(tl.exp(z - mx), axis=0)
    for start in tl.range(BLOCK, N, BLOCK):
        c = start + cols
        z = _z(x_ptr, mask_ptr, row, c, c < N, N, scale, moff, MS, HAS_MASK, F64)
        new = tl.maximum(mx, tl.max(z, axis=0))
        s = s * tl.exp(mx - new) + tl.sum(tl.exp(z - new), axis=0)
        mx = new
    for start in tl.range(0, N, BLOCK):
        c = start + cols
        z = _z(x_ptr, mask_ptr, row, c, c < N, N, scale, moff, MS, HAS_MASK, F64)
        tl.store(y_ptr + row * N + c, (tl.exp(z - mx) / s).to(y_ptr.dtype.element_ty), mask=c < N)


@triton.jit
def _bwd(g_ptr, y_ptr, dx_ptr, N, scale, BLOCK: tl.constexpr, F64: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    if F64:
        dot = tl.zeros([BLOCK], dtype=tl.float64)
    else:
        dot = tl.zeros([BLOCK], dtype=tl.float32)
    for start in tl.range(0, N, BLOCK):
        c = start + cols
        g = tl.load(g_ptr + row * N + c, mask=c < N, other=0.0).to(dot.dtype)
        y = tl.load(y_ptr + row * N + c, mask=c < N, other=0.0).to(dot.dtype)
        dot += g * y
    total = tl.sum(dot, axis=0)
    for start in tl.range(0, N, BLOCK):
        c = start + cols
        g = tl.load(g_ptr + row * N + c, mask=c < N, other=0.0).to(dot.dtype)
        y = tl.load(y_ptr + row * N + c, mask=c < N, other=0.0).to(dot.dtype)
        tl.store(dx_ptr + row * N + c, (scale * y * (g - total)).to(dx_ptr.dtype.element_ty), mask=c < N)


def _mask_view(mask: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, list[int], list[int], int]:
    """The mask (accumulation dtype) as seen from x's rows: up to 3 leading (size, stride) pairs + the
    last dim's stride."""
    mk = mask.to(acc_dtype(x)).expand(x.shape)
    sizes, strides = [], []
    for n, st in zip(x.shape[:-1], mk.stride()[:-1], strict=True):
        if n == 1:
            continue
        if sizes and strides[-1] == st * n:
            sizes[-1] *= n
            strides[-1] = st
        else:
            sizes.append(n)
            strides.append(st)
    if len(sizes) > 3:
        mk = mk.contiguous()
        n_last = x.shape[-1]
        return mk, [1, 1, x.numel() // max(n_last, 1)], [0, 0, n_last], 1
    pad = 3 - len(sizes)
    return mk, [1] * pad + sizes, [0] * pad + strides, mk.stride()[-1] if x.dim() else 1


def softmax_forward(x: torch.Tensor, scale: float, mask: torch.Tensor | None) -> torch.Tensor:
    _check(x, mask)
    xc = x.contiguous()
    y = torch.empty_like(xc)
    n = x.shape[-1]
    rows = xc.numel() // n if n else 0
    if not rows:
        return y
    opts = launch_options("softmax", "softmax_forward", (x, scale, mask), row_block(n), block_is_knob=False)
    if mask is not None:
        mk, sizes, strides, ms = _mask_view(mask, x)
        _fwd[(rows,)](xc, mk, y, n, scale, sizes[1], sizes[2], *strides, ms, HAS_MASK=True, F64=is_f64(x), **opts)
    else:
        _fwd[(rows,)](xc, xc, y, n, scale, 1, 1, 0, 0, 0, 0, HAS_MASK=False, F64=is_f64(x), **opts)
    return y


def softmax_backward(grad: torch.Tensor, y: torch.Tensor, scale: float) -> torch.Tensor:
    yc, gc = y.contiguous(), grad.contiguous()
    dx = torch.empty_like(yc)
    n = y.shape[-1]
    rows = yc.numel() // n if n else 0
    if rows:
        _bwd[(rows,)](gc, yc, dx, n, scale, BLOCK=row_block(n), F64=is_f64(y))
    return dx
