"""The tuning cache: the best value of a kernel's knobs per (machine, kernel, function, shape class,
dtype, device, threads), measured by `opscope kernels --tune` (or on first use within a time budget by
`opscope profile`, `opscope swap` and `--bench`, see opscope/kernels/bench.py) over the search space the kernel's
manifest declares (`[tune.cpu]`), and stored on disk beside opscope's CPU calibration.

Knobs: `grain_size` of the CPU kernels (elements or rows per at::parallel_for task: too small and the
tasks' overhead shows, too large and a thread idles at the end). 0 means "the kernel's built-in
default". The Triton forwards' `block`, `num_warps` and `num_stages` (`[tune.triton]`, keyed
"triton:<function>" and by the GPU's model instead of the CPU's: reference_kernels._triton). Lookups
happen on every call, so they only read an in-memory dict loaded once per process.

Keys. The machine: the CPU model, its logical CPUs and the architecture (a cache copied to another
machine finds nothing of its own). The shape class: per tensor argument, its element count and its
last dim, each rounded up to a power of two (what the grain acts on: how many tasks there are, how long
a row is), so one tuning serves the nearby shapes a model runs, not only the benchmark's exact one; and
the int, bool and string arguments (a reduction's dim, a GELU's form), which pick the code path.

File: $OPSCOPE_CACHE_DIR/kernels-tuning.json, else the platform's user cache dir for "opscope" (where
the calibration is cached):
    {"format": 2, "entries": {"<key>": {"grain_size": 65536, "candidates_ms": {...}, "measured": "..."}}}
A file that cannot be read as such (corrupt, truncated, another format, a knob value no launch can
take) is ignored: no knob is tuned, `note()` says so in one line, and the next store writes a fresh file.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

FORMAT = 2
_entries: dict[str, dict[str, Any]] | None = None
_note: str | None = None
_machine: str | None = None
# Tuning on first use: (kernel, fn, args) -> None, called the first time `knob` meets an untuned key while a
# caller allows the time for it (`first_use`: opscope swap, while it verifies, before anything is timed).
FirstUse = Callable[[str, str, tuple[Any, ...]], None]
_first_use: FirstUse | None = None
_met: set[str] = set()  # keys handed to a first-use tuner already (tuned, or not tunable): never twice


def cache_path() -> Path:
    base = os.environ.get("OPSCOPE_CACHE_DIR")
    if base:
        return Path(base).expanduser() / "kernels-tuning.json"
    try:
        import platformdirs

        root = Path(platformdirs.user_cache_dir("opscope"))
    except ImportError:  # reference_kernels installed without opscope
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "opscope"
    return root / "kernels-tuning.json"


def machine() -> str:
    """This machine's identity in the keys: CPU model, logical CPUs, architecture."""
    global _machine
    if _machine is None:
        model = platform.processor() or ""
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        _machine = f"{model or 'unknown cpu'} x{os.cpu_count() or 0} {platform.machine()}".replace("|", "/")
    return _machine


def _pow2(n: int) -> int:
    """The exponent of the smallest power of two >= n (0 for n <= 1)."""
    return max(int(n) - 1, 0).bit_length()


def shape_class(args: tuple[Any, ...]) -> str:
    """The tensors' shapes as the grain sees them: `e<log2 elements>.l<log2 last dim>` per tensor; then
    `a=<value>` per argument that picks a code path (an int, a bool or a string: sum's dim, bias_gelu's
    form), so that rows and columns, erf and tanh are tuned apart. Float arguments (an eps, a scale) pick
    none and are left out, so that models with other values share the tuning."""
    import torch

    parts = [f"e{_pow2(a.numel())}.l{_pow2(a.shape[-1] if a.dim() else 1)}" if isinstance(a, torch.Tensor)
             else f"a={a}".replace("|", "/") for a in args if isinstance(a, (torch.Tensor, int, str))]  # bool: an int
    return ";".join(parts)


def key(kernel: str, fn: str, args: tuple[Any, ...]) -> str:
    import torch

    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    dtype = str(tensors[0].dtype).removeprefix("torch.") if tensors else "-"
    device = tensors[0].device.type if tensors else "cpu"
    where = gpu_name(tensors[0].device.index or 0) if device == "cuda" else machine()
    return f"{where}|{kernel}|{fn}|{shape_class(args)}|{dtype}|{device}|t{torch.get_num_threads()}"


@functools.cache
def gpu_name(index: int) -> str:
    """A GPU's identity in the keys of its tunings (the Triton launches'): its model, as torch names it."""
    import torch

    return torch.cuda.get_device_name(index).replace("|", "/")


def _read(path: Path) -> tuple[dict[str, dict[str, Any]], str | None]:
    """The file's entries and, when it was ignored, why (one line)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}, None
    except OSError as exc:
        return {}, f"the kernel tuning cache {path} cannot be read ({exc.strerror or exc}); ignored, knobs untuned"
    try:
        doc = json.loads(text)
        entries = doc["entries"] if doc.get("format") == FORMAT else None
        if entries is None:
            return {}, (f"the kernel tuning cache {path} is of another format ({doc.get('format')!r}, not {FORMAT}); "
                        "ignored, knobs untuned until re-tuned")
        if not isinstance(entries, dict) or not all(isinstance(v, dict) and _valid_knobs(v) for v in entries.values()):
            raise TypeError("entries")
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}, f"the kernel tuning cache {path} is corrupt; ignored, knobs untuned until re-tuned"
    return entries, None


def _valid_knobs(entry: dict[str, Any]) -> bool:
    """An entry's knob values are what a launch can take: a grain size >= 0; a Triton BLOCK and warp count
    that are powers of two, and a stage count >= 1 (a hand-edited BLOCK of 1000 would fail every launch)."""
    def is_int(v: Any, least: int) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= least

    return (is_int(entry.get("grain_size", 0), 0) and is_int(entry.get("num_stages", 1), 1)
            and all(is_int(v := entry.get(k, 1), 1) and v & (v - 1) == 0 for k in ("block", "num_warps")))


def _load() -> dict[str, dict[str, Any]]:
    global _entries, _note
    if _entries is None:
        _entries, _note = _read(cache_path())
    return _entries


def note() -> str | None:
    """Why the cache file was ignored (corrupt, unreadable, another format), else None."""
    _load()
    return _note


def lookup(kernel: str, fn: str, args: tuple[Any, ...]) -> dict[str, Any] | None:
    """The cached entry for these arguments' class, or None when they were never tuned here."""
    entries = _load()
    return entries.get(key(kernel, fn, args)) if entries else None


def knob(kernel: str, fn: str, args: tuple[Any, ...], name: str) -> int:
    entry = lookup(kernel, fn, args)
    if entry is None and _first_use is not None:
        k = key(kernel, fn, args)
        if k not in _met:
            _met.add(k)
            _first_use(kernel, fn, args)
            entry = lookup(kernel, fn, args)
    return int(entry.get(name, 0)) if entry else 0


@contextlib.contextmanager
def first_use(tuner: FirstUse) -> Iterator[None]:
    """Within the block, an untuned key met by `knob` is handed to `tuner` once (which may store a tuning)
    before its knob is read."""
    global _first_use
    before = _first_use
    _first_use = tuner
    try:
        yield
    finally:
        _first_use = before


def store(kernel: str, fn: str, args: tuple[Any, ...], values: dict[str, Any]) -> Path:
    """Record the chosen knob values (and whatever evidence is in `values`) for these arguments' class."""
    entries = _load()
    entries[key(kernel, fn, args)] = values
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"format": FORMAT, "entries": entries}, indent=1, sort_keys=True))
    tmp.replace(path)
    return path


def reset() -> None:
    """Forget the in-memory copy (the next lookup rereads the file)."""
    global _entries, _note
    _entries, _note = None, None
    _met.clear()
