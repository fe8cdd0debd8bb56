"""Reductions and scans. FLOPs = per_input * input elements + per_output * output elements (see the
package docstring's table); bytes = input storage read once + outputs written (values, plus int64
indices for max/min along a dim). The output shape comes from the dim/keepdim concrete arguments
(dim omitted, None or [] reduces everything)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

from opscope.costmodel.base import (
    ITEMSIZE,
    Cost,
    OpCall,
    TensorArg,
    dtype_category,
    reduced_shape,
    register,
    scalar_type,
)
from opscope.costmodel.elementwise import BINARY, elementwise_cost


@dataclass(frozen=True)
class Red:
    per_in: float  # FLOPs per input element
    per_out: float = 0  # FLOPs per output element (the mean's divide, std's sqrt, ...)
    out: str = "same"  # output dtype: same, sum (integers -> int64), long, bool
    n_out: int = 1  # outputs of that dtype (var_mean: var and mean)
    indices: bool = False  # also writes int64 indices


def _out_dtype(x: TensorArg, rule: str, dtype_arg: object) -> str:
    explicit = scalar_type(dtype_arg)
    if explicit:
        return explicit
    if rule == "long":
        return "long int"
    if rule == "bool":
        return "bool"
    if rule == "sum" and dtype_category(x.dtype) < 2:
        return "long int"
    return x.dtype


def reduction_cost(call: OpCall, spec: Red, dim: object, keepdim: bool, dtype_arg: object = None,
                   family: str = "reduction") -> Cost:
    """Reduces input 0 over `dim` (the recorded argument: int, list, None or [] for all)."""
    x = call.required_tensor(0)
    out_shape = reduced_shape(x.shape, dim, keepdim)
    out_numel = math.prod(out_shape)
    dtype = _out_dtype(x, spec.out, dtype_arg)
    written = out_numel * ITEMSIZE.get(dtype, 4) * spec.n_out + (out_numel * 8 if spec.indices else 0)
    flops = spec.per_in * x.numel + spec.per_out * out_numel
    return Cost(flops, x.storage_bytes + written, family)


def _arg_bool(call: OpCall, i: int) -> bool:
    return call.arg(i, False) is True


# --- sum-like: (self, dtype) reduces all; (self, dim, keepdim, dtype[, out]) ----------------------------

_SUM_LIKE = {
    "sum": Red(1, out="sum"),
    "mean": Red(1, 1),  # sum + one divide per output
    "nansum": Red(2, out="sum"),  # isnan-select + add
}


def _sum_like(call: OpCall, spec: Red) -> Cost:
    if call.nargs <= 2:
        return reduction_cost(call, spec, None, False, call.arg(1))
    return reduction_cost(call, spec, call.arg(1), _arg_bool(call, 2), call.arg(3))


for _name, _spec in _SUM_LIKE.items():
    register(f"aten::{_name}")(partial(_sum_like, spec=_spec))


@register("aten::prod")
def prod(call: OpCall) -> Cost:
    """prod(self, dtype) or prod(self, dim, keepdim, dtype): 1 multiply per input element."""
    spec = Red(1, out="sum")
    if call.nargs <= 2:
        return reduction_cost(call, spec, None, False, call.arg(1))
    return reduction_cost(call, spec, call.arg(1), _arg_bool(call, 2), call.arg(3))


# --- (self, dim, keepdim) ------------------------------------------------------------------------------

_DIM_KEEPDIM = {
    "amax": Red(1),
    "amin": Red(1),
    "argmax": Red(1, out="long"),
    "argmin": Red(1, out="long"),
    "aminmax": Red(2, n_out=2),
    "logsumexp": Red(4, 2),  # max, subtract, exp, add per input; log and add-back per output
}

def _dim_keepdim(call: OpCall, spec: Red) -> Cost:
    return reduction_cost(call, spec, call.arg(1), _arg_bool(call, 2))


for _name, _spec in _DIM_KEEPDIM.items():
    register(f"aten::{_name}")(partial(_dim_keepdim, spec=_spec))


def _max_min(call: OpCall) -> Cost:
    """max(self) / max(self, dim, keepdim) (+ indices) / max(self, other) (element-wise maximum)."""
    if call.tensor(1) is not None:
        return elementwise_cost(call, BINARY["maximum"])
    if call.nargs == 1:
        return reduction_cost(call, Red(1), None, False)
    return reduction_cost(call, Red(1, indices=True), call.arg(1), _arg_bool(call, 2))


register("aten::max", "aten::min")(_max_min)


@register("aten::all", "aten::any")
def all_any(call: OpCall) -> Cost:
    """all/any(self) or (self, dim (int or list), keepdim): 1 per input element, bool out."""
    if call.nargs == 1:
        return reduction_cost(call, Red(1, out="bool"), None, False)
    return reduction_cost(call, Red(1, out="bool"), call.arg(1), _arg_bool(call, 2))


@register("aten::count_nonzero")
def count_nonzero(call: OpCall) -> Cost:
    """count_nonzero(self, dim): compare + add per input element, int64 out."""
    return reduction_cost(call, Red(2, out="long"), call.arg(1), False)


# --- variance family: var(self, unbiased) or (self, dim, unbiased|correction, keepdim) --------------------

_VAR_LIKE = {
    # per input element: accumulate for the mean, subtract, square, accumulate (4); per output: divide
    "var": Red(4, 1),
    "std": Red(4, 2),  # + sqrt
    "var_mean": Red(4, 2, n_out=2),  # + the mean's divide
    "std_mean": Red(4, 3, n_out=2),
}


def _var_like(call: OpCall, spec: Red) -> Cost:
    if call.nargs <= 2:
        return reduction_cost(call, spec, None, False)
    return reduction_cost(call, spec, call.arg(1), _arg_bool(call, 3))


for _name, _spec in _VAR_LIKE.items():
    register(f"aten::{_name}")(partial(_var_like, spec=_spec))


# --- norms ------------------------------------------------------------------------------------------------


def norm_spec(p: object) -> Red:
    """p = 2: square + add per element, sqrt per output; p = 1: abs + add; p = +-inf: abs + max;
    p = 0: compare + add; other p: abs, pow (3), add per element, pow per output."""
    if p is None or p in (2, 2.0):
        return Red(2, 1)
    if p in (1, 1.0, 0, 0.0) or (isinstance(p, float) and math.isinf(p)):
        return Red(2)
    return Red(5, 3)


@register("aten::linalg_vector_norm")
def linalg_vector_norm(call: OpCall) -> Cost:
    """linalg_vector_norm(self, ord, dim, keepdim, dtype)."""
    return reduction_cost(call, norm_spec(call.arg(1, 2)), call.arg(2), _arg_bool(call, 3), call.arg(4))


@register("aten::norm")
def norm(call: OpCall) -> Cost:
    """norm(self, p) / norm(self, p, dtype) reduce everything; norm(self, p, dim, keepdim[, dtype])."""
    spec = norm_spec(call.arg(1, 2))
    if call.nargs <= 3:
        return reduction_cost(call, spec, None, False, call.arg(2) if call.nargs == 3 else None)
    return reduction_cost(call, spec, call.arg(2), _arg_bool(call, 3), call.arg(4))


@register("aten::_foreach_norm")
def foreach_norm(call: OpCall) -> Cost:
    """_foreach_norm(tensors, ord, dtype): one full-reduction norm per tensor."""
    spec = norm_spec(call.arg(1, 2))
    tensors = call.tensor_list(0)
    numel = sum(t.numel for t in tensors)
    read = sum(t.storage_bytes for t in tensors)
    written = sum(t.itemsize for t in tensors)
    note = call.list_dtype_note()
    return Cost(spec.per_in * numel + spec.per_out * len(tensors), read + written, "reduction", note)


# --- scans: output shaped like the input ---------------------------------------------------------------------

_SCANS = {"cumsum": 1, "cumprod": 1, "logcumsumexp": 4}


def _scan(call: OpCall, per_elem: float) -> Cost:
    """(self, dim[, dtype]): per_elem FLOPs per element, input read, same-sized output written."""
    x = call.required_tensor(0)
    dtype = _out_dtype(x, "sum" if per_elem == 1 else "same", call.arg(2) if call.nargs > 2 else None)
    return Cost(per_elem * x.numel, x.storage_bytes + x.numel * ITEMSIZE.get(dtype, 4), "reduction")


for _name, _flops in _SCANS.items():
    register(f"aten::{_name}")(partial(_scan, per_elem=_flops))
register("aten::cumsum_", "aten::cumprod_")(partial(_scan, per_elem=1))
