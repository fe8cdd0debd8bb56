"""opscope::rms_norm(x, weight, eps) = x * rsqrt(mean(x^2 over weight's dims) + eps) * weight, one pass
per row; weight's shape is the trailing dims of x. A weight of another floating dtype is converted to the
accumulation dtype explicitly; the output has x's dtype. Backward recomputes rstd (see cpu.cpp)."""

from __future__ import annotations

import torch

from reference_kernels import _checks, _dispatch
from reference_kernels._registry import CustomOp
from reference_kernels._samples import randn_factory

OP = "opscope::rms_norm"


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    _checks.same_device(OP, x=x, weight=weight)
    _checks.floating(x, OP, "x")
    _checks.floating(weight, OP, "weight")
    k = weight.dim()
    if k < 1 or x.dim() < k or tuple(x.shape[x.dim() - k:]) != tuple(weight.shape):
        raise ValueError(f"{OP}: weight's shape {list(weight.shape)} must equal the trailing dims of x's shape "
                         f"{list(x.shape)}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return _dispatch.call("rms_norm", "rms_norm_forward", x.device, x, weight, eps)


def _fake(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    _check(x, weight)
    return x.new_empty(x.shape)


def rms_norm_backward(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                      eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _dispatch.call("rms_norm", "rms_norm_backward", x.device, grad, x, weight, eps)


def _backward_fake(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    _check(x, weight)
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


def _setup(ctx, inputs, output) -> None:  # noqa: ANN001
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def _backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN202
    x, weight = ctx.saved_tensors
    dx, dw = torch.ops.opscope.rms_norm_backward(grad, x, weight, ctx.eps)
    return dx, dw, None


# Registered by reference_kernels.load("rms_norm") on first use, not at import.
OPS = (CustomOp(OP, rms_norm, fake=_fake, backward=_backward, setup_context=_setup),
       CustomOp("opscope::rms_norm_backward", rms_norm_backward, fake=_backward_fake))


def composite(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """The hand-written RMSNorm of LLaMA-style models (pow, mean, add, rsqrt, mul, mul)."""
    dims = tuple(range(x.dim() - weight.dim(), x.dim()))
    return x * torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + eps) * weight


def native(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return torch.nn.functional.rms_norm(x, tuple(weight.shape), weight, eps)


def samples(dtype: torch.dtype = torch.float32, seed: int = 0) -> list[tuple]:
    r = randn_factory(dtype, seed)
    return [(r(4, 8), r(8), 1e-6), (r(3, 5, 33), r(33), 1e-5), (r(6, 4).t(), r(6), 1e-6), (r(2, 3, 4), r(3, 4), 1e-6),
            (r(16, 100) * 30, r(100), 1e-6)]


def large_sample(dtype: torch.dtype = torch.float32) -> tuple:
    r = randn_factory(dtype, 1)
    return (r(256, 1024), r(1024), 1e-6)


def context_args(shape: tuple[int, ...], inputs: list[tuple[int, ...]], concrete: list[str],
                 dtype: torch.dtype) -> tuple | None:
    """The kernel's arguments for a profiled op row (the interface: reference_kernels/README.md)."""
    if not shape:
        return None
    r = randn_factory(dtype, 0)
    return (r(*shape), r(shape[-1]), 1e-6)
