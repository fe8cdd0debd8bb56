"""opscope::sum(x, dim, keepdim=False): the sum over one dim, with the inner-contiguous ("rows") or
strided-outer ("columns") strategy chosen by shape and layout (see cpu.cpp); `strategy(x, dim)` says which.
Backward: the gradient broadcast back over the reduced dim."""

from __future__ import annotations

import torch

from reference_kernels import _checks, _dispatch
from reference_kernels._registry import CustomOp
from reference_kernels._samples import randn_factory, reduced_dim

OP = "opscope::sum"


def out_shape(x: torch.Tensor, dim: int, keepdim: bool, op: str) -> list[int]:
    nd = max(x.dim(), 1)
    if not -nd <= dim < nd:
        raise IndexError(f"{op}: dim {dim} is out of range for a tensor of {x.dim()} dims")
    d = dim % nd
    return [1 if i == d else s for i, s in enumerate(x.shape)] if keepdim else [s for i, s in enumerate(x.shape) if i != d]


def strategy(x: torch.Tensor, dim: int) -> str:
    """The CPU kernel's plan for this tensor: rows, rows-split, columns or columns-split, "copy+" first
    when the layout needs a contiguous copy."""
    from reference_kernels import _build

    _build.load_cpu_extension()
    return torch.ops.opscope_cpu.reduce_strategy(x, dim)


def sum_(x: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    return _dispatch.call("sum", "sum_forward", x.device, x, dim, keepdim)


def _fake(x: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    _checks.floating(x, OP, "x")
    return x.new_empty(out_shape(x, dim, keepdim, OP))


def expand_back(grad: torch.Tensor, shape: torch.Size, dim: int, keepdim: bool) -> torch.Tensor:
    if len(shape) and not keepdim:
        grad = grad.unsqueeze(dim % len(shape))
    return grad.expand(shape)


def _setup(ctx, inputs, output) -> None:  # noqa: ANN001
    x, dim, keepdim = inputs
    ctx.shape, ctx.dim, ctx.keepdim = x.shape, dim, keepdim


def _backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN202
    return expand_back(grad, ctx.shape, ctx.dim, ctx.keepdim), None, None


# Registered by reference_kernels.load("sum") on first use, not at import.
OPS = (CustomOp(OP, sum_, fake=_fake, backward=_backward, setup_context=_setup),)


def composite(x: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    return torch.sum(x, dim, keepdim=keepdim)


native = composite


def samples(dtype: torch.dtype = torch.float32, seed: int = 0) -> list[tuple]:
    """One sample per strategy: rows, columns, split rows, split columns, a layout needing a copy."""
    r = randn_factory(dtype, seed)
    return [(r(6, 50), -1, False), (r(5, 40, 7), 1, True), (r(40000), 0, False), (r(3000, 3), 0, False),
            (r(4, 3, 5).permute(1, 2, 0), 1, False), (r(8, 6).t(), 1, False), (r(), 0, False)]


def large_sample(dtype: torch.dtype = torch.float32) -> tuple:
    r = randn_factory(dtype, 1)
    return (r(512, 1024), 0, False)


def context_args(shape: tuple[int, ...], inputs: list[tuple[int, ...]], concrete: list[str],
                 dtype: torch.dtype) -> tuple | None:
    """The kernel's arguments for a profiled op row (the interface: reference_kernels/README.md)."""
    if not inputs or not inputs[0]:
        return None
    found = reduced_dim(concrete)
    if found is None:
        return None
    return (randn_factory(dtype, 0)(*inputs[0]), *found)
