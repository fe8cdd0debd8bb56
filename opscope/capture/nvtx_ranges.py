"""NVTX ranges for Nsight, and the measured pass that `nsys` / `ncu` run.

`--nvtx` marks each profiled step (a push/pop range named opscope_step, the same every step so that one
ncu filter selects them all) and each forward of the model's top-level modules (its direct children:
opscope_module:<name> (<class>)). The NVTX calls cost nothing measurable without a tool attached.

The measured pass (the process nsys or ncu launch) loads the model as `profile` does, runs the warmup
steps, then the steps inside torch.cuda.profiler.start()/stop() (nsys captures only that range) with the
ranges above and, with --nvtx-ops, torch.autograd.profiler.emit_nvtx(record_shapes=True) (every aten op a
range with its input sizes; it cannot run together with torch.profiler, so only this pass has it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import nvtx
import torch

from opscope.capture.compiled import warmup_steps
from opscope.capture.harness import Harness, process_state_kept, resolve_device
from opscope.capture.options import MODULE_RANGE_PREFIX, STEP_RANGE, Progress
from opscope.target.model_file import load_target
from opscope.target.specs import ProfileOptions


@contextlib.contextmanager
def step_range(enabled: bool = True) -> Iterator[None]:
    if not enabled:
        yield
        return
    nvtx.push_range(STEP_RANGE, color="green")
    try:
        yield
    finally:
        nvtx.pop_range()


@contextlib.contextmanager
def module_ranges(model: torch.nn.Module, enabled: bool = True) -> Iterator[None]:
    """A range around every forward of each of the model's direct children (hooks removed on exit); a
    rank's model wrapped in DistributedDataParallel (--nproc-per-node) is marked by its wrapped module's."""
    if not enabled:
        yield
        return
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model = model.module
    handles = []
    for name, child in model.named_children():
        label = f"{MODULE_RANGE_PREFIX}{name} ({type(child).__name__})"

        def push(module: torch.nn.Module, args: Any, label: str = label) -> None:
            nvtx.push_range(label, color="blue")

        def pop(module: torch.nn.Module, args: Any, output: Any) -> None:
            nvtx.pop_range()

        handles.append(child.register_forward_pre_hook(push))
        handles.append(child.register_forward_hook(pop, always_call=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def measured_pass(opts: ProfileOptions, nvtx_ops: bool, progress: Progress, label: str = "") -> dict[str, Any]:
    """The steps nsys/ncu measure (`label` names the tool in progress phases).
    Returns {"steps": n}."""
    prefix = f"{label}: " if label else ""
    if opts.threads:
        torch.set_num_threads(opts.threads)
    device = resolve_device(opts.device)
    cuda = device.type == "cuda"
    progress.phase(f"{prefix}loading model")
    with process_state_kept(keep_additions=True):
        target = load_target(opts.target, opts.entry)
    harness = Harness(target, mode=opts.mode, device=device, dtype=opts.dtype, compile=opts.compile)
    warmup = warmup_steps(opts.warmup, harness.compiled, lambda message: None)  # the profile pass said it
    with module_ranges(harness.model):
        progress.phase(f"{prefix}warmup", total=warmup)
        for _ in range(warmup):
            harness.step()
            progress.advance()
        harness.synchronize()
        progress.phase(f"{prefix}measuring {opts.steps} steps", total=opts.steps)
        ops_ranges: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if nvtx_ops:
            ops_ranges = torch.autograd.profiler.emit_nvtx(record_shapes=True)  # type: ignore[no-untyped-call, unused-ignore]  # unannotated in torch
        if cuda:
            torch.cuda.profiler.start()  # type: ignore[no-untyped-call, unused-ignore]  # unannotated in torch
        try:
            with ops_ranges:
                for _ in range(opts.steps):
                    with step_range():
                        harness.step()
                        harness.synchronize()
                    progress.advance()
        finally:
            if cuda:
                torch.cuda.profiler.stop()  # type: ignore[no-untyped-call, unused-ignore]  # unannotated in torch
    return {"steps": opts.steps}
