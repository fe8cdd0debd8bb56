"""opscope::mean(x, dim, keepdim=False): the sum kernel (reference_kernels/sum) scaled by 1/R in the same
pass. Backward: the gradient / R broadcast back over the reduced dim."""

from __future__ import annotations

import torch

from reference_kernels import _checks, _dispatch
from reference_kernels._registry import CustomOp
from reference_kernels.sum.op import expand_back, out_shape, samples  # noqa: F401 - samples shared

OP = "opscope::mean"


def mean(x: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    return _dispatch.call("mean", "mean_forward", x.device, x, dim, keepdim)


def _fake(x: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    _checks.floating(x, OP, "x")
    return x.new_empty(out_shape(x, dim, keepdim, OP))


def _setup(ctx, inputs, output) -> None:  # noqa: ANN001
    x, dim, keepdim = inputs
    ctx.shape, ctx.dim, ctx.keepdim = x.shape, dim, keepdim
    ctx.count = x.shape[dim % x.dim()] if x.dim() else 1


def _backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN202
    return expand_back(grad / ctx.count, ctx.shape, ctx.dim, ctx.keepdim), None, None


# Registered by reference_kernels.load("mean") on first use, not at import.
OPS = (CustomOp(OP, mean, fake=_fake, backward=_backward, setup_context=_setup),)


def composite(x: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    return torch.mean(x, dim, keepdim=keepdim)


native = composite


def large_sample(dtype: torch.dtype = torch.float32) -> tuple:
    from reference_kernels.sum.op import large_sample as sum_large

    return sum_large(dtype)


def context_args(shape: tuple[int, ...], inputs: list[tuple[int, ...]], concrete: list[str],
                 dtype: torch.dtype) -> tuple | None:
    """The kernel's arguments for a profiled op row (the interface: reference_kernels/README.md): sum's."""
    from reference_kernels.sum.op import context_args as sum_args

    return sum_args(shape, inputs, concrete, dtype)
