"""rms_norm in Triton. Forward: one program per row, the row in ROW_BLOCK steps (sum of squares, then
the scaled write). Backward in two phases, deterministic: per row the coefficients rstd and
c = rstd^3 * sum(g * w * x) / n; then one program per (chunk of ROWS_PER_CHUNK rows, column block)
writes dx and that chunk's partial dw, and the partials are summed in chunk order."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from reference_kernels._triton import ROWS_PER_CHUNK, acc_dtype, column_sum, is_f64, launch_options, row_block
from reference_kernels.rms_norm.op import _check


@triton.jit
def _fwd(x_ptr, w_ptr, y_ptr, N, eps, BLOCK: tl.constexpr, F64: tl.constexpr):
    row = tl.program_id(0)
    if F64:
        ss = tl.zeros([BLOCK], dtype=tl.float64)
    else:
        ss = tl.zeros([BLOCK], dtype=tl.float32)
    for start in tl.range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * N + cols, mask=cols < N, other=0.0).to(ss.dtype)
        ss += x * x
    rstd = 1.0 / tl.sqrt(tl.sum(ss, axis=0) / N + eps)
    for start in tl.range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        m = cols < N
        x = tl.load(x_ptr + row * N + cols, mask=m, other=0.0).to(ss.dtype)
        w = tl.load(w_ptr + cols, mask=m, other=0.0)
        tl.store(y_ptr + row * N + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _bwd_rows(g_ptr, x_ptr, w_ptr, coef_ptr, N, eps, BLOCK: tl.constexpr, F64: tl.constexpr):
    row = tl.program_id(0)
    if F64:
        ss = tl.zeros([BLOCK], dtype=tl.float64)
    else:
        ss = tl.zeros([BLOCK], dtype=tl.float32)
    dot = ss * 0.0
    for start in tl.range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        m = cols < N
        x = tl.load(x_ptr + row * N + cols, mask=m, other=0.0).to(ss.dtype)
        g = tl.load(g_ptr + row * N + cols, mask=m, other=0.0).to(ss.dtype)
        w = tl.load(w_ptr + cols, mask=m, other=0.0)
        ss += x * x
        dot += g * w * x
    rstd = 1.0 / tl.sqrt(tl.sum(ss, axis=0) / N + eps)
    tl.store(coef_ptr + 2 * row, rstd)
    tl.store(coef_ptr + 2 * row + 1, rstd * rstd * rstd * tl.sum(dot, axis=0) / N)


@triton.jit
def _bwd_cols(g_ptr, x_ptr, w_ptr, coef_ptr, dx_ptr, part_ptr, M, N, ROWS: tl.constexpr, BLOCK: tl.constexpr,
              F64: tl.constexpr):
    chunk = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < N
    w = tl.load(w_ptr + cols, mask=m, other=0.0)
    acc = w * 0.0
    for i in range(0, ROWS):
        row = chunk * ROWS + i
        if row < M:
            rstd = tl.load(coef_ptr + 2 * row)
            c = tl.load(coef_ptr + 2 * row + 1)
            x = tl.load(x_ptr + row * N + cols, mask=m, other=0.0).to(w.dtype)
            g = tl.load(g_ptr + row * N + cols, mask=m, other=0.0).to(w.dtype)
            tl.store(dx_ptr + row * N + cols, (rstd * g * w - x * c).to(dx_ptr.dtype.element_ty), mask=m)
            acc += g * x * rstd
    tl.store(part_ptr + chunk * N + cols, acc, mask=m)


def rms_norm_forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    _check(x, weight)
    n = weight.numel()
    xc, wc = x.contiguous(), weight.to(acc_dtype(x)).contiguous()  # mixed precision: explicit
    y = torch.empty_like(xc)
    rows = xc.numel() // n if n else 0
    if rows:
        opts = launch_options("rms_norm", "rms_norm_forward", (x, weight, eps), row_block(n), block_is_knob=False)
        _fwd[(rows,)](xc, wc, y, n, eps, F64=is_f64(x), **opts)
    return y


def rms_norm_backward(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                      eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    _check(x, weight)
    n = weight.numel()
    xc, gc, wc = x.contiguous(), grad.contiguous(), weight.to(acc_dtype(x)).contiguous()
    rows = xc.numel() // n if n else 0
    dx = torch.empty_like(xc)
    coef = torch.empty((max(rows, 1), 2), dtype=acc_dtype(x), device=x.device)
    chunks = triton.cdiv(rows, ROWS_PER_CHUNK)
    part = torch.zeros((max(chunks, 1), n), dtype=acc_dtype(x), device=x.device)
    if rows:
        block = row_block(n)
        _bwd_rows[(rows,)](gc, xc, wc, coef, n, eps, BLOCK=block, F64=is_f64(x))
        _bwd_cols[(chunks, triton.cdiv(n, block))](gc, xc, wc, coef, dx, part, rows, n, ROWS=ROWS_PER_CHUNK,
                                                    BLOCK=block, F64=is_f64(x))
    return dx, column_sum(part, weight.dtype).view(weight.shape)
