"""Helpers for the kernel tests: every bundled kernel with its op module, inputs that need grad, and
the float64 / float32 reference computed with the kernel's eager composite."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import torch

import reference_kernels
from reference_kernels.testing import to_reference

MANIFESTS = {m.name: m for m in reference_kernels.manifests()}
NAMES = sorted(MANIFESTS)
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
          "float16": torch.float16}


def module(name: str) -> ModuleType:
    """The kernel's op module (samples, composite); importing it registers nothing."""
    return importlib.import_module(f"reference_kernels.{name}.op")


def op(name: str) -> Any:
    """torch.ops.opscope.<name>, registered on first use."""
    return reference_kernels.load(name)


def with_grad(args: tuple) -> tuple:
    return tuple(a.detach().clone().requires_grad_(True) if isinstance(a, torch.Tensor) and a.is_floating_point()
                 else a for a in args)


def keep_layout_grad(args: tuple) -> tuple:
    """Leaves that require grad but keep the sample's strides (non-contiguous stays non-contiguous)."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            leaf = a.detach()
            leaf.requires_grad_(True)
            out.append(leaf)
        else:
            out.append(a)
    return tuple(out)


def reference(name: str, args: tuple, dtype: torch.dtype, grad: bool = False) -> tuple[tuple, Any]:
    ref_args = tuple(to_reference(a, dtype, grad) for a in args)
    return ref_args, module(name).composite(*ref_args)


def tensors(args: tuple) -> list[torch.Tensor]:
    return [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
