"""Normalization layers. FLOPs per input element (package docstring table):

  layer/group norm, batch norm (training): mean (1) + variance (3: subtract, square, add) +
      normalize (2: subtract mean, multiply rstd) = 6, + 1 for an affine weight, + 1 for a bias (8).
  batch norm (eval, running stats): (x - mean) * invstd = 2, + 1 weight, + 1 bias (4).
  rms norm: square + add (2) + multiply by rstd (1) = 3, + 1 weight (4).
  backward, per element and per output_mask entry: grad_input 10 (recompute x_hat 2, g*w 1, two row
      sums with g*w*x_hat 3, combine 4; eval batch norm: g*w*invstd 2; rms norm 7), grad_weight 2,
      grad_bias 1.

Bytes: input, weight, bias (and running stats) read once; output and the per-row statistics
(float32 for half/bfloat16 inputs) written once.
"""

from __future__ import annotations

import math

from opscope.costmodel.base import Cost, OpCall, TensorArg, composite, register


def _stat_itemsize(x: TensorArg) -> int:
    return 4 if x.itemsize < 4 else x.itemsize


def _read(*tensors: TensorArg | None) -> int:
    return sum(t.storage_bytes for t in tensors if t is not None)


def _norm_forward(x: TensorArg, weight: TensorArg | None, bias: TensorArg | None, n_stat_rows: int, *,
                  stats_out: int = 2, base: float = 6, extra_read: int = 0) -> Cost:
    flops = (base + (weight is not None) + (bias is not None)) * x.numel
    written = x.numel * x.itemsize + stats_out * n_stat_rows * _stat_itemsize(x)
    return Cost(flops, _read(x, weight, bias) + extra_read + written, "norm")


@register("aten::native_layer_norm")
def native_layer_norm(call: OpCall) -> Cost:
    """(input, normalized_shape, weight, bias, eps) -> (out, mean, rstd)."""
    x, w, b = call.required_tensor(0), call.tensor(2), call.tensor(3)
    rows = x.numel // max(math.prod(call.ints_arg(1, [])), 1)
    return _norm_forward(x, w, b, rows)


@register("aten::native_group_norm")
def native_group_norm(call: OpCall) -> Cost:
    """(input, weight, bias, N, C, HxW, group, eps) -> (out, mean, rstd) with N*group statistics."""
    x, w, b = call.required_tensor(0), call.tensor(1), call.tensor(2)
    n, groups = call.int_arg(3), call.int_arg(6)
    return _norm_forward(x, w, b, n * groups)


def _batch_norm(call: OpCall, training: bool, has_running: bool) -> Cost:
    """Shared by the batch-norm variants laid out (input, weight, bias, running_mean, running_var, ...)."""
    x, w, b = call.required_tensor(0), call.tensor(1), call.tensor(2)
    rm = call.tensor(3) if has_running else None
    rv = call.tensor(4) if has_running else None
    c = x.shape[1] if len(x.shape) > 1 else 1
    if training:
        # running stats (if any) are read and updated: 2 * C reads + writes, negligible but counted
        extra = 2 * _read(rm, rv)
        return _norm_forward(x, w, b, c, extra_read=extra)
    return _norm_forward(x, w, b, c, base=2, stats_out=0, extra_read=_read(rm, rv))


@register("aten::native_batch_norm", "aten::_native_batch_norm_legit_functional")
def native_batch_norm(call: OpCall) -> Cost:
    """(input, weight, bias, running_mean, running_var, training, momentum, eps)."""
    return _batch_norm(call, call.arg(5, False) is True, True)


@register("aten::_native_batch_norm_legit")
def native_batch_norm_legit(call: OpCall) -> Cost:
    """(input, weight, bias, running_mean, running_var, training, momentum, eps), or the .no_stats
    overload (input, weight, bias, training, momentum, eps)."""
    if call.nargs <= 6:
        return _batch_norm(call, call.arg(3, False) is True, False)
    return _batch_norm(call, call.arg(5, False) is True, True)


@register("aten::_native_batch_norm_legit_no_training")
def native_batch_norm_legit_no_training(call: OpCall) -> Cost:
    """(input, weight, bias, running_mean, running_var, momentum, eps): eval-mode batch norm."""
    return _batch_norm(call, False, True)


@register("aten::cudnn_batch_norm", "aten::miopen_batch_norm")
def cudnn_batch_norm(call: OpCall) -> Cost:
    """(input, weight, bias, running_mean, running_var, training, exponential_average_factor, eps)."""
    return _batch_norm(call, call.arg(5, False) is True, True)


@register("aten::_fused_rms_norm")
def fused_rms_norm(call: OpCall) -> Cost:
    """(input, normalized_shape, weight, eps) -> (out, rstd). On CPU it runs as pow/mean/rsqrt/mul
    children (whose element-wise/reduction costs are then counted too); on CUDA it is one kernel."""
    x, w = call.required_tensor(0), call.tensor(2)
    rows = x.numel // max(math.prod(call.ints_arg(1, [])), 1)
    return _norm_forward(x, w, None, rows, base=3, stats_out=1)


# --- backward ----------------------------------------------------------------------------------------------


def _norm_backward(grad: TensorArg, x: TensorArg, weight: TensorArg | None, stats: list[TensorArg | None],
                   output_mask: list[bool], *, dx_flops: float = 10) -> Cost:
    mask = output_mask + [False] * (3 - len(output_mask))
    flops = 0.0
    read = grad.storage_bytes + x.storage_bytes + _read(*stats)
    written = 0
    if mask[0]:
        flops += dx_flops * x.numel
        read += _read(weight)
        written += x.numel * grad.itemsize
    if weight is not None and mask[1]:
        flops += 2 * x.numel
        written += weight.nbytes
    if weight is not None and mask[2]:
        flops += x.numel
        written += weight.nbytes
    return Cost(flops, read + written, "norm")


@register("aten::native_layer_norm_backward")
def native_layer_norm_backward(call: OpCall) -> Cost:
    """(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask)."""
    return _norm_backward(call.required_tensor(0), call.required_tensor(1), call.tensor(5),
                          [call.tensor(3), call.tensor(4)], call.flags_arg(7, [True, True, True]))


@register("aten::native_group_norm_backward")
def native_group_norm_backward(call: OpCall) -> Cost:
    """(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask)."""
    return _norm_backward(call.required_tensor(0), call.required_tensor(1), call.tensor(4),
                          [call.tensor(2), call.tensor(3)], call.flags_arg(9, [True, True, True]))


@register("aten::native_batch_norm_backward")
def native_batch_norm_backward(call: OpCall) -> Cost:
    """(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
    output_mask)."""
    train = call.arg(7, True) is True
    stats = [call.tensor(5), call.tensor(6)] if train else [call.tensor(3), call.tensor(4)]
    return _norm_backward(call.required_tensor(0), call.required_tensor(1), call.tensor(2), stats,
                          call.flags_arg(9, [True, True, True]), dx_flops=10 if train else 2)


@register("aten::batch_norm_backward")
def batch_norm_backward(call: OpCall) -> Cost:
    """(grad_out, input, weight, running_mean, running_var, save_mean, save_var, update, eps,
    output_mask, reserve)."""
    train = call.arg(7, True) is True
    stats = [call.tensor(5), call.tensor(6)] if train else [call.tensor(3), call.tensor(4)]
    return _norm_backward(call.required_tensor(0), call.required_tensor(1), call.tensor(2), stats,
                          call.flags_arg(9, [True, True, True]), dx_flops=10 if train else 2)


@register("aten::cudnn_batch_norm_backward", "aten::miopen_batch_norm_backward")
def cudnn_batch_norm_backward(call: OpCall) -> Cost:
    """(input, grad_output, weight, running_mean, running_var, save_mean, save_var, epsilon[,
    reserveSpace]): all three gradients, training statistics."""
    return _norm_backward(call.required_tensor(1), call.required_tensor(0), call.tensor(2),
                          [call.tensor(5), call.tensor(6)], [True, True, True])


@register("aten::_fused_rms_norm_backward")
def fused_rms_norm_backward(call: OpCall) -> Cost:
    """(grad_out, input, normalized_shape, rstd, weight, output_mask[2]): grad_input 7, grad_weight 2."""
    mask = call.flags_arg(5, [True, True]) + [False]
    return _norm_backward(call.required_tensor(0), call.required_tensor(1), call.tensor(4), [call.tensor(3)], mask,
                          dx_flops=7)


# Always delegate: layer_norm -> native_layer_norm; group_norm -> native_group_norm; batch_norm ->
# _batch_norm_impl_index -> native_batch_norm / cudnn_batch_norm / miopen_batch_norm; instance_norm ->
# batch_norm on a reshaped input; rms_norm -> _fused_rms_norm (2.8+) or pow/mean/rsqrt/mul.
for _name in ("layer_norm", "group_norm", "batch_norm", "_batch_norm_impl_index", "instance_norm",
              "rms_norm", "_batch_norm_impl_index_backward"):
    register(f"aten::{_name}")(composite)
