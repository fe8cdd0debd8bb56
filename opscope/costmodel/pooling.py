"""Pooling. FLOPs: max pooling 1 compare per window element per output element; average pooling 1 add
per window element + 1 divide per output element; adaptive pooling uses the exact window sizes
(start = floor(i*in/out), end = ceil((i+1)*in/out)). Backward: grad_output scattered back (1 add per
window element for average pooling, 1 per output element for max pooling via its indices).
Bytes: input read once, output (+ int64 indices) written once; backward reads grad_output (+ indices)
and writes grad_input. Inputs may be batched ([N, C, *spatial]) or not ([C, *spatial])."""

from __future__ import annotations

import math
from functools import partial

from opscope.costmodel.base import Cost, OpCall, TensorArg, UnreadableCall, composite, ints_per_dim, register


def pool_out_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """torch's pooling_output_shape (UnreadableCall for a zero stride)."""
    if s == 0:
        raise UnreadableCall("pooling stride 0")
    num = size + 2 * p - d * (k - 1) - 1
    if ceil_mode:
        out = -(-num // s) + 1
        if (out - 1) * s >= size + p:
            out -= 1
        return out
    return num // s + 1


def _window_out_shape(call: OpCall, nd: int, dilation_arg: int | None, ceil_arg: int) -> tuple[TensorArg, int, int]:
    """(input, output elements, window elements) of a pooling op laid out (self, kernel_size, stride,
    padding, ...); stride defaults to kernel_size."""
    x = call.required_tensor(0, min_ndim=nd)
    k = ints_per_dim(call.arg(1), nd, None, "kernel_size")
    s = ints_per_dim(call.arg(2), nd, None, "stride") if call.arg(2) not in (None, [], "") else k
    p = ints_per_dim(call.arg(3), nd, 0, "padding")
    d = ints_per_dim(call.arg(dilation_arg), nd, 1, "dilation") if dilation_arg is not None else [1] * nd
    ceil_mode = call.arg(ceil_arg, False) is True
    spatial = [pool_out_size(x.shape[-nd + i], k[i], s[i], p[i], d[i], ceil_mode) for i in range(nd)]
    lead = x.shape[:-nd]
    return x, math.prod(lead) * math.prod(spatial), math.prod(k)


def _max_pool(call: OpCall, nd: int, indices: bool) -> Cost:
    """(self, kernel_size, stride, padding, dilation, ceil_mode)."""
    x, out, window = _window_out_shape(call, nd, 4, 5)
    written = out * x.itemsize + (out * 8 if indices else 0)
    return Cost(out * window, x.storage_bytes + written, "pool")


def _avg_pool(call: OpCall, nd: int) -> Cost:
    """(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)."""
    x, out, window = _window_out_shape(call, nd, None, 4)
    return Cost(out * (window + 1), x.storage_bytes + out * x.itemsize, "pool")


def _adaptive_windows(in_size: int, out_size: int) -> int:
    """Sum over outputs of the adaptive window length along one dim."""
    return sum(-(-((i + 1) * in_size) // out_size) - (i * in_size) // out_size for i in range(out_size))


def _adaptive(call: OpCall, nd: int) -> tuple[TensorArg, int, int]:
    """(input, output elements, window elements summed over the outputs) of (self, output_size); a None
    output size keeps the input's."""
    x = call.required_tensor(0, min_ndim=nd)
    sizes = call.arg(1)
    if isinstance(sizes, (list, tuple)):
        sizes = list(sizes) * nd if len(sizes) == 1 and nd > 1 else list(sizes)
        sizes = [x.shape[-nd + i] if o is None and i < nd else o for i, o in enumerate(sizes)]
    out_sizes = ints_per_dim(sizes, nd, None, "output_size")
    lead = math.prod(x.shape[:-nd])
    out = lead * math.prod(out_sizes)
    window_total = lead * math.prod(_adaptive_windows(x.shape[-nd + i], out_sizes[i]) for i in range(nd))
    return x, out, window_total


def _adaptive_avg(call: OpCall, nd: int) -> Cost:
    """(self, output_size): window adds + 1 divide per output."""
    x, out, windows = _adaptive(call, nd)
    return Cost(windows + out, x.storage_bytes + out * x.itemsize, "pool")


def _adaptive_max(call: OpCall, nd: int) -> Cost:
    """(self, output_size) -> (values, int64 indices)."""
    x, out, windows = _adaptive(call, nd)
    return Cost(windows, x.storage_bytes + out * (x.itemsize + 8), "pool")


for _nd in (1, 2, 3):
    register(f"aten::max_pool{_nd}d_with_indices")(partial(_max_pool, nd=_nd, indices=True))
for _nd in (2, 3):
    register(f"aten::avg_pool{_nd}d")(partial(_avg_pool, nd=_nd))
    register(f"aten::_adaptive_avg_pool{_nd}d")(partial(_adaptive_avg, nd=_nd))
    register(f"aten::adaptive_max_pool{_nd}d")(partial(_adaptive_max, nd=_nd))
    register(f"aten::mkldnn_max_pool{_nd}d")(partial(_max_pool, nd=_nd, indices=False))
# max_pool1d computes without indices itself (CPU fast path) or calls max_pool1d_with_indices.
register("aten::max_pool1d")(partial(_max_pool, nd=1, indices=False))

# Always delegate: max_pool2d/3d -> max_pool{2,3}d_with_indices (or mkldnn_max_pool); avg_pool1d ->
# avg_pool2d; adaptive_avg_pool1d -> adaptive_avg_pool2d; adaptive_avg_pool2d/3d -> _adaptive_avg_pool
# or mean (1x1 output); adaptive_max_pool1d -> adaptive_max_pool2d.
for _name in ("max_pool2d", "max_pool3d", "avg_pool1d", "adaptive_avg_pool1d", "adaptive_avg_pool2d",
              "adaptive_avg_pool3d", "adaptive_max_pool1d"):
    register(f"aten::{_name}")(composite)


# --- backward ------------------------------------------------------------------------------------------------


def _grad_pool(call: OpCall, flops: float, indices_arg: int | None = None) -> Cost:
    """(grad_output, self, ...): grad_output (+ indices) read, grad_input shaped like self written."""
    grad, x = call.required_tensor(0), call.required_tensor(1)
    read = grad.storage_bytes
    if indices_arg is not None:
        idx = call.tensor(indices_arg)
        read += idx.storage_bytes if idx is not None else 0
    return Cost(flops, read + x.numel * grad.itemsize, "pool")


@register("aten::max_pool2d_with_indices_backward", "aten::max_pool3d_with_indices_backward")
def max_pool_backward(call: OpCall) -> Cost:
    """(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices): 1 add per
    grad_output element."""
    return _grad_pool(call, call.required_tensor(0).numel, 7)


@register("aten::adaptive_max_pool2d_backward", "aten::adaptive_max_pool3d_backward")
def adaptive_max_pool_backward(call: OpCall) -> Cost:
    """(grad_output, self, indices)."""
    return _grad_pool(call, call.required_tensor(0).numel, 2)


def _avg_pool_backward(call: OpCall, nd: int) -> Cost:
    """(grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor)."""
    grad = call.required_tensor(0)
    window = math.prod(ints_per_dim(call.arg(2), nd, None, "kernel_size"))
    return _grad_pool(call, grad.numel * (window + 1))


def _adaptive_avg_backward(call: OpCall, nd: int) -> Cost:
    """(grad_output, self)."""
    grad, x = call.required_tensor(0, min_ndim=nd), call.required_tensor(1, min_ndim=nd)
    lead = math.prod(x.shape[:-nd])
    windows = lead * math.prod(_adaptive_windows(x.shape[-nd + i], grad.shape[-nd + i]) for i in range(nd))
    return _grad_pool(call, windows + grad.numel)


for _nd in (2, 3):
    register(f"aten::avg_pool{_nd}d_backward")(partial(_avg_pool_backward, nd=_nd))
    register(f"aten::_adaptive_avg_pool{_nd}d_backward")(partial(_adaptive_avg_backward, nd=_nd))
