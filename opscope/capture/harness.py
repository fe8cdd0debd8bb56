"""The step opscope times: one forward (inference) or forward + loss + backward + SGD step (train).

Ops issued here (loss, backward seed, optimizer) have no user frame above them, so the line pass
labels them `opscope:harness` and findings never point at them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import torch

from opscope.capture.compiled import compile_error, compile_model, is_compile_error
from opscope.errors import TargetError
from opscope.target.model_file import Target, describe_exception, user_frame_of

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16",
               torch.float64: "float64"}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise TargetError("--device cuda: no CUDA GPU is available on this machine (torch.cuda.is_available() is False)")
    if device not in ("cpu", "cuda"):
        raise TargetError(f"--device must be auto, cpu or cuda; got {device!r}")
    return torch.device(device)


def _move(value: Any, device: torch.device, dtype: torch.dtype | None) -> Any:
    """Tensors (also inside lists, tuples and dicts) moved to the device, floating ones converted to
    `dtype`; everything else (numbers, None, strings, ...) unchanged."""
    if isinstance(value, torch.Tensor):
        if dtype is not None and value.is_floating_point():
            return value.to(device=device, dtype=dtype)
        return value.to(device=device)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple takes its fields positionally
        return type(value)(*(_move(v, device, dtype) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_move(v, device, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _move(v, device, dtype) for k, v in value.items()}
    return value


def _tensors_in(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    return [t for v in items for t in _tensors_in(v)]


def first_tensor(output: Any) -> torch.Tensor | None:
    """The tensor a default loss is built from: the output itself, or `logits` / `last_hidden_state`
    of dicts and Hugging Face ModelOutputs, else the first tensor found."""
    if isinstance(output, torch.Tensor):
        return output
    for name in ("logits", "last_hidden_state"):
        value = output.get(name) if isinstance(output, dict) else getattr(output, name, None)
        if isinstance(value, torch.Tensor):
            return value
    items = output.values() if isinstance(output, dict) else output if isinstance(output, (list, tuple)) else ()
    for item in items:
        found = first_tensor(item)
        if found is not None:
            return found
    return None


def model_dtype(model: torch.nn.Module) -> torch.dtype | None:
    for p in list(model.parameters()) + list(model.buffers()):
        if p.is_floating_point():
            return p.dtype
    return None


@contextmanager
def process_state_kept(keep_additions: bool = False) -> Iterator[None]:
    """Restores sys.path and the working directory after the user's code ran: a model that changes them
    must not break what opscope (and torch's lazy imports) do next. A few µs per step. With
    keep_additions (the model's import), entries it added stay, so its later lazy imports work; the
    ones it removed come back."""
    path = list(sys.path)
    try:
        cwd: str | None = os.getcwd()
    except OSError:
        cwd = None
    try:
        yield
    finally:
        if sys.path != path:
            if keep_additions:
                sys.path.extend(p for p in path if p not in sys.path)
            else:
                sys.path[:] = path
        if cwd is not None:
            with suppress(OSError):
                if os.getcwd() != cwd:
                    os.chdir(cwd)


def _refuse_meta(model: torch.nn.Module, args: Any, kwargs: Any) -> None:
    """Tensors on the meta device have shapes but no data: nothing can run on them, so say which."""
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if t.is_meta:
            raise TargetError(f"the model's {name} is on the meta device (a shape without data): materialize the "
                              "model in get_model() (e.g. model.to_empty(device='cpu') and initialize it)")
    for i, t in enumerate(_tensors_in((args, kwargs))):
        if t.is_meta:
            raise TargetError(f"the inputs hold a tensor on the meta device (input tensor {i}, shape "
                              f"{list(t.shape)}): it has no data to run on; create the inputs on cpu or cuda")


class Harness:
    """The model, its inputs and the step. With `compile` (profile --compile MODE) the model is wrapped in
    torch.compile(model, mode=compile) once it is on its device; `compiled` says how the model is compiled
    (None: eager), with notes for the user."""

    def __init__(self, target: Target, *, mode: str, device: torch.device, dtype: str | None,
                 compile: str | None = None) -> None:
        if mode not in ("inference", "train"):
            raise TargetError(f"--mode must be inference or train; got {mode!r}")
        self.mode = mode
        self.device = device
        to_dtype = DTYPES[dtype] if dtype else None
        model = target.model
        _refuse_meta(model, target.args, target.kwargs)
        try:
            model = model.to(device=device, dtype=to_dtype) if to_dtype else model.to(device=device)
        except Exception as exc:
            raise TargetError(f"cannot move the model to {device}: {describe_exception(exc)}") from exc
        self.model = model.train(mode == "train")
        self.model, self.compiled = compile_model(self.model, compile, device.type)
        try:
            self.args = _move(target.args, device, to_dtype)
            self.kwargs = _move(target.kwargs, device, to_dtype)
        except Exception as exc:
            raise TargetError(f"cannot move the inputs to {device}: {describe_exception(exc)}") from exc
        self.loss_fn = target.loss_fn
        self.dtype = to_dtype or model_dtype(model) or torch.get_default_dtype()
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.SGD(params, lr=1e-3) if (mode == "train" and params) else None
        self.input_grads: list[torch.Tensor] = []
        if mode == "train" and not params:
            # A model without trainable parameters (a KernelBench single-op problem) still has a backward
            # pass: differentiate with respect to its floating-point input tensors instead.
            self.input_grads = [t for t in _tensors_in((self.args, self.kwargs))
                                if t.is_floating_point() and t.is_leaf and not t.requires_grad]
            for t in self.input_grads:
                t.requires_grad_(True)

    @property
    def dtype_name(self) -> str:
        return DTYPE_NAMES.get(self.dtype, str(self.dtype).replace("torch.", ""))

    def _forward(self) -> Any:
        try:
            return self.model(*self.args, **self.kwargs)
        except Exception as exc:
            if is_compile_error(exc):
                raise compile_error(exc) from exc
            where = user_frame_of(exc)
            at = f" at {where}" if where else ""
            raise TargetError(f"the model's forward failed{at}: {describe_exception(exc)}") from exc

    def step(self) -> None:
        with process_state_kept():
            self._step()

    def _step(self) -> None:
        if self.mode == "inference":
            with torch.inference_mode():
                self._forward()
            return
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        for t in self.input_grads:
            t.grad = None  # as zero_grad(set_to_none=True): no accumulation into last step's gradient
        out = self._forward()
        loss = self._loss(out)
        try:
            loss.backward()  # type: ignore[no-untyped-call, unused-ignore]  # unannotated in torch
        except Exception as exc:
            if is_compile_error(exc):  # AOTAutograd compiles the backward graph at its first call
                raise compile_error(exc) from exc
            raise TargetError(f"backward failed: {describe_exception(exc)}") from exc
        if self.optimizer is not None:
            self.optimizer.step()

    def _loss(self, out: Any) -> torch.Tensor:
        if self.loss_fn is not None:
            try:
                loss = self.loss_fn(out)
            except Exception as exc:
                where = user_frame_of(exc)
                at = f" at {where}" if where else ""
                raise TargetError(f"loss_fn(output) failed{at}: {describe_exception(exc)}") from exc
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise TargetError("loss_fn(output) must return a scalar tensor")
            return loss
        tensor = first_tensor(out)
        if tensor is None:
            raise TargetError("the model's output holds no tensor to build a loss from; define loss_fn(output) in the file")
        if not tensor.requires_grad:
            raise TargetError("the model's output does not require grad, so --mode train has nothing to differentiate")
        return tensor.sum()

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
