"""Build and cache the two extensions the kernel folders are compiled into: the CPU extension (every
kernel's `cpu.cpp`) and, on CUDA builds of torch, the CUDA extension (every kernel's `cuda.cu` launchers
and `cuda_binding.cpp` torch binding). Both collect the folders from their manifests: adding a kernel
folder adds it to the builds, nothing else lists it.

Each extension is compiled on first use with torch.utils.cpp_extension (ninja) into a stable cache
folder, keyed by the sources, the headers, the flags and the torch/Python versions, so a cold build
(about a minute on 2 cores for the CPU one) is paid once per machine and torch version; later processes
only load the .so. Concurrent first uses wait on cpp_extension's lock file. Nothing is built at import.

cpp_extension names each object after its source's file name alone (`cuda.cu` -> `cuda.cuda.o`), so
same-named files of different folders would collide (ninja: "multiple rules generate cuda.cuda.o").
The build therefore compiles small generated files named after what they hold, each `#include`-ing the
real source (whose own relative includes still resolve from its folder):
- CPU: `unity_<i>.cpp`, two unity translation units (ATen's headers cost most of the compile time, so
  fewer units build faster); each kernel keeps its own namespace and registers its ops under
  `torch.ops.opscope_cpu`;
- CUDA: `<kernel>.cu` and `<kernel>_binding.cpp` per kernel (separate units, so ninja compiles them in
  parallel); each binding registers its ops under `torch.ops.opscope_cuda`.

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
CUDA_EXTENSION = "opscope_kernels_cuda"
CUDA_ARCHS = ("80", "90")
NVCC_FLAGS = ["-O3", "--use_fast_math", "-std=c++17", "-lineinfo"]
CUDA_ARCH_FLAGS = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in CUDA_ARCHS]
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
    headers = sorted([*PACKAGE_DIR.glob("**/*.h"), *PACKAGE_DIR.glob("**/*.cuh")])
    for path in [*sources, *headers]:
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


def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:  # unchanged files keep ninja's timestamps
        path.write_text(text)


def _including(sources: list[Path]) -> str:
    return "".join(f'#include "{p}"\n' for p in sources)


def _write_units(folder: Path, sources: list[Path]) -> list[str]:
    units = []
    for i in range(_UNITS):
        path = folder / f"unity_{i}.cpp"
        _write_if_changed(path, _including(sources[i::_UNITS]))
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
    """Compile one .cu to an object file for each arch in `archs`, with the flags the extension build
    gives nvcc (torch's own, e.g. no implicit half conversions, then ours): what CI runs on machines
    without a GPU, so a kernel that does not compile fails the tests."""
    from torch.utils.cpp_extension import COMMON_NVCC_FLAGS

    exe = nvcc()
    if exe is None:
        raise KernelBuildError("nvcc not found (set CUDA_HOME or put nvcc on PATH)")
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    return subprocess.run([exe, "-c", *COMMON_NVCC_FLAGS, *NVCC_FLAGS, *gencode, str(source), "-o", str(output)],
                          capture_output=True, text=True, timeout=900)


def cuda_sources() -> dict[str, Path]:
    """What the CUDA extension compiles, by the name it is compiled under: per kernel folder with a
    CUDA backend, `<kernel>.cu` (its cuda.cu, the launchers) and `<kernel>_binding.cpp` (its
    cuda_binding.cpp, the torch binding). Folder names are unique, so the object names are."""
    sources: dict[str, Path] = {}
    for m in load_manifests():
        if "cuda" in m.backends:
            sources[f"{m.name}.cu"] = m.folder / "cuda.cu"
            sources[f"{m.name}_binding.cpp"] = m.folder / "cuda_binding.cpp"
    return sources


def object_name(source: str) -> str:
    """The object file torch.utils.cpp_extension compiles `source` into: its file name's stem, plus
    `.cuda.o` for CUDA sources, else `.o` (the folder is not part of it)."""
    stem, suffix = os.path.splitext(os.path.basename(source))
    return f"{stem}.cuda.o" if suffix in (".cu", ".cuh") else f"{stem}.o"


def write_cuda_units(folder: Path) -> list[str]:
    """Write one unit per CUDA source into `folder`, named as cuda_sources() says and `#include`-ing the
    source; returns their paths, which is what cpp_extension is given. Raises KernelBuildError if two
    of them would compile to the same object."""
    sources = cuda_sources()
    objects = [object_name(name) for name in sources]
    clashes = sorted({o for o in objects if objects.count(o) > 1})
    if clashes:
        raise KernelBuildError(f"CUDA sources compile to the same object: {', '.join(clashes)}")
    folder.mkdir(parents=True, exist_ok=True)
    for name, source in sources.items():
        _write_if_changed(folder / name, _including([source]))
    return [str(folder / name) for name in sources]


def cuda_build_dir() -> Path:
    return build_root() / f"cuda-{_key(list(cuda_sources().values()), NVCC_FLAGS + CUDA_ARCH_FLAGS)}"


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
        folder = cuda_build_dir()
        units = write_cuda_units(folder)
        _ninja_on_path()
        try:
            cpp_extension.load(name=CUDA_EXTENSION, sources=units, extra_cflags=["-O3"],
                               extra_cuda_cflags=NVCC_FLAGS + CUDA_ARCH_FLAGS, build_directory=str(folder),
                               is_python_module=False, verbose=os.environ.get("OPSCOPE_KERNELS_VERBOSE") == "1")
        except Exception as exc:  # noqa: BLE001 - compiler errors come as RuntimeError/CalledProcessError
            tail = "\n".join(str(exc).splitlines()[-25:])
            raise KernelBuildError(f"building the CUDA kernels in {folder} failed:\n{tail}") from exc
        _loaded["cuda"] = True
