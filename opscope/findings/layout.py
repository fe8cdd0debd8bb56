"""Tensor inputs as the trace records them (dims, dtypes, strides, concrete values) and what their
strides say about layout: NCHW or channels_last, dense or strided, why a kernel may miss bandwidth."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from opscope.costmodel.base import DTYPE_NAMES, TensorArg
from opscope.findings.base import Context
from opscope.findings.tree import col

UPSAMPLE_MODES = {"aten::upsample_nearest2d": "nearest", "aten::_upsample_nearest_exact2d": "nearest-exact",
                  "aten::upsample_bilinear2d": "bilinear", "aten::upsample_bicubic2d": "bicubic"}
# The ops the probe times in both layouts -> their kind (opscope.capture.layout_probe.CALLS). Where one
# calls another of them (max_pool2d -> max_pool2d_with_indices, batch_norm -> native_batch_norm), the
# outermost is the one counted.
LAYOUT_OPS = {
    "aten::convolution": "conv2d",
    "aten::max_pool2d": "max_pool2d", "aten::max_pool2d_with_indices": "max_pool2d",
    "aten::avg_pool2d": "avg_pool2d",
    "aten::adaptive_avg_pool2d": "adaptive_avg_pool2d", "aten::_adaptive_avg_pool2d": "adaptive_avg_pool2d",
    "aten::adaptive_max_pool2d": "adaptive_max_pool2d",
    "aten::batch_norm": "batch_norm", "aten::_batch_norm_impl_index": "batch_norm",
    "aten::native_batch_norm": "batch_norm", "aten::_native_batch_norm_legit": "batch_norm",
    "aten::_native_batch_norm_legit_no_training": "batch_norm", "aten::cudnn_batch_norm": "batch_norm",
    **{name: "upsample" for name in UPSAMPLE_MODES},
}

NON_TENSOR = frozenset({"Scalar", "ScalarList", "TensorList", "GenericList", "Device", "Layout", "None",
                        "String", ""})


@dataclass(frozen=True)
class Tensor(TensorArg):
    """A tensor input as the trace records it (the cost model's TensorArg), with layout predicates."""

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def known_strides(self) -> bool:
        return len(self.stride) == len(self.shape)

    @property
    def contiguous(self) -> bool:
        return self.is_contiguous

    @property
    def broadcast(self) -> bool:
        """Some dimension of size > 1 has stride 0 (an expanded view)."""
        return self.known_strides and any(st == 0 and n > 1 for n, st in zip(self.shape, self.stride, strict=True))

    @property
    def dtype_name(self) -> str:
        return DTYPE_NAMES.get(self.dtype, self.dtype)


def is_nchw(t: Tensor | None) -> bool:
    """A 4-D tensor with the contiguous (NCHW) strides that is not also channels_last (C == 1 or
    H*W == 1 make both layouts the same)."""
    return (t is not None and t.ndim == 4 and t.known_strides and t.contiguous
            and not _layout_ambiguous(t))


def is_channels_last(t: Tensor | None) -> bool:
    """A 4-D tensor with channels_last strides [H*W*C, 1, W*C, C] (size-1 dims' strides ignored), not
    also NCHW-contiguous."""
    if t is None or t.ndim != 4 or not t.known_strides or _layout_ambiguous(t):
        return False
    n, c, h, w = t.shape
    expected = (h * w * c, 1, w * c, c)
    return all(size == 1 or st == e for size, st, e in zip(t.shape, t.stride, expected, strict=True))


def _layout_ambiguous(t: Tensor) -> bool:
    _, c, h, w = t.shape
    return c == 1 or h * w == 1


def _loads(text: str) -> list[Any]:
    if not text:
        return []
    try:
        v = json.loads(text)
    except ValueError:
        return []
    return v if isinstance(v, list) else []


def _tensor_at(dims: list[Any], types: list[Any], strides: list[Any], k: int) -> Tensor | None:
    if k >= len(dims):
        return None
    shape = dims[k]
    dtype = types[k] if k < len(types) else ""
    if not isinstance(shape, list) or not isinstance(dtype, str) or dtype in NON_TENSOR:
        return None
    if shape and isinstance(shape[0], list):
        return None  # a TensorList
    if not all(isinstance(s, int) for s in shape):
        return None
    stride = strides[k] if k < len(strides) and isinstance(strides[k], list) else []
    if not all(isinstance(s, int) for s in stride):
        stride = []
    return Tensor(tuple(shape), dtype, tuple(stride))


def tensors(ctx: Context, i: int) -> list[Tensor | None]:
    """Event i's inputs by position: a Tensor for each plain tensor argument, None otherwise."""
    # Keyed by the recorded text, not the event: a million events hold a few thousand distinct inputs.
    memo: dict[tuple[str, str, str], list[Tensor | None]] = ctx.cache.setdefault("tensors", {})
    key = (col(ctx, "input_dims")[i], col(ctx, "input_dtypes")[i], col(ctx, "input_strides")[i])
    hit = memo.get(key)
    if hit is None:
        dims, types, strides = _loads(key[0]), _loads(key[1]), _loads(key[2])
        hit = [_tensor_at(dims, types, strides, k) for k in range(len(dims))]
        memo[key] = hit
    return hit


def tensor(ctx: Context, i: int, k: int) -> Tensor | None:
    ts = tensors(ctx, i)
    return ts[k] if k < len(ts) else None


def concrete(ctx: Context, i: int, k: int, default: Any = None) -> Any:
    """Concrete input k of event i as a Python value ("[1]" -> [1], "2" -> 2, "" -> default)."""
    memo = ctx.cache.setdefault("concrete", {})
    vals = memo.get(i)
    if vals is None:
        vals = _loads(col(ctx, "concrete_inputs")[i])
        memo[i] = vals
    if k >= len(vals) or vals[k] in ("", None):
        return default
    text = vals[k]
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        low = text.strip().lower()
        if low in ("true", "false"):
            return low == "true"
        return text


def memory_order(t: Tensor) -> tuple[int, ...]:
    """Dims of size > 1 from outermost to innermost in memory (by stride; ties keep logical order)."""
    dims = [k for k in range(t.ndim) if t.shape[k] > 1]
    return tuple(sorted(dims, key=lambda k: (-abs(t.stride[k]), -k)))


def is_dense(t: Tensor) -> bool:
    """Non-overlapping and dense: some permutation of the dims is contiguous (a transposed or
    channels_last tensor is dense; a slice with gaps or an expanded tensor is not)."""
    if not t.known_strides:
        return True
    expected = 1
    for k in reversed(memory_order(t)):
        if abs(t.stride[k]) != expected:
            return False
        expected *= t.shape[k]
    return True


def layout_cause(ts: Sequence[Tensor | None], *, allow_broadcast: bool = True) -> str | None:
    """Why a memory-bound op reading these inputs may miss peak bandwidth, judged from strides alone:
    - 'strided': an input with gaps whose innermost stride is not 1 (e.g. every other element), or
      same-shaped dense inputs in different memory orders (one transposed/permuted, the other not), so
      one of them is read against its layout. (A transposed or channels_last tensor alone is fine:
      kernels iterate in memory order.)
    - 'small-inner': an input with gaps whose contiguous runs are under SMALL_INNER_BYTES (a narrow
      slice of a wider tensor).
    - 'broadcast': an expanded input (stride 0) along the innermost memory dim of the op's largest
      dense input (not used when allow_broadcast is False).
    None when nothing in the strides explains it."""
    real = [t for t in ts if t is not None and t.known_strides and t.numel > 1]
    if not real:
        return None
    for t in real:
        if t.broadcast or is_dense(t):
            continue
        order = memory_order(t)
        if not order:
            continue
        if abs(t.stride[order[-1]]) != 1:
            return "strided"
        run, expected = 1, 1
        for k in reversed(order):
            if abs(t.stride[k]) != expected:
                break
            run *= t.shape[k]
            expected *= t.shape[k]
        if run * t.itemsize < SMALL_INNER_BYTES:
            return "small-inner"
    dense = [t for t in real if not t.broadcast and is_dense(t)]
    if not dense:
        return None
    ref = max(dense, key=lambda t: t.numel)
    same = [t for t in dense if t.shape == ref.shape]
    if len({memory_order(t) for t in same}) > 1:
        return "strided"
    order = memory_order(ref)
    if allow_broadcast and order:
        inner = order[-1]
        for t in real:
            k = inner - (ref.ndim - t.ndim)
            if t.broadcast and 0 <= k < t.ndim and t.shape[k] > 1 and t.stride[k] == 0:
                return "broadcast"
    return None


SMALL_INNER_BYTES = 64  # a cache line / two 32-byte GPU sectors
CAUSE_TEXT = {
    "broadcast": "an input is expanded (stride 0) along the innermost dim in memory, so the kernel re-reads "
                 "it instead of streaming",
    "strided": "an input is read against its memory layout (a strided slice, or a transposed/permuted tensor "
               "combined with one in another order), so reads are not contiguous",
    "small-inner": f"an input's contiguous inner runs are under {SMALL_INNER_BYTES} bytes (a small innermost "
                   "dim), so each memory transaction carries little useful data",
}
