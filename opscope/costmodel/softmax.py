"""Softmax and log-softmax along one dim, and their backward data ops.

softmax: 5 FLOPs per element (max, subtract, exp, sum, divide); log_softmax: 5 (max, subtract, exp,
sum, subtract the log-sum — the per-row log is negligible). Backward: 4 per element
(softmax: y * (g - sum(g * y)): multiply, sum, subtract, multiply; log_softmax: g - exp(y) * sum(g):
sum, exp, multiply, subtract). Bytes: inputs read once, output written once.
"""

from __future__ import annotations

from opscope.costmodel.base import ITEMSIZE, Cost, OpCall, composite, register, scalar_type


def _softmax(call: OpCall) -> Cost:
    """_softmax / _log_softmax(self, dim, half_to_float): half_to_float writes float32."""
    x = call.required_tensor(0)
    out_dtype = "float" if call.arg(2, False) is True else x.dtype
    return Cost(5 * x.numel, x.storage_bytes + x.numel * ITEMSIZE.get(out_dtype, 4), "softmax")


def _softmax_backward(call: OpCall) -> Cost:
    """_softmax_backward_data / _log_softmax_backward_data(grad_output, output, dim, input_dtype)."""
    grad, out = call.required_tensor(0), call.required_tensor(1)
    dtype = scalar_type(call.arg(3)) or grad.dtype
    return Cost(4 * grad.numel, grad.storage_bytes + out.storage_bytes + grad.numel * ITEMSIZE.get(dtype, 4),
                "softmax")


register("aten::_softmax", "aten::_log_softmax")(_softmax)
register("aten::_softmax_backward_data", "aten::_log_softmax_backward_data")(_softmax_backward)

# Always delegate to _softmax / _log_softmax (after an aten::to when dtype= is given); _safe_softmax to
# _softmax plus a where.
register("aten::softmax", "aten::log_softmax", "aten::special_softmax", "aten::special_log_softmax",
         "aten::_safe_softmax")(composite)
