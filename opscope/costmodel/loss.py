"""Loss functions. reduction: 0 = none (one loss per element), 1 = mean, 2 = sum (one scalar).

mse_loss, smooth_l1_loss, huber_loss and binary_cross_entropy compute the unreduced loss into a tensor of
the input's shape and then reduce it in a child op (CPU and CUDA alike: Loss.cpp's mse_loss_out /
smooth_l1_loss_out run a TensorIterator into `loss`, then at::mean_out / at::sum_out; huber_loss and
binary_cross_entropy call apply_loss_reduction -> mean() / sum(), then copy_ the scalar into the result;
a BCE weight is applied by a child mul_). So the parent counts the element-wise work and the unreduced
write, whatever the reduction, and the child aten::mean / aten::sum (+ mul_, copy_) counts the rest --
each once. FLOPs per element: mse 2 (subtract, square), smooth_l1/huber 4 (subtract, abs, compare,
quadratic-or-linear branch), binary_cross_entropy 9 (log, negate + log1p, two clamps at -100, target - 1,
two products, subtract: the kernels' formula). smooth_l1_loss with beta == 0 runs as l1_loss children
(sub, abs, mean): a composite.

nll_loss reduces inside its own kernel: 2 per target element (weight/negate + accumulate), reads the
target and only the selected log-probabilities, writes the (reduced) output and total_weight.
Backward, per element of grad_input (written once, shaped like the input): nll 1 per target element
(its zero-fill is the child aten::zero_), mse 3 (norm * (x - y) * grad), smooth_l1/huber 4,
binary_cross_entropy 6 (grad * (x - y) / max((1 - x) * x, eps)); mean's 1/N is folded into `norm` (mse,
smooth_l1, huber) or applied by a child div_ (binary_cross_entropy), counted there.
"""

from __future__ import annotations

import math

from opscope.costmodel.base import Cost, CostFn, OpCall, broadcast_shapes, composite, register


def _reduced_numel(numel: int, reduction: object) -> int:
    """Loss values written: one per element for reduction 0 (none), else one."""
    return numel if reduction == 0 else 1


@register("aten::nll_loss_forward", "aten::nll_loss2d_forward")
def nll_loss_forward(call: OpCall) -> Cost:
    """(self [N, C, ...] log-probabilities, target [N, ...], weight [C]?, reduction, ignore_index) ->
    (output, total_weight)."""
    x, target, weight = call.required_tensor(0), call.required_tensor(1), call.tensor(2)
    n = target.numel
    read = target.storage_bytes + n * x.itemsize + (n * weight.itemsize if weight is not None else 0)
    written = (_reduced_numel(n, call.arg(3, 1)) + 1) * x.itemsize
    return Cost(2 * n, read + written, "loss")


@register("aten::nll_loss_backward", "aten::nll_loss2d_backward")
def nll_loss_backward(call: OpCall) -> Cost:
    """(grad_output, self, target, weight, reduction, ignore_index, total_weight): one value per target
    element scattered into grad_input (shaped like self); its zero-fill is the child aten::zero_
    (CPU and CUDA), counted there."""
    grad, x, target, weight = call.required_tensor(0), call.required_tensor(1), call.required_tensor(2), call.tensor(3)
    n = target.numel
    read = grad.storage_bytes + target.storage_bytes + (n * weight.itemsize if weight is not None else 0)
    return Cost(n, read + n * x.itemsize, "loss")


def _unreduced_loss(per_elem: float, beta_index: int | None = None) -> CostFn:
    """(self, target, reduction[, beta/delta]): the element-wise loss written unreduced (the reduction,
    if any, is the child mean/sum)."""

    def cost(call: OpCall) -> Cost:
        if beta_index is not None and call.arg(beta_index, 1.0) == 0:
            return composite(call)  # smooth_l1_loss(beta=0) runs as l1_loss's sub/abs/mean children
        x, target = call.required_tensor(0), call.required_tensor(1)
        numel = math.prod(broadcast_shapes(x.shape, target.shape))
        return Cost(per_elem * numel, x.storage_bytes + target.storage_bytes + numel * x.itemsize, "loss")

    return cost


def _pointwise_loss_backward(per_elem: float) -> CostFn:
    """(grad_output, self, target, ...): grad_input shaped like self."""

    def cost(call: OpCall) -> Cost:
        grad, x, target = call.required_tensor(0), call.required_tensor(1), call.required_tensor(2)
        read = grad.storage_bytes + x.storage_bytes + target.storage_bytes
        return Cost(per_elem * x.numel, read + x.numel * x.itemsize, "loss")

    return cost


register("aten::mse_loss")(_unreduced_loss(2))
register("aten::mse_loss_backward")(_pointwise_loss_backward(3))
register("aten::smooth_l1_loss")(_unreduced_loss(4, beta_index=3))
register("aten::huber_loss")(_unreduced_loss(4))
register("aten::smooth_l1_loss_backward", "aten::huber_loss_backward")(_pointwise_loss_backward(4))
register("aten::binary_cross_entropy")(_unreduced_loss(9))  # its weight: the child mul_


@register("aten::binary_cross_entropy_backward")
def binary_cross_entropy_backward(call: OpCall) -> Cost:
    """(grad_output, self, target, weight, reduction): 6 per element; the weight and mean's 1/N are
    applied by child mul_ / div_ ops, counted there."""
    grad, x, target = call.required_tensor(0), call.required_tensor(1), call.required_tensor(2)
    read = grad.storage_bytes + x.storage_bytes + target.storage_bytes
    return Cost(6 * x.numel, read + x.numel * x.itemsize, "loss")


# Always delegate: cross_entropy_loss -> log_softmax + nll_loss_nd (or element-wise ops for soft
# targets / label smoothing); nll_loss_nd -> nll_loss / nll_loss2d -> nll_loss(2d)_forward; l1_loss,
# kl_div, binary_cross_entropy_with_logits and the margin/cosine losses are compositions of
# element-wise and reduction ops.
for _name in ("cross_entropy_loss", "nll_loss", "nll_loss_nd", "nll_loss2d", "l1_loss", "kl_div",
              "binary_cross_entropy_with_logits", "soft_margin_loss", "margin_ranking_loss",
              "cosine_embedding_loss", "hinge_embedding_loss", "poisson_nll_loss", "triplet_margin_loss"):
    register(f"aten::{_name}")(composite)
