"""Metadata-only ops: they change a tensor's view (shape/strides/offset), allocate, or read a single
scalar back to the host. 0 FLOPs, 0 bytes, family "view". Where such an op must copy (reshape of a
non-viewable tensor), it does so through a child aten::clone -> aten::copy_, which carries the cost."""

from __future__ import annotations

from opscope.costmodel.base import register, view

VIEW_OPS = (
    "view", "_unsafe_view", "reshape", "_reshape_alias", "view_as", "reshape_as", "flatten", "unflatten",
    "transpose", "transpose_", "t", "t_", "permute", "numpy_T", "mT", "mH", "matrix_H", "adjoint",
    "movedim", "moveaxis", "swapaxes", "swapaxes_", "swapdims", "swapdims_",
    "expand", "expand_as", "broadcast_to", "broadcast_tensors",
    "slice", "select", "narrow", "diagonal", "unfold", "as_strided", "as_strided_",
    "unsqueeze", "unsqueeze_", "squeeze", "squeeze_", "atleast_1d", "atleast_2d", "atleast_3d",
    "split", "split_with_sizes", "unsafe_split", "unsafe_split_with_sizes", "tensor_split", "chunk",
    "unsafe_chunk", "unbind", "meshgrid",
    "detach", "detach_", "alias", "lift", "lift_fresh", "resolve_conj", "resolve_neg", "conj", "_conj",
    "real", "imag", "view_as_real", "view_as_complex", "_neg_view",
    "resize_", "resize_as_", "set_", "result_type",
    "item", "_local_scalar_dense", "is_nonzero", "_assert_async", "_assert_scalar",
    "_functional_assert_async", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
)

for _name in VIEW_OPS:
    register(f"aten::{_name}")(view)
