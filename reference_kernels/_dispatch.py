"""Route a kernel call to a backend for the tensors' device.

cpu tensors -> the C++ extension (torch.ops.opscope_cpu.*), built on first use.
cuda tensors -> Triton when it is importable, else the CUDA C++ extension; OPSCOPE_KERNELS_GPU_BACKEND=
    triton|cuda picks one. (No timing has chosen between them: no GPU was available when they were
    written; see docs/guide/kernels.md.)
`use_backend("triton")` forces a backend for cpu tensors too: with TRITON_INTERPRET=1 set before triton
is imported, that runs the Triton kernels on the CPU through the interpreter, which is how the tests
check them on machines without a GPU.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from reference_kernels import _build, tuning

if TYPE_CHECKING:  # torch is imported when a kernel runs, not when the package is imported
    import torch

_forced: list[str] = []


@contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Route every kernel call in this block to `name` ("cpu", "triton" or "cuda")."""
    if name not in ("cpu", "triton", "cuda"):
        raise ValueError(f"unknown backend {name!r}; expected cpu, triton or cuda")
    _forced.append(name)
    try:
        yield
    finally:
        _forced.pop()


def triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def backend_for(device: torch.device) -> str:
    if _forced:
        return _forced[-1]
    if device.type == "cpu":
        return "cpu"
    if device.type == "cuda":
        choice = os.environ.get("OPSCOPE_KERNELS_GPU_BACKEND", "")
        if choice in ("triton", "cuda"):
            return choice
        return "triton" if triton_importable() else "cuda"
    raise RuntimeError(f"opscope kernels: no backend for device type {device.type!r} (cpu and cuda only)")


def call(kernel: str, fn: str, device: torch.device, *args: Any) -> Any:
    """Run `fn` (e.g. "rms_norm_forward") of `kernel` on the backend for `device`."""
    import torch

    backend = backend_for(device)
    if backend == "cpu":
        _build.load_cpu_extension()
        grain = tuning.knob(kernel, fn, args, "grain_size")
        return getattr(torch.ops.opscope_cpu, fn)(*args, grain)
    if backend == "triton":
        module = importlib.import_module(f"reference_kernels.{kernel}.triton_kernels")
        return getattr(module, fn)(*args)
    _build.load_cuda_extension()
    return getattr(torch.ops.opscope_cuda, fn)(*args)
