"""opscope::layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5), F.layer_norm's signature:
one Welford pass for mean and variance per row, then the normalize + affine write (see cpu.cpp).
Backward recomputes the row statistics; absent weight/bias get no gradient."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from reference_kernels import _checks, _dispatch
from reference_kernels._registry import CustomOp
from reference_kernels._samples import randn_factory

OP = "opscope::layer_norm"


def _check(x: torch.Tensor, shape: Sequence[int], weight: torch.Tensor | None, bias: torch.Tensor | None) -> None:
    _checks.same_device(OP, x=x, weight=weight, bias=bias)
    _checks.floating(x, OP, "x")
    k = len(shape)
    if k < 1 or x.dim() < k or tuple(x.shape[x.dim() - k:]) != tuple(shape):
        raise ValueError(f"{OP}: normalized_shape {list(shape)} must equal the trailing dims of x's shape "
                         f"{list(x.shape)}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            _checks.floating(t, OP, name)
            if tuple(t.shape) != tuple(shape):
                raise ValueError(f"{OP}: {name} must have shape normalized_shape {list(shape)}, got {list(t.shape)}")


def layer_norm(x: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    return _dispatch.call("layer_norm", "layer_norm_forward", x.device, x, list(normalized_shape), weight, bias, eps)


def _fake(x, normalized_shape, weight=None, bias=None, eps=1e-5):  # noqa: ANN001, ANN202
    _check(x, normalized_shape, weight, bias)
    return x.new_empty(x.shape)


def layer_norm_backward(grad: torch.Tensor, x: torch.Tensor, normalized_shape: Sequence[int],
                        weight: torch.Tensor | None, bias: torch.Tensor | None,
                        eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _dispatch.call("layer_norm", "layer_norm_backward", x.device, grad, x, list(normalized_shape), weight,
                          bias, eps)


def _backward_fake(grad, x, normalized_shape, weight, bias, eps):  # noqa: ANN001, ANN202
    _check(x, normalized_shape, weight, bias)
    return (x.new_empty(x.shape), weight.new_empty(weight.shape) if weight is not None else x.new_empty(0),
            bias.new_empty(bias.shape) if bias is not None else x.new_empty(0))


def _setup(ctx, inputs, output) -> None:  # noqa: ANN001
    x, shape, weight, bias, eps = inputs
    ctx.save_for_backward(x, weight, bias)
    ctx.shape, ctx.eps = list(shape), eps


def _backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN202
    x, weight, bias = ctx.saved_tensors
    dx, dw, db = torch.ops.opscope.layer_norm_backward(grad, x, ctx.shape, weight, bias, ctx.eps)
    return dx, None, dw if weight is not None else None, db if bias is not None else None, None


# Registered by reference_kernels.load("layer_norm") on first use, not at import.
OPS = (CustomOp(OP, layer_norm, fake=_fake, backward=_backward, setup_context=_setup),
       CustomOp("opscope::layer_norm_backward", layer_norm_backward, fake=_backward_fake))


def composite(x: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor | None = None,
              bias: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    """Layer norm written out in eager ops (mean, var, sub, mul, mul, add)."""
    dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))
    mean = x.mean(dims, keepdim=True)
    var = (x - mean).pow(2).mean(dims, keepdim=True)
    y = (x - mean) * torch.rsqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def native(x: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor | None = None,
           bias: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, list(normalized_shape), weight, bias, eps)


def samples(dtype: torch.dtype = torch.float32, seed: int = 0) -> list[tuple]:
    r = randn_factory(dtype, seed)
    shifted = r(6, 70) + 100.0  # mean >> std: sum-of-squares variance would cancel, Welford does not
    return [(r(4, 8), [8], r(8), r(8), 1e-5), (r(3, 5, 33), [33], r(33), r(33), 1e-5),
            (r(6, 4).t(), [6], r(6), None, 1e-5), (r(2, 3, 4), [3, 4], None, None, 1e-5),
            (shifted, [70], r(70), r(70), 1e-5), (r(5, 65), [65], r(65), r(65), 1e-3)]


def large_sample(dtype: torch.dtype = torch.float32) -> tuple:
    r = randn_factory(dtype, 1)
    return (r(256, 1024), [1024], r(1024), r(1024), 1e-5)


def bench_args(tensors: list[torch.Tensor], kwargs: dict) -> tuple:
    x, weight, bias = tensors
    return (x, list(weight.shape), weight, bias, kwargs.get("eps", 1e-5))


def context_args(shape: tuple[int, ...], inputs: list[tuple[int, ...]], concrete: list[str],
                 dtype: torch.dtype) -> tuple | None:
    """The kernel's arguments for a profiled op row (the interface: reference_kernels/README.md)."""
    if not shape:
        return None
    r = randn_factory(dtype, 0)
    return (r(*shape), [shape[-1]], r(shape[-1]), r(shape[-1]), 1e-5)
