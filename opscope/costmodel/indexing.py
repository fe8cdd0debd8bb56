"""Gather- and scatter-like indexing. Gathers read the indices and only the elements/rows they select
(not the whole source table) and write the output; scatters read the indices and the source values
and write (read-modify-write for accumulating scatters) only the addressed elements of the destination.
An out-of-place scatter's copy of `self` is its child aten::copy_, counted there. FLOPs are 0 except
for accumulating scatters (1 add per scattered element) and embedding_bag's sums."""

from __future__ import annotations

import math
from functools import partial

from opscope.costmodel.base import Cost, OpCall, composite, register


def _row_elems(shape: tuple[int, ...], dim: int) -> int:
    """Elements per index along `dim` (the product of the other dims)."""
    dim %= len(shape)
    return math.prod(s for i, s in enumerate(shape) if i != dim)


@register("aten::index_select")
def index_select(call: OpCall) -> Cost:
    """index_select(self, dim, index): reads index + the selected slices, writes them."""
    x, dim, idx = call.required_tensor(0), call.int_arg(1, 0), call.required_tensor(2)
    if not x.shape:
        moved = idx.numel * x.itemsize
    else:
        moved = idx.numel * _row_elems(x.shape, dim) * x.itemsize
    return Cost(0, idx.storage_bytes + 2 * moved, "gather")


@register("aten::gather")
def gather(call: OpCall) -> Cost:
    """gather(self, dim, index, sparse_grad): output shaped like index; one element read per index."""
    x, idx = call.required_tensor(0), call.required_tensor(2)
    return Cost(0, idx.storage_bytes + 2 * idx.numel * x.itemsize, "gather")


@register("aten::index")
def index(call: OpCall) -> Cost | None:
    """index(self, indices): when the indices are recorded as a TensorList, output = broadcast index
    shape x the un-indexed trailing dims; reads the indices and the gathered elements. torch.profiler
    usually records the Tensor?[] argument as nothing at all, and then the cost is unknown (None)."""
    x = call.required_tensor(0)
    idxs = call.tensor_list(1, unknown_dtype="long int")
    if not idxs:
        return None
    if all(t.dtype == "bool" for t in idxs):
        return None  # boolean masks: the output size depends on the data
    index_numel = max(t.numel for t in idxs)
    trailing = math.prod(x.shape[len(idxs):])
    moved = index_numel * trailing * x.itemsize
    return Cost(0, sum(t.storage_bytes for t in idxs) + 2 * moved, "gather")


@register("aten::embedding_dense_backward")
def embedding_dense_backward(call: OpCall) -> Cost:
    """(grad_output [..., D], indices, num_weights, padding_idx, scale_grad_by_freq): one grad row per
    index accumulated into the [num_weights, D] table (1 add per grad element; read-modify-write of the
    addressed rows). The table's zero-fill is its child aten::zeros -> zero_ (CPU and CUDA), counted
    there."""
    grad, idx = call.required_tensor(0), call.required_tensor(1)
    return Cost(grad.numel, grad.storage_bytes + idx.storage_bytes + 2 * grad.numel * grad.itemsize, "scatter")


def _embedding_bag(call: OpCall) -> Cost:
    """_embedding_bag(weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights,
    include_last_offset, padding_idx): gathers one row per index, sums (mean: + a divide, max:
    compares) into one row per bag."""
    w, idx, offsets = call.required_tensor(0, min_ndim=1), call.required_tensor(1), call.tensor(2)
    d = w.shape[-1]
    psw = call.tensor(6)
    bags = offsets.numel - (1 if call.arg(7, False) is True else 0) if offsets is not None else 1
    if offsets is not None and len(idx.shape) == 2:  # 2-D input: one bag per row, offsets unused
        bags = idx.shape[0]
    flops = idx.numel * d * (2 if psw is not None else 1)
    read = idx.storage_bytes + (offsets.storage_bytes if offsets is not None else 0) + idx.numel * d * w.itemsize
    read += psw.storage_bytes if psw is not None else 0
    return Cost(flops, read + bags * d * w.itemsize, "gather")


register("aten::_embedding_bag", "aten::_embedding_bag_forward_only")(_embedding_bag)


def _scatter(call: OpCall, accumulate: bool) -> Cost:
    """scatter/scatter_add/scatter_reduce(self, dim, index, src|value, ...): index + src values read,
    addressed destination elements written (and read first when accumulating)."""
    x, idx, src = call.required_tensor(0), call.required_tensor(2), call.tensor(3)
    n = idx.numel
    read = idx.storage_bytes + (n * src.itemsize if src is not None and src.shape else 0)
    moved = n * x.itemsize * (2 if accumulate else 1)
    return Cost(n if accumulate else 0, read + moved, "scatter")


for _name, _acc in (("scatter", False), ("scatter_add", True), ("scatter_reduce", True)):
    register(f"aten::{_name}", f"aten::{_name}_")(partial(_scatter, accumulate=_acc))


@register("aten::index_add", "aten::index_add_", "aten::index_copy", "aten::index_copy_",
          "aten::index_reduce", "aten::index_reduce_")
def index_add(call: OpCall) -> Cost:
    """index_add(self, dim, index, source, alpha) / index_copy(self, dim, index, source): source rows
    read and written into self (index_add reads the destination rows too and adds)."""
    x, idx, src = call.required_tensor(0), call.required_tensor(2), call.required_tensor(3)
    accumulate = "copy" not in call.name
    moved = src.numel * x.itemsize
    return Cost(src.numel if accumulate else 0,
                idx.storage_bytes + src.storage_bytes + moved * (2 if accumulate else 1), "scatter")


@register("aten::_index_put_impl_")
def index_put_impl(call: OpCall) -> Cost:
    """_index_put_impl_(self, indices, values, accumulate, unsafe): values read and written into the
    addressed elements of self (read too when accumulate). The indices (Tensor?[]) are usually not
    recorded; a 0-dim `values` broadcast over the indexed positions counts as one element (a lower
    bound, noted)."""
    x, values = call.required_tensor(0), call.tensor(2)
    accumulate = call.arg(3, False) is True
    idxs = call.tensor_list(1, unknown_dtype="long int")
    n = values.numel if values is not None else 1
    read = (values.storage_bytes if values is not None else 0) + sum(t.storage_bytes for t in idxs)
    note = "" if values is not None and values.shape else "scalar fill over unrecorded indices: lower bound"
    return Cost(n if accumulate else 0, read + n * x.itemsize * (2 if accumulate else 1), "scatter", note)


@register("aten::masked_select")
def masked_select(call: OpCall) -> Cost:
    """masked_select(self, mask): reads self and mask; the output size depends on the data and is not
    counted (noted)."""
    x, mask = call.required_tensor(0), call.required_tensor(1)
    return Cost(0, x.storage_bytes + mask.storage_bytes, "gather", "data-dependent output not counted")


@register("aten::nonzero")
def nonzero(call: OpCall) -> Cost:
    """nonzero(self): reads self; the [n, ndim] int64 output size depends on the data (not counted)."""
    x = call.required_tensor(0)
    return Cost(0, x.storage_bytes, "gather", "data-dependent output not counted")


# Always delegate: embedding -> index_select (reshape/view around it); embedding_backward ->
# embedding_dense_backward (or the sparse path); embedding_bag -> _embedding_bag(_forward_only);
# index_put_ -> _index_put_impl_; index_put -> clone + index_put_; take_along_dim -> gather;
# nonzero_numpy -> nonzero; masked_scatter -> clone + masked_scatter_; one_hot -> zeros + scatter_;
# index_select_backward -> zeros + index_add_; gather_backward -> zeros + scatter_add.
for _name in ("embedding", "embedding_backward", "embedding_bag", "index_put_", "index_put",
              "take_along_dim", "nonzero_numpy", "masked_scatter", "index_select_backward", "gather_backward",
              "one_hot"):
    register(f"aten::{_name}")(composite)
