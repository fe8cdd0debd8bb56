"""Data movement: copy_, cat, flips/rolls/padding, triangular masks. 0 FLOPs; bytes = source storage read
once + destination written once (copy_'s destination is written, never read; an expanded source
counts its real storage). Dtype conversions happen in copy_ (read in the source dtype, written in the
destination's)."""

from __future__ import annotations

import math

from opscope.costmodel.base import ITEMSIZE, Cost, OpCall, UnreadableCall, composite, register


@register("aten::copy_")
def copy_(call: OpCall) -> Cost:
    """copy_(self=dst, src, non_blocking): src storage read, dst written (dst's dtype)."""
    dst, src = call.required_tensor(0), call.tensor(1)
    read = src.storage_bytes if src is not None else 0  # copy_.int / copy_.float: a Python number
    return Cost(0, read + dst.storage_bytes, "copy")


@register("aten::_copy_from", "aten::_copy_from_and_resize")
def copy_from(call: OpCall) -> Cost:
    """_copy_from(self=src, dst, non_blocking): the backend copy (e.g. host <-> device)."""
    src, dst = call.required_tensor(0), call.required_tensor(1)
    return Cost(0, src.storage_bytes + src.numel * ITEMSIZE.get(dst.dtype, src.itemsize), "copy")


@register("aten::cat")
def cat(call: OpCall) -> Cost:
    """cat(tensors, dim): every input read, the concatenation written. Empty legacy [0] inputs are
    skipped. The trace records a TensorList's type only as "TensorList": element dtypes come from the
    call's dtypes where recorded (profile's dispatch pass), else are assumed (noted)."""
    tensors = [t for t in call.tensor_list(0) if t.shape != (0,)]
    read = sum(t.storage_bytes for t in tensors)
    written = sum(t.numel * t.itemsize for t in tensors)
    note = call.list_dtype_note()
    return Cost(0, read + written, "copy", note)


def _same_shape_copy(call: OpCall) -> Cost:
    """Read the input once, write a same-shaped output (in-place: read and write self)."""
    x = call.required_tensor(0)
    return Cost(0, x.storage_bytes + x.numel * x.itemsize, "copy")


register("aten::tril", "aten::triu", "aten::tril_", "aten::triu_", "aten::flip", "aten::roll")(_same_shape_copy)


def _pad(call: OpCall) -> Cost:
    """reflection_pad*/replication_pad*(self, padding [left, right, top, bottom, ...] from the last dim)."""
    x = call.required_tensor(0)
    pad = call.ints_arg(1, [])
    if len(pad) // 2 > len(x.shape):
        raise UnreadableCall(f"{call.name}: padding {pad} for {len(x.shape)} dims")
    shape = list(x.shape)
    for i in range(len(pad) // 2):
        shape[-1 - i] += pad[2 * i] + pad[2 * i + 1]
    return Cost(0, x.storage_bytes + math.prod(shape) * x.itemsize, "copy")


for _nd in (1, 2, 3):
    register(f"aten::reflection_pad{_nd}d", f"aten::replication_pad{_nd}d")(_pad)


# Always delegate the data movement to a child aten::copy_ (or cat): clone -> empty + copy_;
# contiguous -> clone; _to_copy -> empty_strided + copy_; to -> _to_copy (or nothing); stack/hstack/
# vstack -> cat; repeat -> expand + copy_; repeat_interleave -> expand + clone (or index_select);
# expand_copy -> clone; pad -> constant_pad_nd / reflection_pad / ...; constant_pad_nd -> fill_ + copy_;
# type_as -> to; tile -> repeat; fliplr/flipud/rot90 -> flip (+ transpose); lift_fresh_copy -> clone.
for _name in ("clone", "contiguous", "_to_copy", "to", "type_as", "stack", "hstack", "vstack", "dstack",
              "column_stack", "concat", "concatenate", "repeat", "repeat_interleave", "expand_copy", "pad",
              "constant_pad_nd", "tile", "fliplr", "flipud", "rot90", "lift_fresh_copy"):
    register(f"aten::{_name}")(composite)
