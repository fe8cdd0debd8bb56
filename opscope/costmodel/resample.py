"""Upsampling / interpolation. Each output element gathers `taps` input elements and combines them with a
multiply-add each (2 FLOPs per tap): nearest 1 tap, 0 FLOPs (family "gather"); linear 2 taps (4),
bilinear 4 (8), bicubic 16 (32), trilinear 8 (16) (family "elementwise"). Bytes: input read once,
output written once. Backward: grad_output read, grad_input written, 2 FLOPs per tap per grad_output
element (nearest: 1 add).

Layouts: the `.vec` overload (input, output_size?, [align_corners,] scale_factors?) and the sized one
(self, output_size, [align_corners,] scales...) share a name; the former calls the latter (on CPU
with contiguous/copy_ children for the channels-last layout), and the analysis layer keeps one.
"""

from __future__ import annotations

import math
from functools import partial

from opscope.costmodel.base import Cost, OpCall, TensorArg, UnreadableCall, is_int_list, register

# name -> (spatial dims, taps per output element)
UPSAMPLE: dict[str, tuple[int, int]] = {
    "upsample_nearest1d": (1, 1),
    "upsample_nearest2d": (2, 1),
    "upsample_nearest3d": (3, 1),
    "_upsample_nearest_exact1d": (1, 1),
    "_upsample_nearest_exact2d": (2, 1),
    "_upsample_nearest_exact3d": (3, 1),
    "upsample_linear1d": (1, 2),
    "upsample_bilinear2d": (2, 4),
    "_upsample_bilinear2d_aa": (2, 4),
    "upsample_trilinear3d": (3, 8),
    "upsample_bicubic2d": (2, 16),
    "_upsample_bicubic2d_aa": (2, 16),
}


def _output_spatial(call: OpCall, x: TensorArg, nd: int) -> list[int]:
    """The output's spatial size: output_size, else the input's scaled by scale_factors (floored)."""
    size = call.arg(1)
    if is_int_list(size) and len(size) == nd:
        return size
    scales = call.arg(call.nargs - 1)  # .vec: scale_factors is the last argument
    if not isinstance(scales, list) or len(scales) != nd or len(x.shape) < nd:
        raise UnreadableCall(f"{call.name}: no output_size or scale_factors for an input of shape {list(x.shape)}")
    spatial = []
    for i, scale in enumerate(scales):
        if not isinstance(scale, (int, float)):
            raise UnreadableCall(f"{call.name}: scale_factors {scales}")
        scaled = x.shape[-nd + i] * scale
        if not math.isfinite(scaled):  # an infinite or NaN scale factor
            raise UnreadableCall(f"{call.name}: scale_factors {scales}")
        spatial.append(math.floor(scaled))
    return spatial


def _upsample(call: OpCall, nd: int, taps: int) -> Cost:
    x = call.required_tensor(0)
    out = math.prod(x.shape[:-nd]) * math.prod(_output_spatial(call, x, nd))
    flops = 0 if taps == 1 else 2 * taps * out
    return Cost(flops, x.storage_bytes + out * x.itemsize, "gather" if taps == 1 else "elementwise")


def _upsample_backward(call: OpCall, taps: int) -> Cost:
    """(grad_output, output_size, input_size, ...): grad_input shaped input_size."""
    grad = call.required_tensor(0)
    in_numel = math.prod(call.ints_arg(2))
    flops = grad.numel if taps == 1 else 2 * taps * grad.numel
    return Cost(flops, grad.storage_bytes + in_numel * grad.itemsize, "gather" if taps == 1 else "elementwise")


for _name, (_nd, _taps) in UPSAMPLE.items():
    register(f"aten::{_name}")(partial(_upsample, nd=_nd, taps=_taps))
    register(f"aten::{_name}_backward")(partial(_upsample_backward, taps=_taps))


@register("aten::pixel_shuffle", "aten::pixel_unshuffle", "aten::channel_shuffle", "aten::native_channel_shuffle")
def shuffle(call: OpCall) -> Cost:
    """A permutation of the input: read once, written once."""
    x = call.required_tensor(0)
    return Cost(0, x.storage_bytes + x.numel * x.itemsize, "copy")
