"""The tuning cache: the best value of a kernel's knobs per (kernel, function, shapes, dtype, device,
threads), measured by `opscope kernels --bench --tune` (see opscope/kernels_bench.py) and stored on disk.

Knobs: `grain_size` of the CPU kernels (elements or rows per at::parallel_for task: too small and the
tasks' overhead shows, too large and a thread idles at the end). 0 means "the kernel's built-in
default". Lookups happen on every call, so they only read an in-memory dict loaded once per process.

File: $OPSCOPE_CACHE_DIR/kernels-tuning.json, else ~/.cache/opscope/kernels-tuning.json:
    {"format": 1, "entries": {"<key>": {"grain_size": 65536, "candidates": {...}, "measured": "..."}}}
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

FORMAT = 1
_entries: dict[str, dict[str, Any]] | None = None


def cache_path() -> Path:
    base = os.environ.get("OPSCOPE_CACHE_DIR")
    root = Path(base).expanduser() if base else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "opscope"
    return root / "kernels-tuning.json"


def key(kernel: str, fn: str, args: tuple[Any, ...]) -> str:
    import torch

    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    shapes = ";".join("x".join(map(str, t.shape)) for t in tensors)
    dtype = str(tensors[0].dtype).removeprefix("torch.") if tensors else "-"
    device = tensors[0].device.type if tensors else "cpu"
    return f"{kernel}|{fn}|{shapes}|{dtype}|{device}|t{torch.get_num_threads()}"


def _load() -> dict[str, dict[str, Any]]:
    global _entries
    if _entries is None:
        try:
            doc = json.loads(cache_path().read_text())
            _entries = doc["entries"] if doc.get("format") == FORMAT else {}
        except (OSError, ValueError, KeyError, TypeError):
            _entries = {}
    return _entries


def knob(kernel: str, fn: str, args: tuple[Any, ...], name: str) -> int:
    entries = _load()
    if not entries:
        return 0
    return int(entries.get(key(kernel, fn, args), {}).get(name, 0))


def store(kernel: str, fn: str, args: tuple[Any, ...], values: dict[str, Any]) -> Path:
    """Record the chosen knob values (and whatever evidence is in `values`) for these arguments."""
    entries = _load()
    entries[key(kernel, fn, args)] = values
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"format": FORMAT, "entries": entries}, indent=1, sort_keys=True))
    tmp.replace(path)
    return path


def reset() -> None:
    """Forget the in-memory copy (the next lookup rereads the file)."""
    global _entries
    _entries = None
