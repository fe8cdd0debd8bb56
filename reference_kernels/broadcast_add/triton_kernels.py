"""broadcast_add in Triton: both operands seen in the output shape through their strides (0 along
stretched dims), dims coalesced to at most 4, one program per BLOCK output elements."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from reference_kernels import _checks
from reference_kernels._triton import BLOCK, is_f64, launch_options

OP = "opscope::broadcast_add"


@triton.jit
def _add_kernel(a_ptr, b_ptr, o_ptr, n, S1, S2, S3, A0, A1, A2, A3, B0, B1, B2, B3,
                BLOCK: tl.constexpr, F64: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    i3 = offs % S3
    rest = offs // S3
    i2 = rest % S2
    rest = rest // S2
    i1 = rest % S1
    i0 = rest // S1
    a = tl.load(a_ptr + i0 * A0 + i1 * A1 + i2 * A2 + i3 * A3, mask=m, other=0.0)
    b = tl.load(b_ptr + i0 * B0 + i1 * B1 + i2 * B2 + i3 * B3, mask=m, other=0.0)
    if F64:
        s = a.to(tl.float64) + b.to(tl.float64)
    else:
        s = a.to(tl.float32) + b.to(tl.float32)
    tl.store(o_ptr + offs, s.to(o_ptr.dtype.element_ty), mask=m)


def _coalesce(shape: list[int], sa: list[int], sb: list[int]) -> tuple[list[int], list[int], list[int]]:
    sizes: list[int] = []
    ka: list[int] = []
    kb: list[int] = []
    for n, x, y in zip(shape, sa, sb, strict=True):
        if n == 1:
            continue
        if sizes and ka[-1] == x * n and kb[-1] == y * n:
            sizes[-1] *= n
            ka[-1], kb[-1] = x, y
        else:
            sizes.append(n)
            ka.append(x)
            kb.append(y)
    return sizes or [1], ka or [0], kb or [0]


def broadcast_add_forward(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    _checks.same_device(OP, a=a, b=b)
    _checks.floating(a, OP, "a")
    _checks.same_dtype(OP, a, b, "a", "b")
    shape = _checks.broadcast_shape(a.shape, b.shape, OP)
    out = torch.empty(shape, dtype=a.dtype, device=a.device)
    if out.numel() == 0:
        return out
    ea, eb = a.expand(shape), b.expand(shape)
    sizes, sa, sb = _coalesce(shape, list(ea.stride()), list(eb.stride()))
    if len(sizes) > 4:  # rare: more than 4 non-mergeable dims; copy to contiguous
        ea, eb = ea.contiguous(), eb.contiguous()
        sizes, sa, sb = [out.numel()], [1], [1]
    pad = 4 - len(sizes)
    sizes, sa, sb = [1] * pad + sizes, [0] * pad + sa, [0] * pad + sb
    opts = launch_options("broadcast_add", "broadcast_add_forward", (a, b), BLOCK, block_is_knob=True)
    _add_kernel[(triton.cdiv(out.numel(), opts["BLOCK"]),)](ea, eb, out, out.numel(), sizes[1], sizes[2], sizes[3],
                                                            *sa, *sb, F64=is_f64(a), **opts)
    return out
