"""opscope::swiglu(a, b) = silu(a) * b, the gated MLP activation of LLaMA-style blocks, in one pass.
Backward: da = g * b * s * (1 + a * (1 - s)), db = g * silu(a), s = sigmoid(a)."""

from __future__ import annotations

import torch

from reference_kernels import _checks, _dispatch
from reference_kernels._registry import CustomOp
from reference_kernels._samples import randn_factory

OP = "opscope::swiglu"


def _check(a: torch.Tensor, b: torch.Tensor) -> None:
    _checks.same_device(OP, a=a, b=b)
    _checks.floating(a, OP, "a")
    _checks.same_dtype(OP, a, b, "a", "b")
    if a.shape != b.shape:
        raise ValueError(f"{OP}: a and b must have the same shape, got {list(a.shape)} and {list(b.shape)}")


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _dispatch.call("swiglu", "swiglu_forward", a.device, a, b)


def _fake(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    _check(a, b)
    return a.new_empty(a.shape)


def swiglu_backward(grad: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _dispatch.call("swiglu", "swiglu_backward", a.device, grad, a, b)


def _backward_fake(grad: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    _check(a, b)
    return a.new_empty(a.shape), a.new_empty(a.shape)


def _setup(ctx, inputs, output) -> None:  # noqa: ANN001
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN202
    a, b = ctx.saved_tensors
    return torch.ops.opscope.swiglu_backward(grad, a, b)


# Registered by reference_kernels.load("swiglu") on first use, not at import.
OPS = (CustomOp(OP, swiglu, fake=_fake, backward=_backward, setup_context=_setup),
       CustomOp("opscope::swiglu_backward", swiglu_backward, fake=_backward_fake))


def composite(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The eager chain it replaces: silu, then the multiply (two passes)."""
    return torch.nn.functional.silu(a) * b


native = None


def samples(dtype: torch.dtype = torch.float32, seed: int = 0) -> list[tuple]:
    r = randn_factory(dtype, seed)
    return [(r(2, 3, 8), r(2, 3, 8)), (r(7, 33) * 6, r(7, 33)), (r(5, 4).t(), r(4, 5)), (r(3), r(3)), (r(), r())]


def large_sample(dtype: torch.dtype = torch.float32) -> tuple:
    r = randn_factory(dtype, 1)
    return (r(256, 1024), r(256, 1024))


def context_args(shape: tuple[int, ...], inputs: list[tuple[int, ...]], concrete: list[str],
                 dtype: torch.dtype) -> tuple | None:
    """The kernel's arguments for a profiled op row (the interface: reference_kernels/README.md)."""
    r = randn_factory(dtype, 0)
    return (r(*shape), r(*shape))
