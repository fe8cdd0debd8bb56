"""opscope::softmax(x, scale=1.0, mask=None) = softmax(x * scale + mask, dim=-1): attention's scaled,
masked softmax in one kernel; the additive mask (0 keeps, -inf drops) broadcasts to x without being
materialized. Backward from the saved output; the mask gets a gradient too when it requires one."""

from __future__ import annotations

import torch

from reference_kernels import _checks, _dispatch
from reference_kernels._registry import CustomOp
from reference_kernels._samples import randn_factory

OP = "opscope::softmax"


def _check(x: torch.Tensor, mask: torch.Tensor | None) -> None:
    _checks.same_device(OP, x=x, mask=mask)
    _checks.floating(x, OP, "x")
    if x.dim() < 1:
        raise ValueError(f"{OP}: x must have at least one dim")
    if mask is not None:
        if not mask.is_floating_point():
            raise RuntimeError(f"{OP}: mask must be an additive floating mask (0 keeps, -inf drops), got "
                               f"{mask.dtype}; convert a boolean mask with torch.where(mask, 0.0, -inf)")
        if _checks.broadcast_shape(x.shape, mask.shape, OP, "x", "mask") != list(x.shape):
            raise ValueError(f"{OP}: mask of shape {list(mask.shape)} must broadcast to x's shape {list(x.shape)} "
                             "without growing it")


def softmax(x: torch.Tensor, scale: float = 1.0, mask: torch.Tensor | None = None) -> torch.Tensor:
    return _dispatch.call("softmax", "softmax_forward", x.device, x, scale, mask)


def _fake(x: torch.Tensor, scale: float = 1.0, mask: torch.Tensor | None = None) -> torch.Tensor:
    _check(x, mask)
    return x.new_empty(x.shape)


def softmax_backward(grad: torch.Tensor, y: torch.Tensor, scale: float) -> torch.Tensor:
    return _dispatch.call("softmax", "softmax_backward", y.device, grad, y, scale)


def _backward_fake(grad: torch.Tensor, y: torch.Tensor, scale: float) -> torch.Tensor:
    return y.new_empty(y.shape)


def _setup(ctx, inputs, output) -> None:  # noqa: ANN001
    x, scale, mask = inputs
    ctx.save_for_backward(output)
    ctx.scale = scale
    ctx.mask_shape = None if mask is None else mask.shape
    ctx.mask_dtype = None if mask is None else mask.dtype


def _backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN202
    (y,) = ctx.saved_tensors
    if ctx.mask_shape is not None and ctx.needs_input_grad[2]:
        dz = torch.ops.opscope.softmax_backward(grad, y, 1.0)  # d/dz of z = x * scale + mask
        return dz * ctx.scale, None, dz.sum_to_size(ctx.mask_shape).to(ctx.mask_dtype)
    return torch.ops.opscope.softmax_backward(grad, y, ctx.scale), None, None


# Registered by reference_kernels.load("softmax") on first use, not at import.
OPS = (CustomOp(OP, softmax, fake=_fake, backward=_backward, setup_context=_setup),
       CustomOp("opscope::softmax_backward", softmax_backward, fake=_backward_fake))


def composite(x: torch.Tensor, scale: float = 1.0, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The eager chain it replaces in attention: scale, add the mask, softmax."""
    z = x * scale
    if mask is not None:
        z = z + mask
    return torch.softmax(z, dim=-1)


def native(x: torch.Tensor, scale: float = 1.0, mask: torch.Tensor | None = None) -> torch.Tensor:
    return torch.softmax(x if scale == 1.0 and mask is None else composite(x, scale, mask), dim=-1)


def causal_mask(n: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.full((n, n), float("-inf"), dtype=dtype, device=device).triu(1)


def samples(dtype: torch.dtype = torch.float32, seed: int = 0) -> list[tuple]:
    r = randn_factory(dtype, seed)
    return [(r(4, 8), 1.0, None), (r(2, 3, 33), 0.125, None), (r(2, 2, 5, 5), 0.5, causal_mask(5, dtype)),
            (r(3, 4, 17), 1.0, r(4, 1)), (r(6, 4).t(), 2.0, r(6)), (r(5, 40) * 20, 1.0, None)]


def large_sample(dtype: torch.dtype = torch.float32) -> tuple:
    r = randn_factory(dtype, 1)
    return (r(256, 1024), 0.125, r(1024))


def bench_args(tensors: list[torch.Tensor], kwargs: dict) -> tuple:
    x = tensors[0]
    # on x's device: a benchmark on the GPU is given GPU inputs and every tensor it builds must follow
    mask = causal_mask(x.shape[-1], x.dtype, x.device) if len(tensors) > 1 else None
    return (x, kwargs.get("scale", 1.0), mask)


def context_args(shape: tuple[int, ...], inputs: list[tuple[int, ...]], concrete: list[str],
                 dtype: torch.dtype) -> tuple | None:
    """The kernel's arguments for a profiled op row (the interface: reference_kernels/README.md)."""
    if not shape:
        return None
    return (randn_factory(dtype, 0)(*shape), 1.0, None)
