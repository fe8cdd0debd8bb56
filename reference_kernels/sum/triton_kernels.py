"""sum (and mean) over one dim in Triton, strategy by shape like the CPU kernel: the input made
contiguous and viewed as [K1, R, K0]; K0 == 1 (the last dim): "rows", one program per output summing a
contiguous row in ROW_BLOCK steps; else "columns": one program per (k1, column block) adding the R rows
in order (reference_kernels._triton.column_sum)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from reference_kernels import _checks
from reference_kernels._triton import column_sum, is_f64, launch_options, row_block
from reference_kernels.sum.op import out_shape


@triton.jit
def _rows(x_ptr, out_ptr, R, scale, BLOCK: tl.constexpr, F64: tl.constexpr):
    k = tl.program_id(0)
    if F64:
        acc = tl.zeros([BLOCK], dtype=tl.float64)
    else:
        acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in tl.range(0, R, BLOCK):
        c = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + k * R + c, mask=c < R, other=0.0).to(acc.dtype)
    tl.store(out_ptr + k, (tl.sum(acc, axis=0) * scale).to(out_ptr.dtype.element_ty))


def reduce_forward(x: torch.Tensor, dim: int, keepdim: bool, mean: bool, op: str) -> torch.Tensor:
    _checks.floating(x, op, "x")
    shape = out_shape(x, dim, keepdim, op)
    xc = x.contiguous()
    if x.dim() == 0:
        return xc.clone().view(shape)
    d = dim % x.dim()
    r = x.shape[d]
    k1 = 1
    for s in x.shape[:d]:
        k1 *= s
    k0 = 1
    for s in x.shape[d + 1:]:
        k0 *= s
    out = torch.empty(shape, dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    if r == 0:
        return out.fill_(float("nan") if mean else 0.0)
    scale = 1.0 / r if mean else 1.0
    if k0 == 1:  # rows (the column sums' launch is fixed: its splits fix the order of additions)
        kernel = op.split("::")[-1]
        opts = launch_options(kernel, f"{kernel}_forward", (x, dim, keepdim), row_block(r), block_is_knob=False)
        _rows[(k1,)](xc, out, r, scale, F64=is_f64(x), **opts)
        return out
    return column_sum(xc.view(k1, r, k0), x.dtype, scale).view(shape)  # columns


def sum_forward(x: torch.Tensor, dim: int, keepdim: bool) -> torch.Tensor:
    return reduce_forward(x, dim, keepdim, False, "opscope::sum")
