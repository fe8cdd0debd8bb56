"""Tensor creation and in-place fills. 0 FLOPs (random number generation is not counted); bytes = the
output written once (fill_/zero_/normal_/... write their self; bernoulli_ with a tensor p also reads
it). empty/empty_like/empty_strided/new_empty allocate without writing: 0 bytes. Wrappers such as
zeros (-> zero_) or ones (-> fill_) are counted too; the analysis layer drops a parent whose child
does the same family of work. Output sizes come from the size/shape concrete arguments, dtypes from
dtype= codes (float32 / int64 defaults where torch applies them)."""

from __future__ import annotations

import math

from opscope.costmodel.base import (
    ITEMSIZE,
    Cost,
    CostFn,
    OpCall,
    UnreadableCall,
    composite,
    int_list,
    register,
    scalar_type,
)

FACTORY = "factory"


def _write(numel: int, dtype: str | None) -> Cost:
    return Cost(0, numel * ITEMSIZE.get(dtype or "float", 4), FACTORY)


def _size_numel(value: object) -> int:
    """Elements of a recorded size argument: an int, or a list of ints (a shape)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return math.prod(int_list(value, "size"))


@register("aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
          "aten::new_empty_strided", "aten::empty_permuted", "aten::_empty_affine_quantized")
def empty(call: OpCall) -> Cost:
    """Allocation only: nothing written."""
    return Cost(0, 0, FACTORY)


@register("aten::fill_", "aten::zero_", "aten::normal_", "aten::uniform_", "aten::random_",
          "aten::exponential_", "aten::cauchy_", "aten::log_normal_", "aten::geometric_",
          "aten::bernoulli_", "aten::fill_diagonal_")
def fill_(call: OpCall) -> Cost:
    """In-place fills: self written (not read); a tensor fill value / probability is read."""
    x = call.required_tensor(0)
    read = sum(t.storage_bytes for t in (call.tensor(i) for i in range(1, call.nargs)) if t is not None)
    if call.name == "aten::fill_diagonal_":
        n = min(x.shape) if x.shape else 1
        return Cost(0, n * x.itemsize, FACTORY)
    return Cost(0, read + x.storage_bytes, FACTORY)


def _sized(size_arg: int, dtype_arg: int | None, default: str = "float") -> CostFn:
    """Ops laid out (..., size at size_arg, ..., dtype at dtype_arg, ...)."""

    def cost(call: OpCall) -> Cost:
        dtype = scalar_type(call.arg(dtype_arg)) if dtype_arg is not None else None
        return _write(_size_numel(call.arg(size_arg)), dtype or default)

    return cost


# (size, dtype, layout, device, pin_memory)
for _name in ("zeros", "ones", "rand", "randn"):
    register(f"aten::{_name}")(_sized(0, 1))
register("aten::full")(_sized(0, 2))  # (size, fill_value, dtype, ...)


@register("aten::randint")
def randint(call: OpCall) -> Cost:
    """randint(high, size, dtype, ...) or randint.low(low, high, size, dtype, ...): int64 by default."""
    if isinstance(call.arg(1), list):
        return _write(_size_numel(call.arg(1)), scalar_type(call.arg(2)) or "long int")
    return _write(_size_numel(call.arg(2)), scalar_type(call.arg(3)) or "long int")


@register("aten::randperm")
def randperm(call: OpCall) -> Cost:
    """randperm(n, dtype, ...): n int64 values."""
    return _write(call.int_arg(0), scalar_type(call.arg(1)) or "long int")


def _like(dtype_arg: int | None) -> CostFn:
    """(self, [fill_value,] dtype, ...): shaped like self."""

    def cost(call: OpCall) -> Cost:
        x = call.required_tensor(0)
        dtype = scalar_type(call.arg(dtype_arg)) if dtype_arg is not None else None
        return _write(x.numel, dtype or x.dtype)

    return cost


for _name in ("zeros_like", "ones_like", "rand_like", "randn_like"):
    register(f"aten::{_name}")(_like(1))
register("aten::full_like")(_like(2))
register("aten::randint_like")(_like(None))


def _new(dtype_arg: int) -> CostFn:
    """self.new_zeros(size, dtype, ...): (self, size, ..., dtype at dtype_arg); self's dtype unless
    dtype= is given."""

    def cost(call: OpCall) -> Cost:
        numel = _size_numel(call.arg(1))
        return _write(numel, scalar_type(call.arg(dtype_arg)) or call.required_tensor(0).dtype)

    return cost


register("aten::new_zeros", "aten::new_ones")(_new(2))
register("aten::new_full")(_new(3))


@register("aten::scalar_tensor")
def scalar_tensor(call: OpCall) -> Cost:
    """scalar_tensor(s, dtype, ...): one element."""
    return _write(1, scalar_type(call.arg(1)) or "float")


@register("aten::linspace", "aten::logspace")
def linspace(call: OpCall) -> Cost:
    """linspace(start, end, steps, dtype, ...) / its out variant (start, end, steps, out)."""
    out = call.tensor(3)
    if out is not None:
        return _write(call.int_arg(2), out.dtype)
    dtype_pos = 4 if call.name == "aten::logspace" else 3
    return _write(call.int_arg(2), scalar_type(call.arg(dtype_pos)) or "float")


@register("aten::eye")
def eye(call: OpCall) -> Cost:
    """eye(n, dtype, ...), eye(n, m, dtype, ...), eye.out(n, out), eye.m_out(n, m, out): n*m written."""
    n = call.int_arg(0)
    out = next((t for t in map(call.tensor, (1, 2)) if t is not None), None)
    second = call.arg(1)
    m = second if isinstance(second, int) and call.nargs != 5 else n
    if out is not None:
        return _write(n * m, out.dtype)
    dtype = scalar_type(call.arg(1 if call.nargs == 5 else 2))
    return _write(n * m, dtype or "float")


@register("aten::arange")
def arange(call: OpCall) -> Cost:
    """arange(end, dtype, ...) [5 args], (start, end, dtype, ...) [6], (start, end, step, dtype, ...)
    [7], (start, end, step, out) [4], (end, out) [2]: ceil((end - start) / step) elements; int64 when
    start/end/step are all integers, else float32, unless dtype/out says otherwise."""
    nargs = call.nargs
    out = call.tensor(nargs - 1)
    start: object
    step: object
    if nargs == 2:
        start, end, step, dtype = 0, call.arg(0), 1, None
    elif nargs == 4:
        start, end, step, dtype = call.arg(0), call.arg(1), call.arg(2), None
    elif nargs == 5:
        start, end, step, dtype = 0, call.arg(0), 1, call.arg(1)
    elif nargs == 6:
        start, end, step, dtype = call.arg(0), call.arg(1), 1, call.arg(2)
    else:
        start, end, step, dtype = call.arg(0), call.arg(1), call.arg(2), call.arg(3)
    if not (isinstance(start, (int, float)) and isinstance(end, (int, float)) and isinstance(step, (int, float))):
        raise UnreadableCall(f"{call.name}: start, end, step = {start!r}, {end!r}, {step!r}")
    if step == 0:
        raise UnreadableCall(f"{call.name}: step 0")
    try:
        span = (end - start) / step
    except OverflowError as exc:  # integers past the float range
        raise UnreadableCall(f"{call.name}: start, end, step = {start}, {end}, {step}") from exc
    if not math.isfinite(span):
        raise UnreadableCall(f"{call.name}: {span} elements")
    numel = max(math.ceil(span), 0)
    if out is not None:
        return _write(numel, out.dtype)
    explicit = scalar_type(dtype)
    integral = all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end, step))
    return _write(numel, explicit or ("long int" if integral else "float"))


# Always delegates: bernoulli -> empty_like + bernoulli_.
register("aten::bernoulli")(composite)
