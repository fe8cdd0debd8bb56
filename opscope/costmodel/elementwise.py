"""Element-wise ops: unary/binary/ternary math with broadcasting, activations, comparisons, dropout, and
the element-wise `*_backward` ops autograd produces.

One table row per op: FLOPs per output element, which argument positions are input tensors (any other
tensor argument is an `out=` destination: written, never read), and the output dtype rule. An op
listed with `inplace=True` also registers its `name_` variant (self read and written once each).
FLOP numbers per element (docs/reference/counting.md) are in the package docstring.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from opscope.costmodel.base import (
    ITEMSIZE,
    Cost,
    OpCall,
    TensorArg,
    UnreadableCall,
    broadcast_shapes,
    composite,
    float_result,
    register,
    result_dtype,
)

FlopsRule = float | Callable[[OpCall], float]


@dataclass(frozen=True)
class EW:
    """How one element-wise op is counted."""

    flops: FlopsRule  # FLOPs per output element (or a function of the call)
    inputs: tuple[int, ...] = (0,)  # argument positions holding input tensors
    out: str = "promote"  # output dtype: promote (type promotion), bool, float (float-valued), first
    outputs: int = 1  # same-shaped outputs written (e.g. 2 for value + mask)
    extra_out: str = ""  # dtype of the 2nd output when it differs (native_dropout's bool mask)


def output_dtype(call: OpCall, ins: list[TensorArg], rule: str) -> str:
    if rule == "bool":
        return "bool"
    if rule == "first":
        return ins[0].dtype if ins else "float"
    dtype = result_dtype(ins)
    return float_result(dtype) if rule == "float" else dtype


def elementwise_cost(call: OpCall, spec: EW, *, inplace: bool = False, family: str = "elementwise") -> Cost:
    """Bytes: each input's distinct storage read once + each output element written once (out=
    destinations are not read; an in-place self is read once and written once)."""
    ins = [t for t in (call.tensor(i) for i in spec.inputs) if t is not None]
    if not ins:
        raise UnreadableCall(f"{call.name}: no tensor inputs")
    outs = [t for t in (call.tensor(i) for i in range(call.nargs) if i not in spec.inputs) if t is not None]
    flops_per = spec.flops(call) if callable(spec.flops) else spec.flops
    read = sum(t.storage_bytes for t in ins)
    if inplace:
        self = ins[0]
        return Cost(flops_per * self.numel, read + self.storage_bytes * spec.outputs, family)
    shape = broadcast_shapes(*(t.shape for t in ins))
    numel = math.prod(shape)
    if outs and outs[0].dtype in ITEMSIZE and spec.out != "bool":
        dtype = outs[0].dtype
    else:
        dtype = output_dtype(call, ins, spec.out)
    written = numel * ITEMSIZE.get(dtype, 4)
    if spec.outputs > 1:
        extra = ITEMSIZE.get(spec.extra_out, ITEMSIZE.get(dtype, 4)) if spec.extra_out else ITEMSIZE.get(dtype, 4)
        written += numel * extra * (spec.outputs - 1)
    return Cost(flops_per * numel, read + written, family)


def _register_table(table: dict[str, EW], inplace_names: set[str]) -> None:
    for name, spec in table.items():
        register(f"aten::{name}")(partial(elementwise_cost, spec=spec))
        if name in inplace_names:
            register(f"aten::{name}_")(partial(elementwise_cost, spec=spec, inplace=True))


# --- FLOP rules that read concrete arguments ----------------------------------------------------------


def _alpha_flops(call: OpCall) -> float:
    """add/sub: 1, or 2 when alpha != 1 (a multiply by alpha too)."""
    alpha = call.arg(2, 1)
    return 1 if alpha in (1, 1.0, None) or not isinstance(alpha, (int, float)) else 2


def _clamp_flops(call: OpCall) -> float:
    """clamp: one compare-select per bound given (min and/or max)."""
    bounds = sum(1 for i in (1, 2) if call.tensor(i) is not None or call.arg(i) is not None)
    return max(bounds, 1)


def _pow_flops(call: OpCall) -> float:
    """pow: x**2, x**0.5, x**-1, x**-0.5 (a multiply / sqrt / reciprocal / rsqrt) 1; x**3 2; x**1, x**0 0;
    any other exponent (scalar or tensor) 3 (exp(y * log x))."""
    if call.tensor(1) is not None or call.tensor(0) is None:
        return 3
    exponent = call.arg(1)
    if isinstance(exponent, bool) or not isinstance(exponent, (int, float)):
        return 3
    return {2: 1, 0.5: 1, -1: 1, -0.5: 1, 3: 2, 1: 0, 0: 0}.get(exponent, 3)


# --- tables -------------------------------------------------------------------------------------------
# One transcendental (exp, log, sqrt, rsqrt, reciprocal, sin, cos, tanh, ...) counts as 1 FLOP (one
# special-function instruction); erf has no such instruction and counts 4 (a short polynomial).

UNARY: dict[str, EW] = {
    # same dtype in and out
    "abs": EW(1),
    "neg": EW(1),
    "relu": EW(1),  # max(x, 0)
    "sign": EW(1),
    "sgn": EW(1),
    "floor": EW(1),
    "ceil": EW(1),
    "round": EW(1),
    "trunc": EW(1),
    "frac": EW(2),  # x - trunc(x)
    "bitwise_not": EW(1),
    "hardtanh": EW(2),  # min(max(x, lo), hi)
    "leaky_relu": EW(2),  # compare, multiply-select
    "elu": EW(4),  # compare, exp, -1, *alpha (selu/celu delegate to elu)
    "hardswish": EW(5),  # x * min(max(x + 3, 0), 6) / 6
    "hardsigmoid": EW(4),  # min(max(x + 3, 0), 6) / 6
    "threshold": EW(1),  # compare-select
    "softplus": EW(5),  # beta*x, exp, log1p, /beta, threshold select
    "mish": EW(5),  # softplus (exp, log1p, select) + tanh + multiply
    "gelu": EW(8),  # erf form 0.5*x*(1+erf(x/sqrt2)): 4 + erf(4); tanh form ~8 too (the trace does not record `approximate`)
    "silu": EW(5),  # x * sigmoid(x)
    "softshrink": EW(2),
    "hardshrink": EW(1),
    "log_sigmoid_forward": EW(6),  # min(x,0) - log1p(exp(-|x|))
    "nan_to_num": EW(3),  # isnan, isinf, select
    # floating-point valued (integer inputs give float32)
    "exp": EW(1, out="float"),
    "exp2": EW(1, out="float"),
    "expm1": EW(1, out="float"),
    "log": EW(1, out="float"),
    "log2": EW(1, out="float"),
    "log10": EW(1, out="float"),
    "log1p": EW(1, out="float"),
    "sqrt": EW(1, out="float"),
    "rsqrt": EW(1, out="float"),
    "reciprocal": EW(1, out="float"),
    "sin": EW(1, out="float"),
    "cos": EW(1, out="float"),
    "tan": EW(1, out="float"),
    "asin": EW(1, out="float"),
    "acos": EW(1, out="float"),
    "atan": EW(1, out="float"),
    "sinh": EW(1, out="float"),
    "cosh": EW(1, out="float"),
    "tanh": EW(1, out="float"),
    "asinh": EW(1, out="float"),
    "acosh": EW(1, out="float"),
    "atanh": EW(1, out="float"),
    "sigmoid": EW(4, out="float"),  # 1 / (1 + exp(-x)): neg, exp, add, div
    "logit": EW(3, out="float"),  # log(x / (1 - x))
    "erf": EW(4, out="float"),
    "erfc": EW(4, out="float"),
    "erfinv": EW(4, out="float"),
    # boolean valued
    "logical_not": EW(1, out="bool"),
    "isnan": EW(1, out="bool"),
    "isinf": EW(1, out="bool"),
    "isfinite": EW(2, out="bool"),
    "isneginf": EW(1, out="bool"),
    "isposinf": EW(1, out="bool"),
    "signbit": EW(1, out="bool"),
}

BINARY: dict[str, EW] = {
    "add": EW(_alpha_flops, (0, 1)),
    "sub": EW(_alpha_flops, (0, 1)),
    "rsub": EW(_alpha_flops, (0, 1)),
    "mul": EW(1, (0, 1)),
    "div": EW(1, (0, 1), out="float"),  # rounding_mode is a string the trace does not record
    "floor_divide": EW(2, (0, 1)),  # divide, floor
    "remainder": EW(2, (0, 1)),
    "fmod": EW(2, (0, 1)),
    "pow": EW(_pow_flops, (0, 1)),
    "maximum": EW(1, (0, 1)),
    "minimum": EW(1, (0, 1)),
    "fmax": EW(1, (0, 1)),
    "fmin": EW(1, (0, 1)),
    "clamp_min": EW(1, (0, 1)),
    "clamp_max": EW(1, (0, 1)),
    "atan2": EW(1, (0, 1), out="float"),
    "hypot": EW(4, (0, 1), out="float"),  # sqrt(x*x + y*y)
    "xlogy": EW(2, (0, 1), out="float"),  # x * log(y)
    "copysign": EW(1, (0, 1), out="float"),
    "heaviside": EW(1, (0, 1)),
    "bitwise_and": EW(1, (0, 1)),
    "bitwise_or": EW(1, (0, 1)),
    "bitwise_xor": EW(1, (0, 1)),
    "bitwise_left_shift": EW(1, (0, 1)),
    "bitwise_right_shift": EW(1, (0, 1)),
    "_prelu_kernel": EW(2, (0, 1), out="first"),  # compare, multiply-select
    "eq": EW(1, (0, 1), out="bool"),
    "ne": EW(1, (0, 1), out="bool"),
    "lt": EW(1, (0, 1), out="bool"),
    "le": EW(1, (0, 1), out="bool"),
    "gt": EW(1, (0, 1), out="bool"),
    "ge": EW(1, (0, 1), out="bool"),
    "logical_and": EW(1, (0, 1), out="bool"),
    "logical_or": EW(1, (0, 1), out="bool"),
    "logical_xor": EW(1, (0, 1), out="bool"),
}

TERNARY: dict[str, EW] = {
    "clamp": EW(_clamp_flops, (0, 1, 2)),  # min/max may be tensors (clamp.Tensor)
    "masked_fill": EW(1, (0, 1, 2), out="first"),  # the fill value may be a 0-dim tensor
    "addcmul": EW(3, (0, 1, 2)),  # self + value * t1 * t2
    "addcdiv": EW(3, (0, 1, 2)),  # self + value * t1 / t2
    "lerp": EW(3, (0, 1, 2)),  # self + w * (end - self)
}

# Backward element-wise ops: output = grad_input, shaped and typed like grad_output (argument 0).
BACKWARD: dict[str, EW] = {
    "threshold_backward": EW(1, (0, 1), out="first"),  # select (ReLU's backward)
    "gelu_backward": EW(14, (0, 1), out="first"),  # cdf (erf form: 7) + pdf (exp form: 4) + grad*(cdf + x*pdf) (3)
    "silu_backward": EW(9, (0, 1), out="first"),  # sigmoid (4) + grad*s*(1 + x*(1 - s)) (5)
    "sigmoid_backward": EW(3, (0, 1), out="first"),  # grad * y * (1 - y)
    "tanh_backward": EW(3, (0, 1), out="first"),  # grad * (1 - y*y)
    "hardtanh_backward": EW(2, (0, 1), out="first"),  # two compares, select
    "leaky_relu_backward": EW(2, (0, 1), out="first"),
    "elu_backward": EW(3, (0, 5), out="first"),  # grad_output, ..., self_or_result (argument 5)
    "softplus_backward": EW(6, (0, 1), out="first"),
    "mish_backward": EW(14, (0, 1), out="first"),  # sigmoid 4, softplus 3, tanh 1, 1-t^2 2, x*s*(..) 2, +t 1, *grad 1
    "hardswish_backward": EW(4, (0, 1), out="first"),
    "hardsigmoid_backward": EW(2, (0, 1), out="first"),
    "log_sigmoid_backward": EW(5, (0, 1, 2), out="first"),
    "native_dropout_backward": EW(2, (0, 1), out="first"),  # grad * mask * scale
    "_masked_scale": EW(2, (0, 1), out="first"),
}

DROPOUT: dict[str, EW] = {
    # output + keep-mask: compare a random draw with p, multiply by mask*scale (RNG itself not counted)
    "native_dropout": EW(2, (0,), out="first", outputs=2, extra_out="bool"),
    "_fused_dropout": EW(2, (0,), out="first", outputs=2, extra_out="unsigned char"),
}

# Ops in the tables above that also have an in-place `name_` variant.
INPLACE = {
    "abs", "neg", "relu", "sign", "sgn", "floor", "ceil", "round", "trunc", "frac", "bitwise_not",
    "hardtanh", "leaky_relu", "elu", "hardswish", "hardsigmoid", "threshold", "gelu", "silu", "mish",
    "nan_to_num", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal",
    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
    "sigmoid", "logit", "erf", "erfc", "erfinv", "logical_not", "add", "sub", "mul", "div", "floor_divide",
    "remainder", "fmod", "pow", "clamp_min", "clamp_max", "atan2", "hypot", "xlogy", "copysign",
    "heaviside", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift",
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "clamp",
    "masked_fill", "addcmul", "addcdiv", "lerp",
}

for _table in (UNARY, BINARY, TERNARY, BACKWARD, DROPOUT):
    _register_table(_table, INPLACE)


@register("aten::where")
def _where(call: OpCall) -> Cost:
    """where(cond, a, b): 1 select per element; where(cond) alone is nonzero's composite."""
    if call.nargs == 1:
        return composite()
    return elementwise_cost(call, EW(1, (0, 1, 2)))


@register("aten::glu")
def _glu(call: OpCall) -> Cost:
    """glu(x, dim): a * sigmoid(b) over the two halves: 5 FLOPs per output element (half the input)."""
    x = call.required_tensor(0)
    out_numel = x.numel // 2
    return Cost(5 * out_numel, x.storage_bytes + out_numel * x.itemsize, "elementwise")


@register("aten::_prelu_kernel_backward")
def _prelu_backward(call: OpCall) -> Cost:
    """(grad_output, self, weight) -> (grad_input, grad_weight): 3 FLOPs per element."""
    grad, x, w = call.required_tensor(0), call.required_tensor(1), call.required_tensor(2)
    read = grad.storage_bytes + x.storage_bytes + w.storage_bytes
    return Cost(3 * x.numel, read + x.numel * grad.itemsize + w.nbytes, "elementwise")


# Always delegate to another element-wise aten op (CompositeImplicit), on every device.
for _name in (
    "relu6",  # -> hardtanh
    "selu",  # -> elu
    "celu",  # -> elu
    "log_sigmoid",  # -> log_sigmoid_forward
    "prelu",  # -> _prelu_kernel
    "square",  # -> pow(x, 2)
    "negative",  # -> neg
    "true_divide",  # -> div
    "__and__",  # -> bitwise_and
    "__or__",  # -> bitwise_or
    "__xor__",  # -> bitwise_xor
    "dropout",  # eval: returns the input; train: bernoulli_/div_/mul children (CPU) or native_dropout
    "feature_dropout",
    "alpha_dropout",
    "feature_alpha_dropout",
    "relu6_",
    "selu_",
    "celu_",
    "square_",
    "dropout_",
):
    register(f"aten::{_name}")(composite)
