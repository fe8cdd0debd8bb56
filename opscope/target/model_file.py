"""Loading the user's model file: the accepted shapes are in CONTRACT.md.

1. `--entry FUNC`: FUNC() returns (model, inputs);
2. KernelBench style: `class Model(nn.Module)`, `get_inputs()`, optional `get_init_inputs()`;
3. `get_model()` and `get_inputs()`.
Inputs are a list/tuple of positional arguments, or a dict of keyword arguments: tensors, and beside them
any other values (Python numbers, None, nested lists/dicts of tensors), which are passed through
unchanged. An optional `loss_fn(output)` is used by `--mode train`.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from opscope.errors import TargetError
from opscope.limits import DISPLAY_TEXT_CHARS, bounded, path_problem
from opscope.sources import classify_path, display_path

ACCEPTED = ("`get_model()` + `get_inputs()`, `class Model(nn.Module)` + `get_inputs()` (KernelBench style), "
            "or --entry FUNC returning (model, inputs)")


@dataclass
class Target:
    path: Path
    module: ModuleType
    model: Any  # torch.nn.Module
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    loss_fn: Callable[[Any], Any] | None = None

    @property
    def stem(self) -> str:
        return self.path.stem


def user_frame_of(exc: BaseException) -> str:
    """'file:line' of the innermost traceback frame in user code (not torch/stdlib/opscope)."""
    where = ""
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        path = frame.f_code.co_filename
        if classify_path(path) == "user":
            where = f"{display_path(path)}:{lineno}"
    return where


def describe_exception(exc: BaseException) -> str:
    """'ValueError: <the first line of its message>', the line at most DISPLAY_TEXT_CHARS long (a model's
    message of megabytes travels to the parent process and is printed)."""
    text = str(exc).strip()
    first = bounded(text[: text.find("\n")] if "\n" in text else text, DISPLAY_TEXT_CHARS)
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _call_user(fn: Callable[..., Any], what: str, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:  # the user's code failed: one line with their message and line
        where = user_frame_of(exc)
        at = f" at {where}" if where else ""
        raise TargetError(f"{what} failed{at}: {describe_exception(exc)}") from exc


def check_target_file(path: Path) -> None:
    """The checks that need neither torch nor running the file: it exists, is a readable Python file and
    compiles. TargetError (one line) otherwise."""
    problem = path_problem(path)
    if problem is not None:
        raise TargetError(f"{bounded(str(path), 80)}: {problem}")
    if not path.exists():
        raise TargetError(f"no such file: {path}")
    if path.is_dir():
        raise TargetError(f"{path} is a directory; TARGET must be a Python file")
    if path.suffix.lower() != ".py":
        hint = " (a trace? use `opscope analyze`)" if path.name.endswith((".json", ".json.gz", ".gz")) else ""
        raise TargetError(f"{path} is not a Python file (.py){hint}; TARGET is the model's source file")
    try:
        source = path.read_bytes()
    except OSError as exc:
        raise TargetError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        compile(source, str(path), "exec")
    except SyntaxError as exc:
        raise TargetError(f"syntax error in {display_path(str(path.resolve()))} line {exc.lineno}: {exc.msg}") from exc
    except ValueError as exc:  # e.g. null bytes
        raise TargetError(f"{path} is not a Python source file ({exc})") from exc


def add_model_folder(folder: str) -> None:
    """Makes the model's neighbours importable: after the standard library's entries in sys.path, so a
    neighbour named like a stdlib module (profile.py, inspect.py, ...) cannot shadow the module torch
    imports lazily; before site-packages, as `python model.py` would."""
    if folder in sys.path:
        return
    stdlib = {os.path.normcase(os.path.realpath(p)) for key in ("stdlib", "platstdlib")
              if (p := sysconfig.get_paths().get(key))}
    position = 0
    for i, entry in enumerate(sys.path):
        real = os.path.normcase(os.path.realpath(entry)) if entry else ""
        if real in stdlib or any(real.startswith(s + os.sep) for s in stdlib) or entry.endswith(".zip"):
            position = i + 1
    sys.path.insert(position, folder)


def load_module(path: Path) -> ModuleType:
    check_target_file(path)
    name = f"opscope_target_{path.stem}_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise TargetError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    add_model_folder(str(path.resolve().parent))
    sys.modules[name] = module
    _call_user(spec.loader.exec_module, f"importing {path.name}", module)
    return module


def load_target(path: str | Path, entry: str | None = None) -> Target:
    import torch

    path = Path(path)
    module = load_module(path)
    if entry:
        fn = getattr(module, entry, None)
        if not callable(fn):
            raise TargetError(f"{path.name} has no function {entry}() (from --entry)")
        result = _call_user(fn, f"{entry}()")
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise TargetError(f"{entry}() must return (model, inputs); got {type(result).__name__}")
        model, inputs = result
        source = f"{entry}()"
    elif callable(getattr(module, "get_model", None)) and callable(getattr(module, "get_inputs", None)):
        model = _call_user(module.get_model, "get_model()")
        inputs = _call_user(module.get_inputs, "get_inputs()")
        source = "get_inputs()"
    elif isinstance(getattr(module, "Model", None), type) and callable(getattr(module, "get_inputs", None)):
        init = getattr(module, "get_init_inputs", None)
        init_args = _call_user(init, "get_init_inputs()") if callable(init) else []
        if not isinstance(init_args, (list, tuple)):
            raise TargetError(f"get_init_inputs() must return a list of constructor arguments; got {type(init_args).__name__}")
        model = _call_user(lambda: module.Model(*init_args), "Model(*get_init_inputs())")
        inputs = _call_user(module.get_inputs, "get_inputs()")
        source = "get_inputs()"
    else:
        raise TargetError(f"{path.name} has none of the accepted shapes: looked for {ACCEPTED}")
    if not isinstance(model, torch.nn.Module):
        raise TargetError(f"the model must be a torch.nn.Module; got {type(model).__name__}")
    args, kwargs = split_inputs(inputs, source)
    loss_fn = getattr(module, "loss_fn", None)
    return Target(path=path, module=module, model=model, args=args, kwargs=kwargs,
                  loss_fn=loss_fn if callable(loss_fn) else None)


def split_inputs(inputs: Any, source: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    import torch

    if isinstance(inputs, dict):
        return (), dict(inputs)
    if isinstance(inputs, torch.Tensor):
        return (inputs,), {}
    if not isinstance(inputs, (list, tuple)):
        raise TargetError(f"{source} must return a list/tuple of the model's arguments (tensors, numbers, ...) "
                          f"or a dict of keyword arguments; got {type(inputs).__name__}")
    return tuple(inputs), {}  # non-tensor arguments (e.g. KernelBench's scalar `s`) go to forward unchanged
