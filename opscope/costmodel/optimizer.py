"""Optimizer kernels: the multi-tensor `_foreach_*` ops (SGD/Adam/AdamW with foreach=True, grad
clipping) and the fused `_fused_adam_/_fused_adamw_/_fused_sgd_` ops.

A `_foreach_X` op costs what X costs on each tensor of its list (FLOPs per element from the
element-wise table); on CPU it runs as per-tensor X children (same family, so the analysis keeps only
those), on CUDA as fused multi-tensor kernels. The trace records a TensorList's type only as
"TensorList": element dtypes come from the call's dtypes where recorded (profile's dispatch pass), else
are assumed (OpCall.list_dtype_note says which, in Cost.note).

Fused optimizers, FLOPs per parameter element: Adam/AdamW 14 (decoupled decay 1, m = b1*m + (1-b1)*g
3, v = b2*v + (1-b2)*g*g 4, sqrt(v)/bias-correction + eps 3, p -= lr * m / denom 3), + 1 with
amsgrad, + 1 with grad scaling; SGD 2 (p -= lr * g), + 2 with weight decay, + 3 with momentum.
Bytes: every list read once, updated lists (params and optimizer state) written once.
"""

from __future__ import annotations

from functools import partial

from opscope.costmodel.base import Cost, OpCall, TensorArg, UnreadableCall, register
from opscope.costmodel.elementwise import BINARY, EW, TERNARY, UNARY


def _lists(call: OpCall) -> list[list[TensorArg]]:
    return [call.tensor_list(i) for i in range(call.nargs) if call.tensor_list(i)]


def _note(call: OpCall) -> str:
    return call.list_dtype_note()


def foreach_cost(call: OpCall, flops_per: float) -> Cost:
    """Every list (and plain tensor argument) read once; one self-shaped output list written (the self
    list itself for the in-place `_` variants)."""
    lists = _lists(call)
    if not lists:
        raise UnreadableCall(f"{call.name}: no TensorList argument")
    selfs = lists[0]
    plain = [call.tensor(i) for i in range(call.nargs)]
    read = sum(t.storage_bytes for t in plain if t is not None)
    read += sum(t.storage_bytes for lst in lists for t in lst)
    numel = sum(t.numel for t in selfs)
    written = sum(t.numel * t.itemsize for t in selfs)
    return Cost(flops_per * numel, read + written, "elementwise", _note(call))


def _foreach_flops(spec: EW, call: OpCall) -> float:
    """The element-wise table's number; add/sub: +1 when alpha != 1; pow: 1 for a scalar exponent 2,
    else 3; clamp_min/clamp_max 1."""
    if not callable(spec.flops):
        return spec.flops
    if spec is BINARY["add"] or spec is BINARY["sub"]:
        alpha = call.arg(2, 1)
        return 1 if alpha in (1, 1.0, None) or not isinstance(alpha, (int, float)) else 2
    if spec is BINARY["pow"]:
        return 1 if call.arg(1) in (2, 2.0) and not isinstance(call.arg(1), bool) else 3
    return 1


FOREACH: dict[str, EW] = {
    **{name: BINARY[name] for name in ("add", "sub", "mul", "div", "maximum", "minimum", "clamp_min",
                                       "clamp_max", "pow")},
    **{name: TERNARY[name] for name in ("addcmul", "addcdiv", "lerp")},
    **{name: UNARY[name] for name in ("abs", "neg", "sqrt", "rsqrt", "exp", "log", "log1p", "expm1",
                                      "reciprocal", "sigmoid", "tanh", "sign", "sin", "cos", "erf",
                                      "floor", "ceil", "round", "trunc", "frac", "log10", "log2")},
}

def _foreach_op(call: OpCall, spec: EW) -> Cost:
    return foreach_cost(call, _foreach_flops(spec, call))


for _name, _spec in FOREACH.items():
    register(f"aten::_foreach_{_name}", f"aten::_foreach_{_name}_")(partial(_foreach_op, spec=_spec))


@register("aten::_foreach_zero_")
def foreach_zero_(call: OpCall) -> Cost:
    """Writes every tensor of the list."""
    selfs = call.tensor_list(0)
    return Cost(0, sum(t.storage_bytes for t in selfs), "factory", _note(call))


@register("aten::_foreach_copy_")
def foreach_copy_(call: OpCall) -> Cost:
    """(self, src, non_blocking): src list read, self list written."""
    return Cost(0, sum(t.storage_bytes for t in call.tensor_list(1)) +
                sum(t.storage_bytes for t in call.tensor_list(0)), "copy", _note(call))


def _fused_adam(call: OpCall) -> Cost:
    """(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, beta1, beta2,
    weight_decay, eps, amsgrad, maximize, grad_scale, found_inf)."""
    params, grads, m, v, vmax = (call.tensor_list(i) for i in range(5))
    numel = sum(t.numel for t in params)
    flops_per = 14 + (1 if vmax else 0) + (1 if call.tensor(13) is not None else 0)
    updated = params + m + v + vmax
    read = sum(t.storage_bytes for t in updated + grads)
    written = sum(t.storage_bytes for t in updated)
    return Cost(flops_per * numel, read + written, "elementwise", _note(call))


register("aten::_fused_adam_", "aten::_fused_adamw_")(_fused_adam)


@register("aten::_fused_sgd_")
def fused_sgd(call: OpCall) -> Cost:
    """(params, grads, momentum_buffer_list, weight_decay, momentum, lr, dampening, nesterov,
    maximize, is_first_step, grad_scale, found_inf)."""
    params, grads, bufs = (call.tensor_list(i) for i in range(3))
    numel = sum(t.numel for t in params)
    wd = call.arg(3, 0)
    flops_per = 2 + (2 if isinstance(wd, (int, float)) and wd != 0 else 0) + (3 if bufs else 0)
    updated = params + bufs
    read = sum(t.storage_bytes for t in updated + grads)
    written = sum(t.storage_bytes for t in updated)
    return Cost(flops_per * numel, read + written, "elementwise", _note(call))
