"""Checks the fake (meta) implementations share with the C++ entries, so shape, dtype and device errors
are the same eager and under torch.compile."""

from __future__ import annotations

from collections.abc import Sequence

import torch

FLOATING = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def floating(t: torch.Tensor, op: str, name: str) -> None:
    if t.dtype not in FLOATING:
        raise RuntimeError(f"{op}: {name} must be float32, float64, bfloat16 or float16, got {t.dtype}")


def same_device(op: str, **tensors: torch.Tensor | None) -> None:
    named = [(n, t) for n, t in tensors.items() if t is not None]
    first_name, first = named[0]
    for name, t in named[1:]:
        if t.device != first.device:
            raise RuntimeError(f"{op}: {first_name} is on {first.device} but {name} is on {t.device}; "
                               "all tensors must be on one device")


def same_dtype(op: str, a: torch.Tensor, b: torch.Tensor, na: str, nb: str) -> None:
    if a.dtype != b.dtype:
        raise RuntimeError(f"{op}: {na} and {nb} must have the same dtype, got {a.dtype} and {b.dtype} "
                           "(convert one explicitly)")


def broadcast_shape(a: Sequence[int], b: Sequence[int], op: str, na: str = "a", nb: str = "b") -> list[int]:
    """The right-aligned broadcasting rule, with an error naming both shapes and the offending dim."""
    n = max(len(a), len(b))
    out = [0] * n
    for i in range(1, n + 1):
        da = a[-i] if i <= len(a) else 1
        db = b[-i] if i <= len(b) else 1
        if not (da == db or da == 1 or db == 1):
            raise ValueError(f"{op}: shapes {list(a)} ({na}) and {list(b)} ({nb}) are not broadcastable: dim "
                             f"{-i} (counted from the right) has sizes {da} and {db}; each pair of aligned "
                             "dims must be equal or one of them 1")
        out[n - i] = db if da == 1 else da
    return out
