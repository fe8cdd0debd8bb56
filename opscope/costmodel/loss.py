"""Loss functions. reduction: 0 = none (one loss per element), 1 = mean, 2 = sum (one scalar).
FLOPs per element: nll_loss 2 (weight/negate + accumulate; per target element), mse 3 (subtract,
square, accumulate; 2 when unreduced), smooth_l1/huber 5 (subtract, abs, compare, quadratic-or-linear
branch, accumulate), binary_cross_entropy 8 (two logs, 1 - x, 1 - y, two products, add, accumulate).
Backward: nll 1 per target element, mse 3, smooth_l1/huber 4, binary_cross_entropy 6.
Bytes: inputs read once (nll_loss reads the target and only the selected log-probabilities), output
written once; backward writes a grad_input shaped like the input (nll_loss_backward only scatters one
value per target: the zero-fill is its child aten::zero_).
"""

from __future__ import annotations

import math

from opscope.costmodel.base import Cost, OpCall, broadcast_shapes, composite, register


def _reduced_numel(numel: int, reduction) -> int:
    return numel if reduction == 0 else 1


@register("aten::nll_loss_forward", "aten::nll_loss2d_forward")
def nll_loss_forward(call: OpCall) -> Cost:
    """(self [N, C, ...] log-probabilities, target [N, ...], weight [C]?, reduction, ignore_index) ->
    (output, total_weight)."""
    x, target, weight = call.tensor(0), call.tensor(1), call.tensor(2)
    n = target.numel
    read = target.storage_bytes + n * x.itemsize + (n * weight.itemsize if weight is not None else 0)
    written = (_reduced_numel(n, call.arg(3, 1)) + 1) * x.itemsize
    return Cost(2 * n, read + written, "loss")


@register("aten::nll_loss_backward", "aten::nll_loss2d_backward")
def nll_loss_backward(call: OpCall) -> Cost:
    """(grad_output, self, target, weight, reduction, ignore_index, total_weight): one value per target
    element scattered into grad_input (shaped like self); its zero-fill is the child aten::zero_
    (CPU and CUDA), counted there."""
    grad, x, target, weight = call.tensor(0), call.tensor(1), call.tensor(2), call.tensor(3)
    n = target.numel
    read = grad.storage_bytes + target.storage_bytes + (n * weight.itemsize if weight is not None else 0)
    return Cost(n, read + n * x.itemsize, "loss")


def _pointwise_loss(per_elem: float, per_elem_unreduced: float | None = None):
    """(self, target, reduction, ...)."""

    def cost(call: OpCall) -> Cost:
        x, target = call.tensor(0), call.tensor(1)
        numel = math.prod(broadcast_shapes(x.shape, target.shape))
        reduction = call.arg(2, 1)
        flops_per = per_elem if reduction != 0 or per_elem_unreduced is None else per_elem_unreduced
        written = _reduced_numel(numel, reduction) * x.itemsize
        return Cost(flops_per * numel, x.storage_bytes + target.storage_bytes + written, "loss")

    return cost


def _pointwise_loss_backward(per_elem: float):
    """(grad_output, self, target, ...): grad_input shaped like self."""

    def cost(call: OpCall) -> Cost:
        grad, x, target = call.tensor(0), call.tensor(1), call.tensor(2)
        read = grad.storage_bytes + x.storage_bytes + target.storage_bytes
        return Cost(per_elem * x.numel, read + x.numel * x.itemsize, "loss")

    return cost


register("aten::mse_loss")(_pointwise_loss(3, 2))
register("aten::mse_loss_backward")(_pointwise_loss_backward(3))
register("aten::smooth_l1_loss", "aten::huber_loss")(_pointwise_loss(5))
register("aten::smooth_l1_loss_backward", "aten::huber_loss_backward")(_pointwise_loss_backward(4))


@register("aten::binary_cross_entropy")
def binary_cross_entropy(call: OpCall) -> Cost:
    """(self, target, weight, reduction): 8 per element (+ weight read)."""
    x, target, weight = call.tensor(0), call.tensor(1), call.tensor(2)
    written = _reduced_numel(x.numel, call.arg(3, 1)) * x.itemsize
    read = x.storage_bytes + target.storage_bytes + (weight.storage_bytes if weight is not None else 0)
    return Cost(8 * x.numel, read + written, "loss")


@register("aten::binary_cross_entropy_backward")
def binary_cross_entropy_backward(call: OpCall) -> Cost:
    """(grad_output, self, target, weight, reduction): 6 per element."""
    grad, x, target, weight = call.tensor(0), call.tensor(1), call.tensor(2), call.tensor(3)
    read = grad.storage_bytes + x.storage_bytes + target.storage_bytes
    read += weight.storage_bytes if weight is not None else 0
    return Cost(6 * x.numel, read + x.numel * x.itemsize, "loss")


# Always delegate: cross_entropy_loss -> log_softmax + nll_loss_nd (or element-wise ops for soft
# targets / label smoothing); nll_loss_nd -> nll_loss / nll_loss2d -> nll_loss(2d)_forward; l1_loss,
# kl_div, binary_cross_entropy_with_logits and the margin/cosine losses are compositions of
# element-wise and reduction ops.
for _name in ("cross_entropy_loss", "nll_loss", "nll_loss_nd", "nll_loss2d", "l1_loss", "kl_div",
              "binary_cross_entropy_with_logits", "soft_margin_loss", "margin_ranking_loss",
              "cosine_embedding_loss", "hinge_embedding_loss", "poisson_nll_loss", "triplet_margin_loss"):
    register(f"aten::{_name}")(composite)
