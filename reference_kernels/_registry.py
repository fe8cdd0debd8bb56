"""How a kernel folder declares its torch.library custom ops, and their registration on first use.

Each `<kernel>/op.py` defines plain functions (the op, its fake implementation, its autograd) and lists
them in `OPS`, a tuple of CustomOp; importing it registers nothing. `load(name)` registers that
kernel's ops, once per process, and returns `torch.ops.opscope.<name>`. Nothing here imports torch
until a kernel is loaded, so `import reference_kernels` stays free of side effects.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from reference_kernels.manifest import PACKAGE_DIR

NAMESPACE = "opscope"
_lock = threading.RLock()  # reentrant: loading one kernel may import another's op module
_loaded: dict[str, Any] = {}


@dataclass(frozen=True)
class CustomOp:
    """One custom op of a kernel folder: `impl`'s annotated signature is the op's schema (so it must not
    change), `fake` computes only the output's shape, dtype and device (meta tensors, torch.compile),
    and `backward` with `setup_context`, when given, wire the op into autograd."""

    name: str  # "opscope::rms_norm"
    impl: Callable[..., Any]
    fake: Callable[..., Any]
    backward: Callable[..., Any] | None = None
    setup_context: Callable[..., Any] | None = None

    def register(self) -> None:
        import torch

        op = torch.library.custom_op(self.name, self.impl, mutates_args=())
        op.register_fake(self.fake)
        if self.backward is not None:
            op.register_autograd(self.backward, setup_context=self.setup_context)


def is_kernel(name: str) -> bool:
    """Whether `name` is a kernel folder (one with a manifest.toml), without reading any manifest."""
    return name.isidentifier() and not name.startswith("_") and (PACKAGE_DIR / name / "manifest.toml").is_file()


def op_module(name: str) -> Any:
    """`reference_kernels.<name>.op`, imported (it registers nothing)."""
    if not is_kernel(name):
        from reference_kernels.manifest import load_manifests

        names = ", ".join(m.name for m in load_manifests())
        raise ValueError(f"no bundled kernel named {name!r}; the kernels are: {names}")
    return importlib.import_module(f"reference_kernels.{name}.op")


def load(name: str) -> Any:
    """Register kernel `name`'s custom ops (the first call in a process; later calls only look them up)
    and return its op, `torch.ops.opscope.<name>`. Raises ValueError for an unknown kernel."""
    with _lock:
        if name not in _loaded:
            module = op_module(name)
            for op in module.OPS:
                op.register()
            import torch

            _loaded[name] = getattr(getattr(torch.ops, NAMESPACE), name)
        return _loaded[name]


def loaded() -> list[str]:
    """The kernels whose ops this process has registered, sorted."""
    with _lock:
        return sorted(_loaded)
