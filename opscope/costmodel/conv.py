"""Convolutions, counted exactly as torch.utils.flop_counter.FlopCounterMode counts them.

Forward (conv_flop_count): 2 * N * prod(conv_spatial) * prod(kernel) * w[0] * w[1], where conv_spatial
is the output's spatial size for a regular conv and the *input's* for a transposed one; w[1] is
already C_in/groups (regular) or C_out/groups (transposed), so groups need no extra factor. The bias
adds no FLOPs, only bytes. Bytes = input + weight (+ bias) storage read + output written.

Backward, per output_mask: grad_input counts as the forward conv with `transposed` flipped (as
FlopCounterMode's conv_backward_flop); grad_weight as 2 * prod(kernel) * prod(grad_out spatial) * x[1] *
grad_out[1] * N / groups (regular) or 2 * prod(kernel) * prod(x spatial) * grad_out[1] * x[1] * N / groups
(transposed): each weight element of a grouped conv only sees the channels of its own group.
FlopCounterMode's grad_weight term leaves out the division by `groups` (it ignores the argument), so for
grouped and depthwise convs it counts `groups` times the multiply-adds performed; opscope counts the
real work. grad_bias adds no FLOPs.

Each backend op has its own argument order (mkldnn/cudnn put padding before stride, the slow CPU
kernels take kernel_size and no groups); one ConvArgs entry per op records it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from opscope.costmodel.base import (
    ITEMSIZE,
    Cost,
    OpCall,
    TensorArg,
    UnreadableCall,
    composite,
    ints_per_dim,
    register,
)


@dataclass(frozen=True)
class ConvArgs:
    """Argument positions of one convolution op (None: not an argument; its default applies)."""

    bias: int | None
    stride: int | None
    padding: int | None
    dilation: int | None = None
    transposed: int | bool = False  # position of the `transposed` flag, or a fixed value
    output_padding: int | None = None
    groups: int | None = None
    epilogue_flops: float = 0  # fused element-wise work per output element (cudnn_convolution_relu)
    extra_inputs: tuple[int, ...] = ()  # other tensors read (cudnn_convolution_add_relu's z)


def conv_flop_count(x_shape: Sequence[int], w_shape: Sequence[int], out_shape: Sequence[int],
                    transposed: bool) -> int:
    """torch.utils.flop_counter.conv_flop_count."""
    batch = x_shape[0]
    conv_shape = (x_shape if transposed else out_shape)[2:]
    c_out, c_in, *kernel = w_shape
    return math.prod(conv_shape) * math.prod(kernel) * batch * c_out * c_in * 2


def conv_output_shape(x: tuple[int, ...], w: tuple[int, ...], stride_arg: object, padding_arg: object,
                      dilation_arg: object, transposed: bool, output_padding_arg: object,
                      groups: int) -> tuple[int, ...]:
    """The output shape from the input and weight shapes (w at least as many dims as x) and the
    recorded stride, padding, dilation and output_padding arguments."""
    nd = len(x) - 2
    stride, padding = ints_per_dim(stride_arg, nd, 1, "stride"), ints_per_dim(padding_arg, nd, 0, "padding")
    dilation = ints_per_dim(dilation_arg, nd, 1, "dilation")
    output_padding = ints_per_dim(output_padding_arg, nd, 0, "output_padding")
    kernel = w[2:]
    if transposed:
        spatial = [(x[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (kernel[i] - 1)
                   + output_padding[i] + 1 for i in range(nd)]
        c_out = w[1] * groups
    else:
        if 0 in stride[:nd]:
            raise UnreadableCall(f"stride {stride} has a zero")
        spatial = [(x[2 + i] + 2 * padding[i] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1
                   for i in range(nd)]
        c_out = w[0]
    return (x[0], c_out, *spatial)


def _arg(call: OpCall, position: int | None) -> object:
    """The argument at `position`, None when the op has no such argument."""
    return call.arg(position) if position is not None else None


def conv_cost(call: OpCall, spec: ConvArgs) -> Cost:
    x = call.required_tensor(0, min_ndim=3)
    w = call.required_tensor(1, min_ndim=len(x.shape))  # [C_out, C_in/groups, *kernel]
    transposed = spec.transposed if isinstance(spec.transposed, bool) else bool(call.arg(spec.transposed, False))
    groups = _arg(call, spec.groups) or 1
    if not isinstance(groups, int):
        raise UnreadableCall(f"{call.name}: groups is {groups!r}")
    out = conv_output_shape(x.shape, w.shape, _arg(call, spec.stride), _arg(call, spec.padding),
                            _arg(call, spec.dilation), transposed, _arg(call, spec.output_padding), groups)
    out_numel = math.prod(out)
    flops = conv_flop_count(x.shape, w.shape, out, transposed) + spec.epilogue_flops * out_numel
    read = x.storage_bytes + w.storage_bytes
    bias = call.tensor(spec.bias) if spec.bias is not None else None
    if bias is not None:
        read += bias.storage_bytes
    for i in spec.extra_inputs:
        t = call.tensor(i)
        read += t.storage_bytes if t is not None else 0
    return Cost(flops, read + out_numel * x.itemsize, "conv")


# torch's generic convolution entry points: (input, weight, bias, stride, padding, dilation, transposed,
# output_padding, groups, ...).
_GENERIC = ConvArgs(bias=2, stride=3, padding=4, dilation=5, transposed=6, output_padding=7, groups=8)
# (self, weight, bias, padding, stride, dilation, groups): mkldnn, mps, miopen.
_PADDING_FIRST = ConvArgs(bias=2, stride=4, padding=3, dilation=5, groups=6)
# (self, weight, kernel_size, bias, stride, padding[, dilation]): the slow CPU / CUDA fallbacks.
_SLOW = ConvArgs(bias=3, stride=4, padding=5)
_SLOW_DILATED = ConvArgs(bias=3, stride=4, padding=5, dilation=6)

CONV_OPS: dict[str, ConvArgs] = {
    # _convolution does the work itself for some backends (e.g. CPU transposed convs via mkldnn run
    # inside it, with no child op); otherwise a backend op below is its child and carries the cost.
    "_convolution": _GENERIC,
    "convolution_overrideable": _GENERIC,
    "mkldnn_convolution": _PADDING_FIRST,
    "_mps_convolution": _PADDING_FIRST,
    "miopen_convolution": _PADDING_FIRST,
    "miopen_depthwise_convolution": _PADDING_FIRST,
    "cudnn_convolution": ConvArgs(bias=None, stride=3, padding=2, dilation=4, groups=5),
    "cudnn_convolution_transpose": ConvArgs(bias=None, padding=2, output_padding=3, stride=4, dilation=5,
                                            groups=6, transposed=True),
    "_mps_convolution_transpose": ConvArgs(bias=None, padding=2, output_padding=3, stride=4, dilation=5,
                                           groups=6, transposed=True),
    "miopen_convolution_transpose": ConvArgs(bias=2, padding=3, output_padding=4, stride=5, dilation=6,
                                             groups=7, transposed=True),
    "cudnn_convolution_relu": ConvArgs(bias=2, stride=3, padding=4, dilation=5, groups=6, epilogue_flops=1),
    # relu(conv(x) + alpha * z): +1 add, +1 scale, +1 relu per output element
    "cudnn_convolution_add_relu": ConvArgs(bias=4, stride=5, padding=6, dilation=7, groups=8,
                                           epilogue_flops=3, extra_inputs=(2,)),
    "_slow_conv2d_forward": _SLOW,
    "thnn_conv2d": _SLOW,
    "slow_conv3d": _SLOW,
    "slow_conv3d_forward": _SLOW,
    "slow_conv_dilated2d": _SLOW_DILATED,
    "slow_conv_dilated3d": _SLOW_DILATED,
    "_conv_depthwise2d": _SLOW_DILATED,
    "conv_depthwise3d": _SLOW_DILATED,
    "slow_conv_transpose2d": ConvArgs(bias=3, stride=4, padding=5, output_padding=6, dilation=7, transposed=True),
    "slow_conv_transpose3d": ConvArgs(bias=3, stride=4, padding=5, output_padding=6, dilation=7, transposed=True),
    "_nnpack_spatial_convolution": ConvArgs(bias=2, padding=3, stride=4),
}

for _name, _spec in CONV_OPS.items():
    register(f"aten::{_name}")(partial(conv_cost, spec=_spec))

# Always delegate: conv1d/2d/3d and conv_transpose1d/2d/3d -> convolution (or _convolution_mode for
# string padding) -> _convolution; the backend op (mkldnn_convolution, cudnn_convolution, ...) or
# _convolution itself does the work.
for _name in ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
              "convolution", "_convolution_mode"):
    register(f"aten::{_name}")(composite)


def _t(shape: Sequence[int]) -> list[int]:
    return [shape[1], shape[0], *shape[2:]]


def conv_backward_flops(grad_out: Sequence[int], x: Sequence[int], w: Sequence[int], transposed: bool,
                        output_mask: Sequence[bool], groups: int = 1) -> int:
    """torch.utils.flop_counter.conv_backward_flop with its grad_weight term divided by `groups`."""
    flops = 0
    if output_mask[0]:
        flops += conv_flop_count(grad_out, w, x, not transposed)
    if output_mask[1]:
        if transposed:
            grad_weight = conv_flop_count(_t(grad_out), _t(x), _t(w), False)
        else:
            grad_weight = conv_flop_count(_t(x), _t(grad_out), _t(w), False)
        flops += grad_weight // groups  # both channel counts are multiples of groups: exact
    return flops


def _groups(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


def _conv_backward_cost(grad_out: TensorArg, x: TensorArg, w: TensorArg, transposed: bool, output_mask: list[bool],
                        groups: object = 1) -> Cost:
    mask = output_mask + [False] * (3 - len(output_mask))
    flops = conv_backward_flops(grad_out.shape, x.shape, w.shape, transposed, mask, _groups(groups))
    read = grad_out.storage_bytes
    written = 0
    if mask[0]:  # grad_input = conv_transpose(grad_out, w)
        read += w.storage_bytes
        written += x.numel * ITEMSIZE.get(grad_out.dtype, 4)
    if mask[1]:  # grad_weight = conv(x, grad_out)
        read += x.storage_bytes
        written += w.numel * ITEMSIZE.get(w.dtype, 4)
    if mask[2]:  # grad_bias = sum of grad_out over N and spatial dims
        c_out = grad_out.shape[1]
        written += c_out * ITEMSIZE.get(w.dtype, 4)
    return Cost(flops, read + written, "conv")


def _backward_tensors(call: OpCall) -> tuple[TensorArg, TensorArg, TensorArg]:
    """(grad_output, input, weight): [N, C, ...] each (a weight [C_out, C_in/groups, *kernel])."""
    return (call.required_tensor(0, min_ndim=2), call.required_tensor(1, min_ndim=2),
            call.required_tensor(2, min_ndim=2))


@register("aten::convolution_backward")
def convolution_backward(call: OpCall) -> Cost:
    """convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
    transposed, output_padding, groups, output_mask)."""
    return _conv_backward_cost(*_backward_tensors(call), bool(call.arg(7, False)),
                               call.flags_arg(10, [True, True, True]), call.arg(9, 1))


@register("aten::convolution_backward_overrideable")
def convolution_backward_overrideable(call: OpCall) -> Cost:
    """(grad_output, input, weight, stride, padding, dilation, transposed, output_padding, groups,
    output_mask)."""
    return _conv_backward_cost(*_backward_tensors(call), bool(call.arg(6, False)),
                               call.flags_arg(9, [True, True, True]), call.arg(8, 1))


@register("aten::_slow_conv2d_backward")
def slow_conv2d_backward(call: OpCall) -> Cost:
    """(grad_output, self, weight, kernel_size, stride, padding, output_mask) (CPU fallback)."""
    # the .grad_input overload passes out tensors instead of a mask
    mask = call.flags_arg(6, [True, True, True]) if isinstance(call.arg(6), list) else [True, True, True]
    return _conv_backward_cost(*_backward_tensors(call), False, mask)
