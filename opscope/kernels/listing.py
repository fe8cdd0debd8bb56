"""`opscope kernels`: the bundled reference kernels (reference_kernels/) and which of their backends
this machine can run. Imports torch (to ask whether a GPU is present)."""

from __future__ import annotations

from typing import Any

from opscope.errors import OpscopeError

NO_GPU_NOTE = ("no GPU on this machine: the Triton and CUDA kernels are not run or timed here; the Triton "
               "kernels are checked under the Triton interpreter (TRITON_INTERPRET=1) and the CUDA kernels "
               "are compiled with nvcc for sm_80 and sm_90 by the tests")


class KernelError(OpscopeError):
    """A kernel name or manifest the command cannot use."""


def _manifests() -> list[Any]:
    import reference_kernels

    try:
        return reference_kernels.manifests()
    except reference_kernels.ManifestError as exc:
        raise KernelError(str(exc)) from exc


def machine() -> dict[str, Any]:
    """What this machine offers each backend."""
    import torch

    from reference_kernels import _build, _dispatch

    gpu = torch.cuda.is_available()
    info: dict[str, Any] = {
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if gpu else None,
        "triton_installed": _dispatch.triton_importable(),
        "nvcc": _build.nvcc(),
        "cpu_extension": _build.cpu_status(),
    }
    if gpu:
        gpu_backend = _dispatch.backend_for(torch.device("cuda"))
        info["backends"] = {
            "cpu": info["cpu_extension"],
            "triton": "usable" + (" (default for cuda tensors)" if gpu_backend == "triton" else "")
            if info["triton_installed"] else "not usable: triton is not installed",
            "cuda": "usable (compiles on first use)" + (" (default for cuda tensors)" if gpu_backend == "cuda" else "")
            if torch.version.cuda and info["nvcc"] else "not usable: needs a CUDA build of torch and nvcc",
        }
        info["note"] = ""
    else:
        info["backends"] = {
            "cpu": info["cpu_extension"],
            "triton": "not run here (no GPU); checked under the Triton interpreter by the tests"
            if info["triton_installed"] else "not run here (no GPU, triton not installed)",
            "cuda": "not run here (no GPU); compiled with nvcc for sm_80/sm_90 by the tests"
            if info["nvcc"] else "not run here (no GPU, no nvcc)",
        }
        info["note"] = NO_GPU_NOTE
    return info


def listing() -> dict[str, Any]:
    """The document `opscope kernels --json` prints."""
    mach = machine()
    kernels = []
    for m in _manifests():
        doc = m.to_json()
        doc["usable_here"] = [b for b in m.backends
                              if b == "cpu" and not mach["backends"]["cpu"].startswith("unavailable")
                              or b != "cpu" and mach["backends"][b].startswith("usable")]
        kernels.append(doc)
    return {"machine": mach, "kernels": kernels}


def find(name: str) -> Any:
    for m in _manifests():
        if m.name == name:
            return m
    names = ", ".join(m.name for m in _manifests())
    raise KernelError(f"no bundled kernel named {name!r}; the kernels are: {names}")


