"""torch.compile'd models in a profile: what opscope sets before the model is built, `profile --compile MODE`,
the one line a model that fails to compile gets, and torch's structured compile log (TORCH_TRACE).

- Inductor's settings (inductor_profiling): each C++ kernel of a compiled graph becomes a profiler event of
  its own (`graph_0_cpp_fused_gelu_view_0`, config.cpp.enable_kernel_profile), and inductor records which
  graph nodes each kernel came from (config.trace.provenance_tracking_level = 1, written to the log).
- The log: torch writes it where $TORCH_TRACE points, a variable it reads when it is imported, so the parent
  sets it for the child (opscope.target.supervise.run_worker). Nothing is written until something compiles:
  an eager model gets no file and pays nothing. TorchTraceLog finds the file this process wrote.

Nothing here imports torch's compiler stack unless the model already did: `import torch._dynamo` costs
about a second, which an eager model must not pay.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opscope.errors import CompileError, OpscopeError
from opscope.limits import DISPLAY_TEXT_CHARS, bounded
from opscope.sources import classify_path, display_path
from opscope.target.model_file import user_frame_of
from opscope.target.supervise import TORCH_TRACE_ENV

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
TORCH_TRACE_PREFIX = "dedicated_log_torch_trace_"  # torch/_logging/_internal.py LOG_PREFIX
# The most of a compile log a run keeps and reads: a long run's recompilations append graphs to it without end.
MAX_TORCH_TRACE_BYTES = 256 << 20
# What inductor reads from the environment when torch._inductor.config is first imported.
_INDUCTOR_ENV = {"TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE": "1", "INDUCTOR_PROVENANCE": "1"}


def inductor_profiling() -> None:
    """Inductor's settings for a profile, before anything is compiled: a profiler event per C++ kernel
    (config.cpp.enable_kernel_profile) and provenance tracking level 1 (config.trace.provenance_tracking_level).
    Set on torch._inductor.config when it is already imported, else through the environment variables it
    reads on import (importing it here would cost an eager model a second). Changes this process's
    environment: for opscope's worker processes."""
    config = sys.modules.get("torch._inductor.config")
    if config is not None:
        set_inductor_config(config)
    else:
        os.environ.update(_INDUCTOR_ENV)


def set_inductor_config(config: Any) -> None:
    config.cpp.enable_kernel_profile = True
    config.trace.provenance_tracking_level = 1


def _optimized_module() -> type | None:
    """torch._dynamo's OptimizedModule (what torch.compile(module) returns), or None when torch._dynamo was
    never imported (then nothing is compiled)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    cls = getattr(eval_frame, "OptimizedModule", None)
    return cls if isinstance(cls, type) else None


def is_compiled(model: Any) -> bool:
    """Whether `model` itself is a torch.compile'd module."""
    cls = _optimized_module()
    return cls is not None and isinstance(model, cls)


def holds_compiled(model: Any) -> bool:
    """Whether `model` or one of its submodules is a torch.compile'd module."""
    cls = _optimized_module()
    return cls is not None and any(isinstance(m, cls) for m in model.modules())


def _dynamo_frame_count(key: str) -> int:
    """torch._dynamo's frame counter `key` in this process; 0 before torch._dynamo is imported."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None:
        return 0
    try:
        return int(counters["frames"][key])
    except (KeyError, TypeError, ValueError):
        return 0


def dynamo_frames() -> int:
    """How many frames torch._dynamo has compiled (or tried to) in this process."""
    return _dynamo_frame_count("total")


def dynamo_ok_frames() -> int:
    """How many frames torch._dynamo has compiled successfully in this process."""
    return _dynamo_frame_count("ok")


def dynamo_compiled(since: int = 0) -> bool:
    """Whether torch._dynamo compiled a frame in this process after `since` frames (dynamo_ok_frames() taken
    before the model ran): a model that compiles a function of its own. In a process that compiled other
    code before (a notebook, a test session), only what compiled since counts."""
    return dynamo_ok_frames() > since


@dataclass
class CompileInfo:
    """How the profiled model is compiled: meta.json's "compile" entry, and the notes for the user."""

    mode: str | None  # torch.compile's mode; None when the model compiled itself (opscope cannot tell)
    by: str  # "opscope" (--compile) or "model" (get_model() returned a compiled model)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "by": self.by}


def compile_model(model: Any, mode: str | None, device_type: str) -> tuple[Any, CompileInfo | None]:
    """`model` compiled with torch.compile(model, mode=mode) when `mode` is given (profile --compile), and
    how it is compiled; a model that is already compiled stays as it is (one note, no second compile)."""
    if mode is None:
        return model, (CompileInfo(None, "model") if holds_compiled(model) else None)
    if mode not in COMPILE_MODES:
        raise OpscopeError(f"--compile must be one of {', '.join(COMPILE_MODES)}; got {mode!r}")
    if is_compiled(model):
        return model, CompileInfo(None, "model", [f"--compile {mode}: the model is already compiled (get_model() "
                                                   "returned a torch.compile'd module); opscope profiles it as it is"])
    import torch
    import torch._inductor.config as inductor_config

    set_inductor_config(inductor_config)
    notes = []
    if mode == "reduce-overhead" and device_type != "cuda":
        notes.append(f"--compile reduce-overhead: CUDA graphs need a GPU; on {device_type} the mode compiles "
                     "like default")
    return torch.compile(model, mode=mode), CompileInfo(mode, "opscope", notes)


def warmup_steps(warmup: int, compiled: CompileInfo | None, warn: Callable[[str], None]) -> int:
    """The warm-up steps to run: `warmup` (--warmup), and at least one for a compiled model, which compiles
    at its first step (that must not be a timed one)."""
    if warmup < 1 and compiled is not None:
        warn("--warmup 0: the model is compiled, and compiles at its first step, so opscope runs one untimed "
             "warm-up step first")
        return 1
    return warmup


def is_compile_error(exc: BaseException) -> bool:
    """Whether `exc` is torch.compile's: dynamo refused the code (a graph break under fullgraph=True, an
    unsupported construct) or the backend failed (inductor's C++ compiler, a custom backend)."""
    exc_module = sys.modules.get("torch._dynamo.exc")
    base = getattr(exc_module, "TorchDynamoException", None)
    return isinstance(base, type) and isinstance(exc, base)


_USER_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


def compile_error(exc: BaseException) -> CompileError:
    """One line for a torch.compile failure: where in the user's code (dynamo's 'from user code' frame, else
    the innermost frame of the user's code in the traceback) and dynamo's reason (the first line of its message, the backend's error joined to 'backend=... raised:')."""
    text = str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    reason = lines[0] if lines else ""
    if reason.endswith("raised:") and len(lines) > 1:
        reason = f"{reason} {lines[1]}"
    where = ""
    user_part = text[text.rfind("from user code:"):] if "from user code:" in text else ""
    for m in _USER_FRAME.finditer(user_part):
        if classify_path(m.group("file")) == "user":
            where = f"{display_path(m.group('file'))}:{m.group('line')}"
    if not where:  # a backend's own error: its frame in the user's code, when it has one
        where = user_frame_of(exc)
    at = f" at {where}" if where else ""
    what = type(exc).__name__
    return CompileError(bounded(f"torch.compile could not compile the model{at} ({what}): {reason}"
                                if reason else f"torch.compile could not compile the model{at} ({what})",
                                DISPLAY_TEXT_CHARS))


class TorchTraceLog:
    """The structured compile log torch writes in this process when $TORCH_TRACE names a folder. Made
    before the model is loaded, so that a folder the user shares between runs yields this run's file."""

    def __init__(self) -> None:
        self.folder = os.environ.get(TORCH_TRACE_ENV) or None
        self.before = set(self._files())

    def _files(self) -> list[Path]:
        if self.folder is None or not os.path.isdir(self.folder):
            return []
        return [p for p in Path(self.folder).glob(f"{TORCH_TRACE_PREFIX}*.log") if p.is_file()]

    def path(self) -> Path | None:
        """The log this process wrote, or None when it wrote none (nothing compiled, or no $TORCH_TRACE).
        The file torch's handler names when it still writes to it, else the largest file that is new since
        this object was made."""
        if self.folder is None:
            return None
        internal = sys.modules.get("torch._logging._internal")
        current = getattr(getattr(internal, "LOG_TRACE_HANDLER", None), "_stream_path", None)
        if isinstance(current, str) and os.path.isfile(current):
            return Path(current)
        new = [p for p in self._files() if p not in self.before]
        return max(new, key=lambda p: p.stat().st_size, default=None)


def kept_log(log: Path | None) -> tuple[Path | None, str | None]:
    """(the log when the run may keep and read it, else None; a warning when it is too large)."""
    if log is None:
        return None, None
    try:
        size = log.stat().st_size
    except OSError:
        return None, None
    if size > MAX_TORCH_TRACE_BYTES:
        return None, (f"torch.compile's log (TORCH_TRACE) is {size / (1 << 20):,.0f} MiB, over opscope's "
                      f"{MAX_TORCH_TRACE_BYTES >> 20} MiB cap: the run neither keeps nor reads it, so inductor's "
                      "kernels have no FLOPs, bytes or source lines (recompilations make it grow: see "
                      "TORCH_LOGS=recompiles)")
    return log, None
