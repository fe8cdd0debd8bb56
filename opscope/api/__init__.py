"""opscope's public Python API (re-exported by `opscope`): profile a model or a block of code, analyze a
trace, load and compare runs, verify and time kernel swaps. The CLI and the MCP server are thin layers
over these functions. Errors are `opscope.OpscopeError` subclasses carrying the CLI's one-line
messages; nothing here prints unless asked (`Run.print`) or exits."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from opscope.api.capture import Session, profiling
from opscope.api.ci_gate import baseline_save, gate
from opscope.api.explain import explain_op
from opscope.api.files import analyze, compare, load
from opscope.api.jobs import profile_file, profile_repeated, swap
from opscope.api.run import Finding, Rows, Run
from opscope.api.whatif import WhatIf, whatif
from opscope.capture.options import Progress
from opscope.errors import OpscopeError
from opscope.run.compare import Comparison

if TYPE_CHECKING:
    import torch


def profile(model: torch.nn.Module | str | os.PathLike[str], inputs: Any = None, *, mode: str = "inference",
            steps: int = 5, warmup: int = 2, device: str = "auto", dtype: str | None = None,
            out: str | os.PathLike[str] | None = None, compile: str | None = None, threads: int | None = None,
            peak_bw: float | None = None, peak_flops: Sequence[str] | str | None = None,
            loss_fn: Callable[[Any], Any] | None = None, entry: str | None = None,
            progress: Progress | None = None) -> Run:
    """Profiles a model: `warmup` untimed steps, `steps` timed ones under torch.profiler, then the untimed
    passes for source lines and memory, and the analysis; writes the run directory (`out`, default a new
    folder under ./reports) and returns the Run.

    `model` is an `nn.Module` called as `model(*inputs)` (a list/tuple of arguments, a dict of keyword
    arguments, or one tensor), profiled in this process; its weights, gradients and train/eval flags are as
    before afterwards (a copy is profiled when `device` or `dtype` would move or cast it). Or `model` is the
    path of a model file (as `opscope profile FILE`; `inputs` must be None, `entry` names its function),
    profiled in a child process.

    mode: "inference" (forward only) or "train" (forward, loss, backward and an SGD step; `loss_fn(output)`
    gives the loss, default the output's sum). device: "auto", "cpu" or "cuda". dtype: None (the model's
    own), "float32", "bfloat16" or "float16". compile: a torch.compile mode to compile the model with.
    threads: torch's thread count. peak_bw (GB/s) / peak_flops ("GFLOPS" or "DTYPE=GFLOPS"): ceilings
    instead of the measured or known ones. progress: an opscope.Progress receiving the phases and
    warnings (which are also kept in `run.warnings`)."""
    if isinstance(model, (str, os.PathLike)):
        if inputs is not None:
            raise OpscopeError("a model file defines its own inputs (get_inputs()): call opscope.profile(path) "
                               "without inputs")
        if loss_fn is not None:
            raise OpscopeError("a model file defines its own loss (loss_fn(output) in the file): call "
                               "opscope.profile(path) without loss_fn")
        return profile_file(model, entry=entry, device=device, dtype=dtype, mode=mode, warmup=warmup, steps=steps,
                            threads=threads, peak_bw=peak_bw, peak_flops=peak_flops, out=out, compile=compile,
                            progress=progress)
    if entry is not None:
        raise OpscopeError("entry names the function of a model file that returns (model, inputs): it goes with "
                           "a path, not a model object")
    from opscope.api.capture import profile_model

    return profile_model(model, inputs, mode=mode, steps=steps, warmup=warmup, device=device, dtype=dtype, out=out,
                         compile=compile, threads=threads, peak_bw=peak_bw, peak_flops=peak_flops,
                         loss_fn=loss_fn, progress=progress)


__all__ = [
    "Comparison",
    "Finding",
    "OpscopeError",
    "Progress",
    "Rows",
    "Run",
    "Session",
    "WhatIf",
    "analyze",
    "baseline_save",
    "compare",
    "explain_op",
    "gate",
    "load",
    "profile",
    "profile_file",
    "profile_repeated",
    "profiling",
    "swap",
    "whatif",
]
