"""The CUDA kernels. Every kernel's cuda.cu must compile with nvcc for sm_80 and sm_90 (CI has nvcc but no
GPU: a kernel that does not compile fails here), and the torch binding must parse against torch's
headers. Running them needs a GPU and a CUDA build of torch; without one those tests skip and
`opscope kernels` says the CUDA kernels are not run here."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

import reference_kernels
from kernels_helpers import MANIFESTS, keep_layout_grad, module, op, reference, tensors
from reference_kernels import _build
from reference_kernels.manifest import PACKAGE_DIR
from reference_kernels.testing import assert_matches, tolerance

CUDA = sorted(name for name, m in MANIFESTS.items() if "cuda" in m.backends)
needs_nvcc = pytest.mark.skipif(_build.nvcc() is None, reason="nvcc not found: the CUDA kernels cannot be compiled here")


def test_every_kernel_has_a_cuda_source() -> None:
    assert sorted(MANIFESTS) == CUDA
    for name in CUDA:
        assert (PACKAGE_DIR / name / "cuda.cu").is_file()


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("name", CUDA)
def test_cuda_kernel_compiles_for_sm80_and_sm90(name: str, tmp_path: Path) -> None:
    proc = _build.nvcc_compile(PACKAGE_DIR / name / "cuda.cu", tmp_path / f"{name}.o", ("80", "90"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / f"{name}.o").stat().st_size > 0


@pytest.mark.slow
def test_cuda_binding_parses_against_torch_headers(tmp_path: Path) -> None:
    """The binding is built only with a CUDA torch; here it is syntax-checked with the CPU wheel's
    headers (its c10/cuda headers lack one generated file, stubbed empty) and CUDA's runtime headers."""
    cuda_include = next((p for p in (Path("/usr/local/cuda/include"),) if (p / "cuda_runtime_api.h").exists()), None)
    if cuda_include is None or _build.compiler() is None:
        pytest.skip("needs a C++ compiler and the CUDA runtime headers (/usr/local/cuda/include)")
    from torch.utils.cpp_extension import include_paths

    stub = tmp_path / "c10" / "cuda" / "impl"
    stub.mkdir(parents=True)
    (stub / "cuda_cmake_macros.h").write_text("")
    cmd = [_build.compiler(), "-fsyntax-only", "-std=c++20", *[f"-isystem{p}" for p in include_paths()],
           f"-I{tmp_path}", f"-I{cuda_include}", str(PACKAGE_DIR / "csrc" / "cuda_binding.cpp")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


gpu = pytest.mark.skipif(not (torch.cuda.is_available() and torch.version.cuda),
                         reason="no GPU here: the CUDA kernels are compiled, not run")


@gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("name", CUDA)
def test_gpu_kernels_match_pytorch(name: str, backend: str) -> None:
    for dt in (torch.float32, torch.bfloat16):
        for args in module(name).samples(dt, 0):
            cuda_args = tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in args)
            leaves = keep_layout_grad(cuda_args) if dt == torch.float32 else cuda_args
            with reference_kernels.use_backend(backend):
                out = op(name)(*leaves)
            ref_args, expected = reference(name, args, dt, grad=dt == torch.float32)
            tol = tolerance(MANIFESTS[name], dt)
            assert_matches(out.cpu(), expected, tol, f"{backend} {name}")
            if dt == torch.float32:
                g = torch.randn(out.shape)
                with reference_kernels.use_backend(backend):
                    grads = torch.autograd.grad(out, tensors(leaves), g.cuda())
                ref_grads = torch.autograd.grad(expected, tensors(ref_args), g.double())
                for a, b in zip(grads, ref_grads, strict=True):
                    assert_matches(a.cpu(), b, tol, f"{backend} {name} grad")


@gpu
def test_gpu_memory_flat_over_thousands_of_calls() -> None:
    x = torch.randn(64, 256, device="cuda")
    w = torch.randn(256, device="cuda")
    for _ in range(100):
        op("rms_norm")(x, w, 1e-6)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for _ in range(2000):
        op("rms_norm")(x, w, 1e-6)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before


@needs_nvcc
def test_a_cuda_kernel_that_does_not_compile_fails(tmp_path: Path) -> None:
    bad = tmp_path / "bad.cu"
    bad.write_text("__global__ void k(float* x) { x[threadIdx.x] = undefined_name; }\n")
    proc = _build.nvcc_compile(bad, tmp_path / "bad.o", ("80",))
    assert proc.returncode != 0 and "undefined_name" in proc.stderr
