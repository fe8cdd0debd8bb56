"""opscope::bias_gelu(x, bias, approximate="none") = gelu(x + bias): the bias add of a Linear fused into
the GELU after it (erf or tanh form). Backward: dx = g * gelu'(x + bias), dbias = dx summed over rows."""

from __future__ import annotations

import torch

from reference_kernels import _checks, _dispatch
from reference_kernels._registry import CustomOp
from reference_kernels._samples import randn_factory

OP = "opscope::bias_gelu"


def bias_gelu(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return _dispatch.call("bias_gelu", "bias_gelu_forward", x.device, x, bias, approximate)


def _check(x: torch.Tensor, bias: torch.Tensor, approximate: str) -> None:
    _checks.same_device(OP, x=x, bias=bias)
    _checks.floating(x, OP, "x")
    _checks.floating(bias, OP, "bias")
    if approximate not in ("none", "tanh"):
        raise ValueError(f"{OP}: approximate must be 'none' or 'tanh', got {approximate!r}")
    if x.dim() < 1 or bias.dim() != 1 or bias.shape[0] != x.shape[-1]:
        raise ValueError(f"{OP}: bias must be 1-D with x's last dim, got {list(bias.shape)} for x {list(x.shape)}")


def _fake(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    _check(x, bias, approximate)
    return x.new_empty(x.shape)


def bias_gelu_backward(grad: torch.Tensor, x: torch.Tensor, bias: torch.Tensor,
                       approximate: str) -> tuple[torch.Tensor, torch.Tensor]:
    return _dispatch.call("bias_gelu", "bias_gelu_backward", x.device, grad, x, bias, approximate)


def _backward_fake(grad: torch.Tensor, x: torch.Tensor, bias: torch.Tensor, approximate: str) -> tuple[torch.Tensor, torch.Tensor]:
    _check(x, bias, approximate)
    return x.new_empty(x.shape), bias.new_empty(bias.shape)


def _setup(ctx, inputs, output) -> None:  # noqa: ANN001
    x, bias, approximate = inputs
    ctx.save_for_backward(x, bias)
    ctx.approximate = approximate


def _backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN202
    x, bias = ctx.saved_tensors
    dx, dbias = torch.ops.opscope.bias_gelu_backward(grad, x, bias, ctx.approximate)
    return dx, dbias, None


# Registered by reference_kernels.load("bias_gelu") on first use, not at import.
OPS = (CustomOp(OP, bias_gelu, fake=_fake, backward=_backward, setup_context=_setup),
       CustomOp("opscope::bias_gelu_backward", bias_gelu_backward, fake=_backward_fake))


def composite(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """The eager chain it replaces: the bias add, then GELU (two passes over memory)."""
    return torch.nn.functional.gelu(x + bias, approximate=approximate)


native = None  # no single aten op does both


def samples(dtype: torch.dtype = torch.float32, seed: int = 0) -> list[tuple]:
    r = randn_factory(dtype, seed)
    wide = r(4, 40) * 4  # reaches the tails (|x| ~ 10) where a poor erf shows
    return [(r(2, 3, 8), r(8), "none"), (r(5, 33), r(33), "tanh"), (wide, r(40), "none"), (wide, r(40), "tanh"),
            (r(6, 4).t(), r(6), "none"), (r(1, 17), r(17), "tanh")]


def large_sample(dtype: torch.dtype = torch.float32) -> tuple:
    r = randn_factory(dtype, 1)
    return (r(256, 1024), r(1024), "none")


def context_args(shape: tuple[int, ...], inputs: list[tuple[int, ...]], concrete: list[str],
                 dtype: torch.dtype) -> tuple | None:
    """The kernel's arguments for a profiled op row (the interface: reference_kernels/README.md)."""
    if not shape:
        return None
    r = randn_factory(dtype, 0)
    return (r(*shape), r(shape[-1]), "tanh" if any("tanh" in c for c in concrete) else "none")
