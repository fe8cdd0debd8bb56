"""opscope's reference kernels: verified, benchmarked CPU (C++), Triton and CUDA implementations of the
ops that dominate real models, each a torch.library custom op `torch.ops.opscope.<name>`.

    import reference_kernels
    y = torch.ops.opscope.rms_norm(x, weight, 1e-6)      # or reference_kernels.rms_norm(...)

Importing registers every op (schema, fake/meta implementation, autograd); the CPU extension is compiled
on the first CPU call and cached (see reference_kernels._build). `manifests()` describes each kernel.
"""

from __future__ import annotations

import importlib

import torch

from reference_kernels._dispatch import use_backend
from reference_kernels.manifest import KernelManifest, ManifestError, load_manifests

__all__ = ["KernelManifest", "ManifestError", "bias_gelu", "broadcast_add", "layer_norm", "manifests", "mean",
           "rms_norm", "softmax", "sum", "swiglu", "use_backend"]

_MANIFESTS = load_manifests()
for _m in _MANIFESTS:
    importlib.import_module(f"reference_kernels.{_m.name}.op")


def manifests() -> list[KernelManifest]:
    """Every bundled kernel's manifest, sorted by name."""
    return list(_MANIFESTS)


def broadcast_add(a: torch.Tensor | float, b: torch.Tensor | float) -> torch.Tensor:
    """a + b; a Python number becomes a 0-d tensor of the other operand's dtype and device."""
    if not isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        a = torch.tensor(a, dtype=b.dtype, device=b.device)
    if not isinstance(b, torch.Tensor) and isinstance(a, torch.Tensor):
        b = torch.tensor(b, dtype=a.dtype, device=a.device)
    return torch.ops.opscope.broadcast_add(a, b)


bias_gelu = torch.ops.opscope.bias_gelu
swiglu = torch.ops.opscope.swiglu
rms_norm = torch.ops.opscope.rms_norm
layer_norm = torch.ops.opscope.layer_norm
softmax = torch.ops.opscope.softmax
sum = torch.ops.opscope.sum  # noqa: A001 - the op's name
mean = torch.ops.opscope.mean
