"""opscope::broadcast_add(a, b) = a + b for any two broadcastable shapes (see cpu.cpp for the loop).

Autograd: the gradient of an input that was stretched is the output gradient summed over the stretched
dims and reshaped back to the input's shape (Tensor.sum_to_size)."""

from __future__ import annotations

import torch

from reference_kernels import _checks, _dispatch
from reference_kernels._registry import CustomOp
from reference_kernels._samples import randn_factory

OP = "opscope::broadcast_add"


def broadcast_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _dispatch.call("broadcast_add", "broadcast_add_forward", a.device, a, b)


def _fake(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    _checks.same_device(OP, a=a, b=b)
    _checks.floating(a, OP, "a")
    _checks.same_dtype(OP, a, b, "a", "b")
    return a.new_empty(_checks.broadcast_shape(a.shape, b.shape, OP))


def _setup(ctx, inputs, output) -> None:  # noqa: ANN001
    a, b = inputs
    ctx.shapes = (a.shape, b.shape)


def _backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN202
    sa, sb = ctx.shapes
    ga = grad.sum_to_size(sa) if ctx.needs_input_grad[0] else None
    gb = grad.sum_to_size(sb) if ctx.needs_input_grad[1] else None
    return ga, gb


# Registered by reference_kernels.load("broadcast_add") on first use, not at import.
OPS = (CustomOp(OP, broadcast_add, fake=_fake, backward=_backward, setup_context=_setup),)


def entry_point(a: torch.Tensor | float, b: torch.Tensor | float) -> torch.Tensor:
    """`reference_kernels.broadcast_add`: the op, also taking a Python number on either side (as a 0-d
    tensor of the other operand's dtype and device), as `a + b` does."""
    if not isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        a = torch.tensor(a, dtype=b.dtype, device=b.device)
    if not isinstance(b, torch.Tensor) and isinstance(a, torch.Tensor):
        b = torch.tensor(b, dtype=a.dtype, device=a.device)
    return torch.ops.opscope.broadcast_add(a, b)


def composite(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """What the kernel replaces, in eager PyTorch (the reference in the tests and benchmarks)."""
    return a + b


native = composite  # the native aten op: aten::add.Tensor


def samples(dtype: torch.dtype = torch.float32, seed: int = 0) -> list[tuple]:
    """The broadcast matrix, scalars (0-d) on either side, and non-contiguous / expanded operands."""
    r = randn_factory(dtype, seed)
    return [
        (r(2, 3), r(2, 3)), (r(2, 3), r(3)), (r(4, 1, 6), r(5, 1)), (r(5, 1), r(4, 1, 6)),
        (r(), r(2, 3)), (r(2, 3), r()), (r(), r()),
        (r(3, 2).t(), r(6)[::2]),                      # transposed + strided
        (r(4, 3).expand(2, 4, 3), r(2, 1, 3)),         # expanded (stride 0) input
        (r(3, 70, 5).permute(2, 0, 1), r(70)),         # permuted, long inner run
    ]


def large_sample(dtype: torch.dtype = torch.float32) -> tuple:
    r = randn_factory(dtype, 1)
    return (r(256, 1024), r(1024))


def context_args(shape: tuple[int, ...], inputs: list[tuple[int, ...]], concrete: list[str],
                 dtype: torch.dtype) -> tuple | None:
    """The kernel's arguments for a profiled op row (the interface: reference_kernels/README.md)."""
    if len(inputs) < 2:  # a scalar operand: not this kernel's call
        return None
    r = randn_factory(dtype, 0)
    return (r(*inputs[0]), r(*inputs[1]))
