"""Build and cache the one CPU extension that holds every kernel's `cpu.cpp` (and, on CUDA builds of
torch, the CUDA extension from the `cuda.cu` files).

The CPU extension is compiled on first use with torch.utils.cpp_extension (ninja) into a stable cache
folder, keyed by the sources, the flags and the torch/Python versions, so a cold build (about a minute
on 2 cores) is paid once per machine and torch version; later processes only load the .so. Concurrent
first uses wait on cpp_extension's lock file. The kernels are compiled as two unity translation units
(ATen's headers cost most of the compile time, so fewer units build faster); each kernel keeps its own
namespace and registers its ops under `torch.ops.opscope_cpu`.

Cache folder: $OPSCOPE_KERNELS_BUILD_DIR, else $XDG_CACHE_HOME/opscope/kernels-build (~/.cache/...).
Set OPSCOPE_KERNELS_VERBOSE=1 to see the compiler.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from reference_kernels.manifest import PACKAGE_DIR, load_manifests

CPU_EXTENSION = "opscope_kernels_cpu"
# -fno-trapping-math as torch itself builds: without it GCC will not vectorize floor/int conversions (exp).
CPU_CFLAGS = ["-O3", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-Wno-unused-function"]
# -fopenmp links libgomp.so.1; torch's own copy (same soname) is already loaded, so the extension
# shares torch's intra-op thread pool and torch.set_num_threads governs it.
CPU_LDFLAGS = ["-fopenmp"]
CUDA_ARCHS = ("80", "90")
NVCC_FLAGS = ["-O3", "--use_fast_math", "-std=c++17", "-lineinfo"]
_UNITS = 2
_lock = threading.Lock()
_loaded: dict[str, bool] = {}


class KernelBuildError(RuntimeError):
    """The extension did not compile or load; the message carries the compiler's last lines."""


def build_root() -> Path:
    env = os.environ.get("OPSCOPE_KERNELS_BUILD_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "opscope" / "kernels-build"


def cpu_sources() -> list[Path]:
    """common.cpp plus every kernel's cpu.cpp, in a fixed order."""
    kernels = [m.folder / "cpu.cpp" for m in load_manifests() if "cpu" in m.backends]
    return [PACKAGE_DIR / "csrc" / "common.cpp", *kernels]


def _key(sources: list[Path], flags: list[str]) -> str:
    import torch

    h = hashlib.sha256()
    for path in [*sources, *sorted(PACKAGE_DIR.glob("**/*.h"))]:
        h.update(str(path).encode())
        h.update(path.read_bytes())
    h.update(" ".join(flags).encode())
    h.update(f"{torch.__version__}|{sys.version_info[:2]}".encode())
    return h.hexdigest()[:16]


def cpu_build_dir() -> Path:
    return build_root() / f"cpu-{_key(cpu_sources(), CPU_CFLAGS + CPU_LDFLAGS)}"


def cpu_library_path() -> Path:
    return cpu_build_dir() / f"{CPU_EXTENSION}.so"


def compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")


def _ninja_on_path() -> None:
    """cpp_extension runs `ninja`; the pip package's binary may not be on PATH (venv not activated)."""
    dirs = [str(Path(sys.executable).parent)]
    try:
        import ninja  # type: ignore[import-untyped]

        dirs.insert(0, ninja.BIN_DIR)
    except ImportError:
        pass
    os.environ["PATH"] = os.pathsep.join([*dirs, os.environ.get("PATH", "")])


def _write_units(folder: Path, sources: list[Path]) -> list[str]:
    units = []
    for i in range(_UNITS):
        text = "".join(f'#include "{p}"\n' for p in sources[i::_UNITS])
        path = folder / f"unity_{i}.cpp"
        if not path.exists() or path.read_text() != text:  # unchanged files keep ninja's timestamps
            path.write_text(text)
        units.append(str(path))
    return units


def load_cpu_extension() -> None:
    """Compile (first time) and load the CPU extension; its ops appear under torch.ops.opscope_cpu."""
    if _loaded.get("cpu"):
        return
    with _lock:
        if _loaded.get("cpu"):
            return
        if compiler() is None:
            raise KernelBuildError("the CPU kernels need a C++ compiler (g++ or $CXX); none was found")
        import torch
        from torch.utils import cpp_extension

        folder = cpu_build_dir()
        folder.mkdir(parents=True, exist_ok=True)
        _ninja_on_path()
        units = _write_units(folder, cpu_sources())
        try:
            cpp_extension.load(name=CPU_EXTENSION, sources=units, extra_cflags=CPU_CFLAGS,
                               extra_ldflags=CPU_LDFLAGS, build_directory=str(folder), is_python_module=False,
                               verbose=os.environ.get("OPSCOPE_KERNELS_VERBOSE") == "1")
        except Exception as exc:  # noqa: BLE001 - compiler errors come as RuntimeError/CalledProcessError
            tail = "\n".join(str(exc).splitlines()[-25:])
            raise KernelBuildError(f"building the CPU kernels in {folder} failed:\n{tail}") from exc
        assert hasattr(torch.ops.opscope_cpu, "isa")
        _loaded["cpu"] = True


def cpu_status() -> str:
    """One phrase for `opscope kernels`: built, builds on first use, or cannot build."""
    if _loaded.get("cpu") or cpu_library_path().exists():
        return f"built ({cpu_library_path().parent})"
    if compiler() is None:
        return "unavailable: no C++ compiler found"
    return "compiles on first use (about a minute, once; cached)"


# ---- CUDA ------------------------------------------------------------------------------------------


def nvcc() -> str | None:
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidates = [str(Path(cuda_home) / "bin" / "nvcc")] if cuda_home else []
    candidates += [shutil.which("nvcc") or "", "/usr/local/cuda/bin/nvcc"]
    return next((c for c in candidates if c and Path(c).is_file()), None)


def nvcc_compile(source: Path, output: Path, archs: tuple[str, ...] = CUDA_ARCHS) -> subprocess.CompletedProcess:
    """Compile one .cu to an object file for each arch in `archs` (what CI runs on machines without a
    GPU: a kernel that does not compile fails the tests)."""
    exe = nvcc()
    if exe is None:
        raise KernelBuildError("nvcc not found (set CUDA_HOME or put nvcc on PATH)")
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    return subprocess.run([exe, "-c", *NVCC_FLAGS, *gencode, str(source), "-o", str(output)],
                          capture_output=True, text=True, timeout=900)


def cuda_sources() -> list[Path]:
    return [m.folder / "cuda.cu" for m in load_manifests() if "cuda" in m.backends]


def load_cuda_extension() -> None:
    """Compile and load the CUDA extension (needs a CUDA build of torch and nvcc); its ops appear under
    torch.ops.opscope_cuda."""
    if _loaded.get("cuda"):
        return
    with _lock:
        if _loaded.get("cuda"):
            return
        import torch
        from torch.utils import cpp_extension

        if torch.version.cuda is None:
            raise KernelBuildError("the CUDA kernels need a CUDA build of torch (this one is CPU-only)")
        sources = [PACKAGE_DIR / "csrc" / "cuda_binding.cpp", *cuda_sources()]
        archs = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in CUDA_ARCHS]
        folder = build_root() / f"cuda-{_key(sources, NVCC_FLAGS + archs)}"
        folder.mkdir(parents=True, exist_ok=True)
        _ninja_on_path()
        try:
            cpp_extension.load(name="opscope_kernels_cuda", sources=[str(s) for s in sources],
                               extra_cflags=["-O3"], extra_cuda_cflags=NVCC_FLAGS + archs,
                               build_directory=str(folder), is_python_module=False,
                               verbose=os.environ.get("OPSCOPE_KERNELS_VERBOSE") == "1")
        except Exception as exc:  # noqa: BLE001
            tail = "\n".join(str(exc).splitlines()[-25:])
            raise KernelBuildError(f"building the CUDA kernels in {folder} failed:\n{tail}") from exc
        _loaded["cuda"] = True
