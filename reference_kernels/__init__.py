"""opscope's reference kernels: verified, benchmarked CPU (C++), Triton and CUDA implementations of the
ops that dominate real models, each a torch.library custom op `torch.ops.opscope.<name>`.

    import reference_kernels
    y = reference_kernels.rms_norm(x, weight, 1e-6)      # registers opscope::rms_norm on first use
    softmax = reference_kernels.load("softmax")          # the same, explicitly: returns the op,
    y = torch.ops.opscope.softmax(scores, 0.125, mask)   # which torch.ops then has as well

Importing this package has no side effects: it does not import torch, register an op or build anything.
A kernel's ops (schema, fake/meta implementation, autograd) are registered the first time the kernel is
used through this package, `reference_kernels.<name>` or `load(name)`; until then
`torch.ops.opscope.<name>` does not exist. The CPU extension is compiled on the first call with CPU
tensors and the CUDA extension on the first call of a CUDA kernel, each then cached (_build.py).

Each kernel is one folder, reference_kernels/<name>/ (README.md says what it holds); `manifests()`
describes them. Nothing here lists the kernels: the folders are found through their manifest.toml.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from reference_kernels._dispatch import use_backend
from reference_kernels._registry import is_kernel, load, loaded, op_module
from reference_kernels.manifest import PACKAGE_DIR, KernelManifest, ManifestError, load_manifests

__all__ = ["KernelManifest", "ManifestError", "load", "loaded", "manifests", "use_backend"]

_manifests: list[KernelManifest] | None = None


def manifests() -> list[KernelManifest]:
    """Every bundled kernel's manifest, sorted by name (read on the first call; a malformed one raises
    ManifestError naming the file and the field)."""
    global _manifests
    if _manifests is None:
        _manifests = load_manifests()
    return list(_manifests)


def __getattr__(name: str) -> Any:
    """`reference_kernels.<kernel>`: the kernel's function (its op.py's `entry_point` if it has one, else
    the op itself), the kernel's ops registered on this first access."""
    if not is_kernel(name):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    op = load(name)
    function = getattr(op_module(name), "entry_point", op)
    globals()[name] = function  # later lookups find it without coming here
    return function


def __dir__() -> list[str]:
    return sorted({*globals(), *(p.parent.name for p in PACKAGE_DIR.glob("*/manifest.toml"))})


class _Package(types.ModuleType):
    """The class of this module, so that `reference_kernels.<kernel>` stays the kernel's function. The
    import system sets a subpackage as an attribute of its parent when the subpackage is first imported:
    `from reference_kernels.sum.op import strategy` would otherwise make `reference_kernels.sum` the sum
    folder's package. Such subpackages stay reachable through sys.modules, which is where `from ...
    import` and importlib look (`import reference_kernels.sum.op as m` goes through the attribute, and
    so does not work)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and is_kernel(name):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
