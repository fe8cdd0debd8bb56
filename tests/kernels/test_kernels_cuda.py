"""The CUDA kernels. Every kernel folder's cuda.cu must compile with nvcc for sm_80 and sm_90, and its
cuda_binding.cpp must compile against torch's headers and call only launchers its own cuda.cu defines
(CI has nvcc but no GPU: a kernel or binding that does not compile fails here). The extension's build
file must give every source its own object (on an H200 the old layout failed with "multiple rules
generate cuda.cuda.o"). Running the kernels needs a GPU and a CUDA build of torch; without one those
tests skip and `opscope kernels` says the CUDA kernels are not run here."""

from __future__ import annotations

import inspect
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import reference_kernels
from kernels_helpers import MANIFESTS, keep_layout_grad, module, op, reference, tensors
from reference_kernels import _build
from reference_kernels.manifest import PACKAGE_DIR
from reference_kernels.testing import assert_matches, gradient_tolerance, tolerance

CUDA = sorted(name for name, m in MANIFESTS.items() if "cuda" in m.backends)
needs_nvcc = pytest.mark.skipif(_build.nvcc() is None, reason="nvcc not found: the CUDA kernels cannot be compiled here")


def _cuda_root() -> Path | None:
    """The CUDA toolkit's root (its include/ has the runtime headers), or None."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    return next((Path(r) for r in roots if r and (Path(r) / "include" / "cuda_runtime_api.h").is_file()), None)


def test_every_kernel_folder_holds_its_cuda_launchers_and_binding() -> None:
    assert sorted(MANIFESTS) == CUDA
    for name in CUDA:
        for file in ("cuda.cu", "cuda_launchers.h", "cuda_binding.cpp"):
            assert (PACKAGE_DIR / name / file).is_file(), f"{name}/{file}"
    # csrc/ keeps what the kernels share; no binding or launcher of a kernel lives there
    assert not list((PACKAGE_DIR / "csrc").glob("*binding*.cpp"))


def test_cuda_build_compiles_each_folders_sources_under_their_own_names(tmp_path: Path) -> None:
    units = [Path(u) for u in _build.write_cuda_units(tmp_path)]
    assert sorted(u.name for u in units) == sorted([f"{n}.cu" for n in CUDA] + [f"{n}_binding.cpp" for n in CUDA])
    objects = [_build.object_name(str(u)) for u in units]
    assert len(set(objects)) == len(objects), objects
    for unit in units:
        kernel = unit.stem.removesuffix("_binding")
        source = PACKAGE_DIR / kernel / ("cuda.cu" if unit.suffix == ".cu" else "cuda_binding.cpp")
        assert unit.read_text() == f'#include "{source}"\n'


def _ninja_file(folder: Path, sources: list[str], monkeypatch: pytest.MonkeyPatch) -> Path:
    """The build.ninja torch.utils.cpp_extension writes for the CUDA extension from `sources`, without
    compiling anything (its private writer: skipped where this torch's differs)."""
    from torch.utils import cpp_extension

    write = getattr(cpp_extension, "_write_ninja_file_to_build_library", None)
    root = _cuda_root()
    if write is None or root is None or shutil.which("ninja") is None:
        pytest.skip("needs torch's ninja file writer, a CUDA toolkit and ninja")
    if cpp_extension.CUDA_HOME is None:  # a CPU build of torch does not look for CUDA
        monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(root))
    args = {"path": str(folder / "build.ninja"), "name": _build.CUDA_EXTENSION, "sources": sources,
            "extra_cflags": ["-O3"], "extra_cuda_cflags": _build.NVCC_FLAGS + _build.CUDA_ARCH_FLAGS,
            "extra_sycl_cflags": [], "extra_ldflags": [], "extra_include_paths": [], "with_cuda": True,
            "with_sycl": False, "is_standalone": False}
    params = inspect.signature(write).parameters
    if not set(params) <= set(args):
        pytest.skip(f"torch's ninja file writer takes {list(params)}")
    write(**{k: v for k, v in args.items() if k in params})
    return folder / "build.ninja"


def test_cuda_build_file_has_one_rule_per_object(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    units = _build.write_cuda_units(tmp_path)
    ninja = _ninja_file(tmp_path, units, monkeypatch)
    proc = subprocess.run(["ninja", "-n", "-C", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # ninja refuses a file where two rules make one object
    built = re.findall(r"^build (\S+): (?:cuda_)?compile ", ninja.read_text(), re.M)
    assert sorted(built) == sorted(_build.object_name(u) for u in units)


def test_same_named_sources_of_two_folders_break_the_build_file(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Why the build compiles generated `<kernel>.cu` units: given the folders' own files, cpp_extension
    names both objects cuda.cuda.o and ninja refuses the build file (the H200 failure)."""
    sources = [str(PACKAGE_DIR / name / "cuda.cu") for name in CUDA[:2]]
    _ninja_file(tmp_path, sources, monkeypatch)
    proc = subprocess.run(["ninja", "-n", "-C", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "multiple rules generate cuda.cuda.o" in proc.stderr


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("name", CUDA)
def test_cuda_kernel_compiles_for_sm80_and_sm90(name: str, tmp_path: Path) -> None:
    proc = _build.nvcc_compile(PACKAGE_DIR / name / "cuda.cu", tmp_path / f"{name}.o", ("80", "90"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / f"{name}.o").stat().st_size > 0


def _functions(obj: Path, kinds: str) -> set[str]:
    """The demangled opscope_cuda:: symbols of an object file whose nm type is one of `kinds` (U: used
    but not defined here; T, W: defined here)."""
    out = subprocess.run(["nm", "-C", str(obj)], capture_output=True, text=True, check=True).stdout
    found = set()
    for line in out.splitlines():
        m = re.match(r"^\s*(?:[0-9a-fA-F]+\s+)?([A-Za-z])\s+(opscope_cuda::.*)$", line)
        if m and m.group(1) in kinds:
            found.add(m.group(2))
    return found


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("name", CUDA)
def test_cuda_binding_compiles_and_calls_only_its_own_launchers(name: str, tmp_path: Path) -> None:
    """The binding is built only with a CUDA torch; here it is compiled with the CPU wheel's headers (its
    c10/cuda headers lack one generated file, stubbed empty) and CUDA's runtime headers, and every
    launcher it calls must be defined by the same folder's cuda.cu: a folder is a whole kernel."""
    root = _cuda_root()
    if root is None or _build.compiler() is None or shutil.which("nm") is None:
        pytest.skip("needs a C++ compiler, nm and the CUDA runtime headers")
    from torch.utils.cpp_extension import include_paths

    stub = tmp_path / "stub" / "c10" / "cuda" / "impl"
    stub.mkdir(parents=True)
    (stub / "cuda_cmake_macros.h").write_text("")
    binding, launchers = tmp_path / "binding.o", tmp_path / "launchers.o"
    cmd = [_build.compiler(), "-c", "-O0", "-fPIC", "-std=c++20", *[f"-isystem{p}" for p in include_paths()],
           f"-I{tmp_path / 'stub'}", f"-I{root / 'include'}", str(PACKAGE_DIR / name / "cuda_binding.cpp"),
           "-o", str(binding)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = _build.nvcc_compile(PACKAGE_DIR / name / "cuda.cu", launchers, ("80",))
    assert proc.returncode == 0, proc.stderr[-3000:]
    called, defined = _functions(binding, "U"), _functions(launchers, "TW")
    assert called, "the binding calls no launcher"
    assert called <= defined, f"called but not defined by {name}/cuda.cu: {sorted(called - defined)}"


gpu = pytest.mark.skipif(not (torch.cuda.is_available() and torch.version.cuda),
                         reason="no GPU here: the CUDA kernels are compiled, not run")


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("name", CUDA)
def test_gpu_kernels_match_pytorch(name: str, backend: str, dtype: torch.dtype) -> None:
    """Forward and backward on the GPU (compiled Triton: conftest leaves the interpreter off where torch
    sees a GPU) against PyTorch in higher precision, under the manifest's tolerance."""
    for args in module(name).samples(dtype, 0):
        cuda_args = tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in args)
        leaves = keep_layout_grad(cuda_args)
        with reference_kernels.use_backend(backend):
            out = op(name)(*leaves)
        ref_args, expected = reference(name, args, dtype, grad=True)
        tol = tolerance(MANIFESTS[name], dtype)
        assert_matches(out.cpu(), expected, tol, f"{backend} {name} {dtype}")
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(0)).to(dtype)
        with reference_kernels.use_backend(backend):
            grads = torch.autograd.grad(out, tensors(leaves), g.cuda())
        ref_grads = torch.autograd.grad(expected, tensors(ref_args), g.to(expected.dtype))
        for a, b in zip(grads, ref_grads, strict=True):
            assert_matches(a.cpu(), b, gradient_tolerance(tol, b, dtype), f"{backend} {name} grad {dtype}")


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
