"""Matrix products. FLOPs = 2*M*N*K per (batch) product, as torch.utils.flop_counter counts them; a fused
bias/accumulator (addmm's self, baddbmm's self, ...) adds no FLOPs, only its bytes (and is not read
at all when beta == 0). Bytes = A + B (+ bias) storage read + output written."""

from __future__ import annotations

import math

from opscope.costmodel.base import (
    ITEMSIZE,
    Cost,
    OpCall,
    TensorArg,
    composite,
    register,
    register_bias_copied_by_child,
    scalar_type,
)

BIAS_COPY_NOTE = "bias written into the output by the child copy_ (counted there)"


def _gemm(call: OpCall, a: TensorArg, b: TensorArg, flops: float, out_shape: tuple[int, ...],
          bias: TensorArg | None = None, beta_index: int | None = None, out_dtype: str | None = None) -> Cost:
    read = a.storage_bytes + b.storage_bytes
    beta = call.arg(beta_index, 1) if beta_index is not None else 1
    if bias is not None and beta != 0:
        read += bias.storage_bytes
    dtype = out_dtype or a.dtype
    written = math.prod(out_shape) * ITEMSIZE.get(dtype, 4)
    return Cost(flops, read + written, "matmul")


def _extras(call: OpCall, first: int) -> tuple[int | None, str | None]:
    """Position of beta and the output dtype, for the overloads sharing a name: (self, mat1, mat2,
    beta, alpha[, out]) vs the `.dtype` ones (self, mat1, mat2, out_dtype, beta, alpha[, out]), and
    mm/bmm's (self, mat2[, out_dtype][, out]). out= tensors give the dtype directly."""
    scalars = [i for i in range(first, call.nargs) if call.tensor(i) is None]
    outs = [t for t in (call.tensor(i) for i in range(first, call.nargs)) if t is not None]
    out_dtype = outs[0].dtype if outs else None
    if len(scalars) in (1, 3):  # mm.dtype / addmm.dtype: out_dtype first
        out_dtype = out_dtype or scalar_type(call.arg(scalars[0]))
        scalars = scalars[1:]
    return (scalars[0] if scalars else None), out_dtype


@register("aten::mm")
def mm(call: OpCall) -> Cost:
    """mm(self [M,K], mat2 [K,N]): 2*M*N*K."""
    a, b = call.required_tensor(0, ndim=2), call.required_tensor(1, ndim=2)
    (m, k), (_, n) = a.shape, b.shape
    return _gemm(call, a, b, 2 * m * n * k, (m, n), out_dtype=_extras(call, 2)[1])


@register("aten::addmm", "aten::addmm_")
def addmm(call: OpCall) -> Cost:
    """addmm(self=bias, mat1 [M,K], mat2 [K,N], beta, alpha): 2*M*N*K; the bias adds bytes only."""
    bias, a, b = call.tensor(0), call.required_tensor(1, ndim=2), call.required_tensor(2, ndim=2)
    (m, k), (_, n) = a.shape, b.shape
    beta, out_dtype = _extras(call, 3)
    return _gemm(call, a, b, 2 * m * n * k, (m, n), bias, beta, out_dtype)


@register("aten::_addmm_activation")
def addmm_activation(call: OpCall) -> Cost:
    """addmm + fused relu/gelu epilogue: 2*M*N*K (+1 or 8 per output element)."""
    bias, a, b = call.tensor(0), call.required_tensor(1, ndim=2), call.required_tensor(2, ndim=2)
    (m, k), (_, n) = a.shape, b.shape
    act = 8 if call.arg(5, False) is True else 1
    return _gemm(call, a, b, 2 * m * n * k + act * m * n, (m, n), bias, 3)


@register_bias_copied_by_child("aten::addmm", "aten::baddbmm", "aten::_addmm_activation")
def gemm_after_bias_copy(call: OpCall) -> Cost:
    """On CPU, addmm(bias, A, B) runs copy_(out, bias.expand(...)) as a child and then accumulates A @ B
    into out (so do baddbmm and _addmm_activation, whose activation is a child relu_/gelu_ there too). The
    child counts the bias read and the output write; the op counts 2*M*N*K (batched: 2*B*M*N*K) and the A
    and B reads: together the minimum traffic of one addmm, as on a GPU where no such child exists."""
    a, b = call.required_tensor(1, min_ndim=2), call.required_tensor(2, min_ndim=1)
    *batch, m, k = a.shape
    n = b.shape[-1]
    return Cost(2 * math.prod(batch) * m * n * k, a.storage_bytes + b.storage_bytes, "matmul", BIAS_COPY_NOTE)


@register("aten::bmm")
def bmm(call: OpCall) -> Cost:
    """bmm(self [B,M,K], mat2 [B,K,N]): 2*B*M*N*K."""
    a, b = call.required_tensor(0, ndim=3), call.required_tensor(1, ndim=3)
    (bs, m, k), (_, _, n) = a.shape, b.shape
    return _gemm(call, a, b, 2 * bs * m * n * k, (bs, m, n), out_dtype=_extras(call, 2)[1])


@register("aten::baddbmm", "aten::baddbmm_")
def baddbmm(call: OpCall) -> Cost:
    """baddbmm(self, batch1 [B,M,K], batch2 [B,K,N], beta, alpha): 2*B*M*N*K."""
    c, a, b = call.tensor(0), call.required_tensor(1, ndim=3), call.required_tensor(2, ndim=3)
    (bs, m, k), (_, _, n) = a.shape, b.shape
    beta, out_dtype = _extras(call, 3)
    return _gemm(call, a, b, 2 * bs * m * n * k, (bs, m, n), c, beta, out_dtype)


@register("aten::addbmm", "aten::addbmm_")
def addbmm(call: OpCall) -> Cost:
    """addbmm(self [M,N], batch1 [B,M,K], batch2 [B,K,N], beta, alpha): 2*B*M*N*K, output [M,N]."""
    c, a, b = call.tensor(0), call.required_tensor(1, ndim=3), call.required_tensor(2, ndim=3)
    (bs, m, k), (_, _, n) = a.shape, b.shape
    return _gemm(call, a, b, 2 * bs * m * n * k, (m, n), c, 3)


@register("aten::addmv", "aten::addmv_")
def addmv(call: OpCall) -> Cost:
    """addmv(self [M], mat [M,N], vec [N], beta, alpha): 2*M*N."""
    c, a, v = call.tensor(0), call.required_tensor(1, ndim=2), call.required_tensor(2)
    m, n = a.shape
    return _gemm(call, a, v, 2 * m * n, (m,), c, 3)


@register("aten::mv")
def mv(call: OpCall) -> Cost:
    """mv(self [M,N], vec [N]): 2*M*N."""
    a, v = call.required_tensor(0, ndim=2), call.required_tensor(1)
    m, n = a.shape
    return _gemm(call, a, v, 2 * m * n, (m,))


@register("aten::dot", "aten::vdot")
def dot(call: OpCall) -> Cost:
    """dot(a [N], b [N]): 2*N, one output element."""
    a, b = call.required_tensor(0), call.required_tensor(1)
    return _gemm(call, a, b, 2 * a.numel, ())


@register("aten::_scaled_mm")
def scaled_mm(call: OpCall) -> Cost:
    """_scaled_mm(self [M,K], mat2 [K,N], scale_a, scale_b, bias, scale_result, out_dtype, ...):
    2*M*N*K (FP8 GEMM); output dtype from out_dtype, else the input's."""
    a, b = call.required_tensor(0, ndim=2), call.required_tensor(1, ndim=2)
    (m, k), (_, n) = a.shape, b.shape
    extra = sum(t.storage_bytes for t in (call.tensor(2), call.tensor(3), call.tensor(4), call.tensor(5)) if t)
    out_dtype = scalar_type(call.arg(6)) or a.dtype
    cost = _gemm(call, a, b, 2 * m * n * k, (m, n), out_dtype=out_dtype)
    return Cost(cost.flops, cost.bytes + extra, "matmul")


@register("aten::_int_mm")
def int_mm(call: OpCall) -> Cost:
    """_int_mm(int8 [M,K], int8 [K,N]) -> int32 [M,N]: 2*M*N*K."""
    a, b = call.required_tensor(0, ndim=2), call.required_tensor(1, ndim=2)
    (m, k), (_, n) = a.shape, b.shape
    return _gemm(call, a, b, 2 * m * n * k, (m, n), out_dtype="int")


# Always delegate to mm/bmm/mv/dot/addmm (CompositeImplicit, every device); see the package docstring.
for _name in ("linear", "matmul", "einsum", "bilinear", "tensordot", "outer", "ger", "inner",
              "chain_matmul", "linalg_multi_dot"):
    register(f"aten::{_name}")(composite)
