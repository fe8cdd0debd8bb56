"""layer_norm in Triton. Forward: one program per row; the statistics in one pass over the row, each
ROW_BLOCK step's mean and M2 merged into the running ones with Chan's formula (Welford by blocks), the row
shifted by its first element first; then the affine write. Backward: per-row statistics and the two
means (of g*w and g*w*xhat), then programs over (row chunk, column block) write dx and partial dw/db,
summed in chunk order (deterministic)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from reference_kernels._triton import ROWS_PER_CHUNK, acc_dtype, column_sum, is_f64, launch_options, row_block
from reference_kernels.layer_norm.op import _check


@triton.jit
def _stats(x_ptr, row, N, BLOCK: tl.constexpr, F64: tl.constexpr):
    """(shift, mean of x - shift, biased variance) of one row."""
    if F64:
        shift = tl.load(x_ptr + row * N).to(tl.float64)
    else:
        shift = tl.load(x_ptr + row * N).to(tl.float32)
    count = shift * 0.0
    mean = shift * 0.0
    m2 = shift * 0.0
    for start in tl.range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        m = cols < N
        v = tl.where(m, tl.load(x_ptr + row * N + cols, mask=m, other=0.0).to(shift.dtype) - shift, 0.0)
        nb = tl.sum(m.to(shift.dtype), axis=0)
        mb = tl.sum(v, axis=0) / nb
        d = tl.where(m, v - mb, 0.0)
        m2b = tl.sum(d * d, axis=0)
        total = count + nb
        delta = mb - mean
        mean = mean + delta * nb / total
        m2 = m2 + m2b + delta * delta * count * nb / total
        count = total
    return shift, mean, m2 / N


@triton.jit
def _fwd(x_ptr, w_ptr, b_ptr, y_ptr, N, eps, BLOCK: tl.constexpr, F64: tl.constexpr):
    row = tl.program_id(0)
    shift, mean, var = _stats(x_ptr, row, N, BLOCK, F64)
    rstd = 1.0 / tl.sqrt(var + eps)
    for start in tl.range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        m = cols < N
        x = tl.load(x_ptr + row * N + cols, mask=m, other=0.0).to(shift.dtype)
        w = tl.load(w_ptr + cols, mask=m, other=0.0)
        b = tl.load(b_ptr + cols, mask=m, other=0.0)
        tl.store(y_ptr + row * N + cols, (((x - shift) - mean) * rstd * w + b).to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _bwd_rows(g_ptr, x_ptr, w_ptr, coef_ptr, N, eps, BLOCK: tl.constexpr, F64: tl.constexpr):
    row = tl.program_id(0)
    shift, mean, var = _stats(x_ptr, row, N, BLOCK, F64)
    rstd = 1.0 / tl.sqrt(var + eps)
    sq = shift * 0.0
    sqx = shift * 0.0
    for start in tl.range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        m = cols < N
        x = tl.load(x_ptr + row * N + cols, mask=m, other=0.0).to(shift.dtype)
        g = tl.load(g_ptr + row * N + cols, mask=m, other=0.0).to(shift.dtype)
        w = tl.load(w_ptr + cols, mask=m, other=0.0)
        xhat = tl.where(m, ((x - shift) - mean) * rstd, 0.0)
        sq += tl.sum(g * w, axis=0)
        sqx += tl.sum(g * w * xhat, axis=0)
    tl.store(coef_ptr + 4 * row, shift + mean)
    tl.store(coef_ptr + 4 * row + 1, rstd)
    tl.store(coef_ptr + 4 * row + 2, sq / N)
    tl.store(coef_ptr + 4 * row + 3, sqx / N)


@triton.jit
def _bwd_cols(g_ptr, x_ptr, w_ptr, coef_ptr, dx_ptr, part_ptr, M, N, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    chunk = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < N
    w = tl.load(w_ptr + cols, mask=m, other=0.0)
    dw = w * 0.0
    db = w * 0.0
    for i in range(0, ROWS):
        row = chunk * ROWS + i
        if row < M:
            mu = tl.load(coef_ptr + 4 * row)
            rstd = tl.load(coef_ptr + 4 * row + 1)
            mq = tl.load(coef_ptr + 4 * row + 2)
            mqx = tl.load(coef_ptr + 4 * row + 3)
            x = tl.load(x_ptr + row * N + cols, mask=m, other=0.0).to(w.dtype)
            g = tl.load(g_ptr + row * N + cols, mask=m, other=0.0).to(w.dtype)
            xhat = (x - mu) * rstd
            tl.store(dx_ptr + row * N + cols, (rstd * (g * w - mq - xhat * mqx)).to(dx_ptr.dtype.element_ty), mask=m)
            dw += g * xhat
            db += g
    tl.store(part_ptr + (2 * chunk) * N + cols, dw, mask=m)
    tl.store(part_ptr + (2 * chunk + 1) * N + cols, db, mask=m)


def _affine(t: torch.Tensor | None, n: int, fill: float, x: torch.Tensor) -> torch.Tensor:
    if t is None:
        return torch.full((n,), fill, dtype=acc_dtype(x), device=x.device)
    return t.to(acc_dtype(x)).contiguous().view(n)


def layer_norm_forward(x: torch.Tensor, normalized_shape: list[int], weight: torch.Tensor | None,
                       bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    _check(x, normalized_shape, weight, bias)
    n = 1
    for s in normalized_shape:
        n *= s
    xc = x.contiguous()
    y = torch.empty_like(xc)
    rows = xc.numel() // n if n else 0
    if rows:
        opts = launch_options("layer_norm", "layer_norm_forward", (x, normalized_shape, weight, bias, eps),
                              row_block(n), block_is_knob=False)
        _fwd[(rows,)](xc, _affine(weight, n, 1.0, x), _affine(bias, n, 0.0, x), y, n, eps, F64=is_f64(x), **opts)
    return y


def layer_norm_backward(grad: torch.Tensor, x: torch.Tensor, normalized_shape: list[int], weight: torch.Tensor | None,
                        bias: torch.Tensor | None, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _check(x, normalized_shape, weight, bias)
    n = 1
    for s in normalized_shape:
        n *= s
    xc, gc, wc = x.contiguous(), grad.contiguous(), _affine(weight, n, 1.0, x)
    rows = xc.numel() // n if n else 0
    dx = torch.empty_like(xc)
    chunks = triton.cdiv(rows, ROWS_PER_CHUNK)
    coef = torch.empty((max(rows, 1), 4), dtype=acc_dtype(x), device=x.device)
    part = torch.zeros((max(chunks, 1), 2, n), dtype=acc_dtype(x), device=x.device)
    if rows:
        block = row_block(n)
        _bwd_rows[(rows,)](gc, xc, wc, coef, n, eps, BLOCK=block, F64=is_f64(x))
        _bwd_cols[(chunks, triton.cdiv(n, block))](gc, xc, wc, coef, dx, part, rows, n, ROWS=ROWS_PER_CHUNK,
                                                    BLOCK=block)
    sums = column_sum(part.view(max(chunks, 1), 2 * n), acc_dtype(x)).view(2, n)
    # clone: outputs of a custom op must not alias each other (both rows of `sums` share its storage)
    dw = sums[0].to(weight.dtype).clone().view(weight.shape) if weight is not None else x.new_empty(0)
    db = sums[1].to(bias.dtype).clone().view(bias.shape) if bias is not None else x.new_empty(0)
    return dx, dw, db
