"""Verification before any speed is reported: the original and the swapped model on the same inputs.

For each seed (0: the model's own inputs; 1, 2, ...: every finite, non-constant floating input tensor
redrawn with its own mean and standard deviation, integer and boolean inputs kept), both models run on
fresh copies of the inputs with torch's RNG seeded alike (dropout masks match): a forward under
inference_mode, or in train mode forward, loss and the gradients of the loss with respect to every
floating input tensor and every trainable parameter (torch.autograd.grad: no optimizer step, nothing
accumulates in .grad). Buffers are restored before each run (batch norm statistics do not drift).

Each tensor the swapped model produces is compared with the original's:
  - shape and dtype must be the same;
  - a degenerate guard fails all zeros, NaN/Inf where the original is finite, and a constant where the
    original varies (reference_kernels.testing.check_not_degenerate);
  - elementwise |swapped - original| <= rtol * |original| + atol * rms(original): atol is relative to the
    tensor's own scale, so a small gradient is not held to an absolute bound meant for activations;
  - reported: the max abs error, the max rel error (max |swapped - original| / max |original|: normwise,
    defined where elementwise ratios blow up near zero) and the share of elements out of tolerance.
The tolerance per dtype is the larger of MODEL_TOLERANCE (two valid float computations of a whole model
differ in rounding) and, for bundled kernels, the manifest's `[tolerance.<dtype>]`.

Also: the swapped run must leave the model's inputs bitwise as the original run leaves them (unchanged,
unless the model itself writes to them) and its parameters unmodified (their version counters), and the swap must revert cleanly (opscope.swap.apply.differences). An original whose
outputs or gradients hold NaN/Inf fails the verification (there is nothing to compare with). Then the
five traps run on the kernel itself (opscope.swap.traps), also after a failed comparison (they often say
why). A check that fails makes the verification fail; then no speed is measured.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch

from opscope.capture.harness import Harness, first_tensor, process_state_kept
from opscope.swap.apply import differences, snapshot
from opscope.swap.mechanisms import RecordedCall, Swap, version_of
from opscope.swap.tolerance import Check, Tol, compare_group, same_bits, tolerance_for
from opscope.target.model_file import describe_exception

SEEDS = 3


@dataclass
class Verification:
    passed: bool
    checks: list[Check]
    tolerance: dict[str, dict[str, float]]  # dtype -> {"rtol", "atol"}
    swapped_calls: int = 0   # per step
    fallback_calls: int = 0
    sites: list[dict[str, Any]] = field(default_factory=list)  # per site: where, swapped, fallback
    recorded: list[RecordedCall] = field(default_factory=list)

    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]


# --- running the model ---------------------------------------------------------------------------------


def _named_tensors(value: Any, prefix: str = "output") -> dict[str, torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return {prefix: value}
    out: dict[str, torch.Tensor] = {}
    if isinstance(value, dict) or hasattr(value, "items") and callable(value.items):
        for k, v in value.items():
            out.update(_named_tensors(v, f"{prefix}.{k}"))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            out.update(_named_tensors(v, f"{prefix}[{i}]"))
    return out


def _map_tensors(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_map_tensors(v, fn) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_map_tensors(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map_tensors(v, fn) for k, v in value.items()}
    return value


def copy_tree(value: Any) -> Any:
    return _map_tensors(value, lambda t: t.detach().clone())


@dataclass
class Outputs:
    outputs: dict[str, torch.Tensor]
    input_grads: dict[str, torch.Tensor | None] = field(default_factory=dict)
    param_grads: dict[str, torch.Tensor | None] = field(default_factory=dict)


class Runner:
    """Runs the loaded model (the profile's harness) for verification, without an optimizer step."""

    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.model = harness.model
        self.train = harness.mode == "train"
        self.buffers = {k: b.detach().clone() for k, b in self.model.named_buffers()}

    def inputs(self, seed: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        args, kwargs = copy_tree(self.harness.args), copy_tree(self.harness.kwargs)
        if seed == 0:
            return args, kwargs
        gen = torch.Generator().manual_seed(seed)

        def redraw(t: torch.Tensor) -> torch.Tensor:
            if not t.is_floating_point() or t.numel() < 2 or not bool(torch.isfinite(t).all()):
                return t
            std, mean = t.float().std(), t.float().mean()
            if float(std) == 0.0:
                return t
            noise = torch.randn(t.shape, generator=gen).to(device=t.device, dtype=torch.float32)
            return (noise * std + mean).to(t.dtype)

        return _map_tensors(args, redraw), _map_tensors(kwargs, redraw)

    def _restore_buffers(self) -> None:
        with torch.no_grad():
            for k, b in self.model.named_buffers():
                if k in self.buffers and b.shape == self.buffers[k].shape:
                    b.copy_(self.buffers[k])

    def run(self, args: tuple[Any, ...], kwargs: dict[str, Any], seed: int) -> Outputs:
        self._restore_buffers()
        torch.manual_seed(1000 + seed)
        with process_state_kept():
            if not self.train:
                with torch.inference_mode():
                    out = self.model(*args, **kwargs)
                return Outputs(outputs=_named_tensors(out))
            leaves = {n: t for n, t in input_tensors(args, kwargs).items() if t.is_floating_point()}
            for t in leaves.values():
                t.requires_grad_(True)
            params = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
            out = self.model(*args, **kwargs)
            loss = self.harness._loss(out)
            wrt = [*leaves.values(), *params.values()]
            grads = torch.autograd.grad(loss, wrt, allow_unused=True) if wrt else ()
        named = _named_tensors(out)
        outputs = {k: v.detach() for k, v in named.items()}
        first = first_tensor(out) if not named else None
        if first is not None:
            outputs = {"output": first.detach()}
        k = len(leaves)
        return Outputs(outputs=outputs,
                       input_grads={f"grad {n}": g for n, g in zip(leaves, grads[:k], strict=True)},
                       param_grads={f"grad {n}": g for n, g in zip(params, grads[k:], strict=True)})

    def probe_step(self) -> None:
        args, kwargs = self.inputs(0)
        self.run(args, kwargs, 0)


def input_tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The tensors among a call's arguments by name: input[0], input[1][2], input.mask, ..."""
    return {**_named_tensors(tuple(args), "input"), **_named_tensors(dict(kwargs), "input")}


def verify(swap: Swap, runner: Runner, *, seeds: int = SEEDS, traps: bool = True,
           progress: Callable[[str], None] = lambda m: None,
           first_run: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext) -> Verification:
    """`first_run`: the context of the first seed's swapped run, the model's own calls (opscope swap: the
    bundled kernels' shape classes met there are tuned afterwards, not those of the traps' other dtypes)."""
    model = runner.model
    dtypes = {t.dtype for t in [*model.parameters(), *input_tensors(runner.harness.args, runner.harness.kwargs).values()]
              if t.is_floating_point()} or {torch.get_default_dtype()}
    tol_cache: dict[torch.dtype, Tol] = {}

    def tol_of(dtype: torch.dtype) -> Tol:
        if dtype not in tol_cache:
            tol_cache[dtype] = tolerance_for(dtype, swap.tolerance_kernels)
        return tol_cache[dtype]

    checks: list[Check] = []
    result = Verification(passed=False, checks=checks,
                          tolerance={str(d).removeprefix("torch."): vars(tol_of(d)) for d in sorted(dtypes, key=str)})
    before = snapshot(model)
    structure = _structure(model)
    recorded: list[RecordedCall] = []
    for seed in range(seeds):
        progress(f"seed {seed}")
        args, kwargs = runner.inputs(seed)
        want_args, want_kwargs = copy_tree(args), copy_tree(kwargs)
        want = runner.run(want_args, want_kwargs, seed)
        got_args, got_kwargs = copy_tree(args), copy_tree(kwargs)
        versions = {n: version_of(p) for n, p in model.named_parameters()}
        try:
            with swap.applied():
                if seed == 0:
                    swap.reset_counts()
                    with swap.recording() as recorder, first_run():
                        got = runner.run(got_args, got_kwargs, seed)
                    recorded = sorted(recorder.calls.values(), key=lambda c: -c.calls)
                    result.swapped_calls, result.fallback_calls = swap.counts()
                    result.sites = [{**s.describe(), "swapped": s.swapped, "fallback": s.fallback} for s in swap.sites]
                else:
                    got = runner.run(got_args, got_kwargs, seed)
        except Exception as exc:  # the kernel (or the rewritten model) raised: a failure, not a crash
            checks.append(Check("swapped model runs", False, seed, detail=f"the swapped model raised "
                                f"{describe_exception(exc)}"))
            break
        broken = [k for group in (want.outputs, want.input_grads, want.param_grads) for k, v in group.items()
                  if v is not None and v.is_floating_point() and not bool(torch.isfinite(v).all())]
        if broken:
            checks.append(Check("original is finite", False, seed, worst=broken[0], detail=(
                f"the original model's {', '.join(broken[:3])} hold NaN or Inf: nothing to verify against")))
        for name, g, w in (("outputs", got.outputs, want.outputs),
                           ("input gradients", got.input_grads, want.input_grads),
                           ("parameter gradients", got.param_grads, want.param_grads)):
            check = compare_group(name, seed, g, {k: v for k, v in w.items() if v is not None}, tol_of)
            if check is not None:
                checks.append(check)
        # As the original run left them: unchanged, unless the model itself writes to its inputs.
        originals, after = input_tensors(want_args, want_kwargs), input_tensors(got_args, got_kwargs)
        changed = [n for n, t in originals.items() if n in after and not same_bits(t.detach(), after[n].detach())]
        checks.append(Check("inputs unchanged", not changed, seed, tensors=len(originals),
                            detail=f"the swapped model changed {', '.join(changed[:3])} in place" if changed else ""))
        now = dict(model.named_parameters())
        touched = [n for n, p in now.items() if n in versions and version_of(p) != versions[n]]
        added = [n for n in now if n not in versions]
        gone = [n for n in versions if n not in now]
        detail = "; ".join(f"the swapped model {what} {', '.join(names[:3])}" for what, names in (
            ("wrote to", touched), ("added the parameter(s)", added), ("removed the parameter(s)", gone)) if names)
        checks.append(Check("parameters unchanged", not detail, seed, tensors=len(versions), detail=detail))
        if seed == 0 and swap.sites and result.swapped_calls == 0 and swap.mechanisms[0].kind != "compile":
            checks.append(Check("kernel ran", False, seed, detail=f"every one of the {result.fallback_calls} "
                                "call(s) fell back to the original: the kernel never ran"))
    diffs = differences(before, snapshot(model))
    checks.append(Check("swap reverted cleanly", not diffs, detail="; ".join(diffs)))
    result.recorded = recorded
    used = [c for c in recorded if c.used]
    if traps and used and not any(c.check == "swapped model runs" for c in checks):
        from opscope.swap.traps import run_traps

        # also when a comparison failed: the traps often say why (no autograd, a dtype ignored)
        checks.extend(run_traps(used, train=runner.train, tol_of=tol_of, progress=progress))
    _put_back(structure)  # a kernel that added or replaced submodules failed above; later swaps get the model
    result.passed = all(c.passed for c in checks)
    return result


_Structure = list[tuple[torch.nn.Module, dict[str, Any], dict[str, Any], dict[str, Any]]]


def _structure(model: torch.nn.Module) -> _Structure:
    """Each module's submodules, parameters and buffers (the objects)."""
    return [(m, dict(m._modules), dict(m._parameters), dict(m._buffers)) for m in model.modules()]


def _put_back(structure: _Structure) -> None:
    for module, modules, params, buffers in structure:
        for now, then in ((module._modules, modules), (module._parameters, params), (module._buffers, buffers)):
            if now != then or list(now) != list(then):
                now.clear()
                now.update(then)
