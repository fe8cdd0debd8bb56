"""Exact source lines for profiled ops.

torch.profiler names every Python frame by its function's first line. To name the executing line,
opscope runs one extra, untimed step under a TorchDispatchMode that, for every aten op, walks the
Python frames to the innermost one outside torch/opscope/stdlib and reads its `f_lineno`. The records
are then joined to the timed trace's ops, step by step, in execution order.

The dispatch mode sees ops *after* CompositeImplicitAutograd decomposition (aten::linear arrives as
aten::t + aten::addmm; a copying reshape as aten::clone + aten::_unsafe_view) and never sees the ops
those ops call internally. The join therefore walks each step's op tree in pre-order and matches a
record to the first op with the same name and input shapes, skipping the subtree of every matched op
(its internals ran on the same line); unmatched composite parents take their first child's line.

The same pass records the module stack (global forward pre/post hooks): each record carries the qualified
name (`transformer.h.3.attn.c_attn`, as `model.named_modules()` names it; "" for the model itself) and class
of the innermost nn.Module whose forward was running. Ops outside the model's forward (the loss, backward,
the optimizer) have neither; backward ops get their forward op's module later, as they get its line.

The same pass sees the real tensors, so it also records the element dtypes of every TensorList argument,
which torch.profiler records only as "TensorList" (cat, stack, _foreach_*, fused optimizers). The join
hands them on per event (LineJoin.input_types): the op's "Input type" with each TensorList entry replaced
by the list of its elements' dtypes; ops inside a matched op's subtree (stack's cat) take its lists, in
order, where the lengths agree.
"""

from __future__ import annotations

import json
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

from opscope.sources import HARNESS, frame_location
from opscope.table import Table

if TYPE_CHECKING:
    import torch

WINDOW = 8  # records a join may skip when the timed trace lacks one (e.g. an op not recorded)


@dataclass(frozen=True)
class LineRecord:
    name: str
    shapes: tuple[Any, ...]  # shapes of tensor inputs, in schema order (nested tuples for tensor lists)
    location: str
    # (schema argument index, element dtypes as the profiler names them) of each tensor-list argument
    list_dtypes: tuple[tuple[int, tuple[str, ...]], ...] = ()
    module: str = ""  # qualified name of the innermost module running ("" for the model itself)
    module_class: str = ""  # its class name; "" outside the model's forward


class LineJoin(dict[int, str]):
    """Event index -> exact line ('file:line'); `input_types`: event index -> the event's "Input type"
    (JSON text) with its TensorList entries' element dtypes filled in from the dispatch pass; `modules`:
    event index -> (qualified module name, module class) of the matched record."""

    def __init__(self) -> None:
        super().__init__()
        self.input_types: dict[int, str] = {}
        self.modules: dict[int, tuple[str, str]] = {}


# torch dtype names -> torch.profiler's "Input type" strings (tests/capture/test_source_lines.py checks them
# against the profiler).
PROFILER_DTYPES: dict[str, str] = {
    "float32": "float", "float64": "double", "float16": "c10::Half", "bfloat16": "c10::BFloat16",
    "float8_e4m3fn": "c10::Float8_e4m3fn", "float8_e5m2": "c10::Float8_e5m2",
    "float8_e4m3fnuz": "c10::Float8_e4m3fnuz", "float8_e5m2fnuz": "c10::Float8_e5m2fnuz",
    "int64": "long int", "int32": "int", "int16": "short int", "int8": "signed char", "uint8": "unsigned char",
    "uint16": "short unsigned int", "uint32": "unsigned int", "uint64": "long unsigned int", "bool": "bool",
    "complex64": "c10::complex<float>", "complex128": "c10::complex<double>",
    "complex32": "c10::complex<c10::Half>",
}


# nn.Module instance -> "file:line" of the user code that created it (see module_origins()).
_MODULE_ORIGINS: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()


@contextmanager
def module_origins() -> Iterator[None]:
    """While the user's model is built, remembers where each nn.Module was created. A model whose
    forward runs entirely inside torch (an nn.Sequential of torch layers) has no user frame when its
    ops run; its ops then point at the line that created the innermost module running them."""
    import torch

    original = torch.nn.Module.__init__

    def init(self: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if self in _MODULE_ORIGINS:
            return
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            if frame.f_locals.get("self") is not self:  # skip the module's own __init__ chain
                where = frame_location(frame.f_code.co_filename, frame.f_lineno)
                if where is not None:
                    if where != HARNESS:
                        _MODULE_ORIGINS[self] = where
                    return
            frame = frame.f_back

    torch.nn.Module.__init__ = init  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.__init__ = original  # type: ignore[method-assign]


def _module_of(frame: Any) -> Any:
    if frame.f_code.co_name != "forward":
        return None
    module = frame.f_locals.get("self")
    return module if module in _MODULE_ORIGINS else None


def caller_location(start_depth: int = 2) -> str:
    """Innermost user frame's 'file:line'; opscope's own frames mean the harness issued the op, unless
    a module's forward is running in between (then: where that module was created)."""
    frame: FrameType | None = sys._getframe(start_depth)
    innermost_module = None
    while frame is not None:
        where = frame_location(frame.f_code.co_filename, frame.f_lineno)
        if where is not None:
            if where == HARNESS and innermost_module is not None:
                return _MODULE_ORIGINS.get(innermost_module, "")
            return where
        if innermost_module is None:
            try:
                innermost_module = _module_of(frame)
            except TypeError:  # an unhashable `self`
                innermost_module = None
        frame = frame.f_back
    return ""


def _shape_of(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
        return tuple(tuple(v.shape) for v in value)
    return None


def _signature(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """(shapes of the tensor inputs, (index, element dtypes) of the tensor-list inputs), in schema order."""
    shapes = []
    lists = []
    schema_args = func._schema.arguments
    for i, arg in enumerate(schema_args):
        if i < len(args):
            value = args[i]
        elif arg.name in kwargs:
            value = kwargs[arg.name]
        else:
            continue
        s = _shape_of(value)
        if s:  # 0-d tensors and non-tensors are [] in the trace: leave them out on both sides
            shapes.append(s)
            if isinstance(value, (list, tuple)):
                lists.append((i, tuple(PROFILER_DTYPES.get(str(v.dtype).removeprefix("torch."), "") for v in value)))
    return tuple(shapes), tuple(lists)


def module_classes(model: Any) -> dict[str, str]:
    """Qualified name -> class name of every module of `model` ("" is the model itself)."""
    return {name: type(m).__name__ for name, m in model.named_modules()} if model is not None else {}


@contextmanager
def module_stack(model: Any) -> Iterator[Callable[[], tuple[str, str]]]:
    """While active, global forward hooks track which of `model`'s modules are running (per thread);
    yields a function returning (qualified name, class) of the innermost one, ("", "") outside the
    model's forward. Modules outside `model`'s tree are skipped (their enclosing module counts)."""
    import torch

    names: dict[int, str] = {}
    if model is not None:
        for name, m in model.named_modules():
            names.setdefault(id(m), name)
    local = threading.local()

    def stack() -> list[tuple[str, str] | None]:
        if not hasattr(local, "stack"):
            local.stack = []
        entries: list[tuple[str, str] | None] = local.stack
        return entries

    def pre(module: Any, args: Any) -> None:
        name = names.get(id(module))
        stack().append(None if name is None else (name, type(module).__name__))

    def post(module: Any, args: Any, output: Any) -> None:
        s = stack()
        if s:
            s.pop()

    def current() -> tuple[str, str]:
        for entry in reversed(stack()):
            if entry is not None:
                return entry
        return ("", "")

    hooks = torch.nn.modules.module
    before = hooks.register_module_forward_pre_hook(pre)
    after = hooks.register_module_forward_hook(post, always_call=True)
    try:
        with warnings.catch_warnings():
            # A torch.compile'd model warns, on each call, that global hooks fire once more for its wrapper:
            # these hooks are opscope's, and the extra call (a push and its pop) changes nothing.
            warnings.filterwarnings("ignore", message=_COMPILED_HOOK_WARNING, category=UserWarning)
            yield current
    finally:
        before.remove()
        after.remove()


_COMPILED_HOOK_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks"


@contextmanager
def discovered_module_stack() -> Iterator[tuple[Callable[[], tuple[str, str]], dict[str, str]]]:
    """module_stack() for code whose model opscope is not given (a script): a module whose forward runs
    outside every other module's is a root, named when it first runs. The first root's modules are named
    as its named_modules() names them ("" for the root itself, as a model file's model); a later root's
    carry its class name in front (`CrossEntropyLoss`, `Discriminator.fc1`). Yields the current-module
    function and the qualified name -> class map of every root found so far (module_classes())."""
    import torch

    names: dict[int, str] = {}
    classes: dict[str, str] = {}
    local = threading.local()

    def stack() -> list[tuple[str, str] | None]:
        if not hasattr(local, "stack"):
            local.stack = []
        entries: list[tuple[str, str] | None] = local.stack
        return entries

    def add_root(root: Any) -> None:
        prefix = "" if not classes else type(root).__name__
        if prefix in classes:  # a second root of the same class
            prefix = f"{prefix}#{sum(1 for k in classes if k.split('.')[0].split('#')[0] == prefix) + 1}"
        for name, m in root.named_modules():
            if id(m) not in names:
                qualified = ".".join(p for p in (prefix, name) if p)
                names[id(m)] = qualified
                classes[qualified] = type(m).__name__

    def pre(module: Any, args: Any) -> None:
        s = stack()
        if id(module) not in names and not s:
            add_root(module)
        name = names.get(id(module))
        s.append(None if name is None else (name, type(module).__name__))

    def post(module: Any, args: Any, output: Any) -> None:
        s = stack()
        if s:
            s.pop()

    def current() -> tuple[str, str]:
        for entry in reversed(stack()):
            if entry is not None:
                return entry
        return ("", "")

    hooks = torch.nn.modules.module
    before = hooks.register_module_forward_pre_hook(pre)
    after = hooks.register_module_forward_hook(post, always_call=True)
    try:
        with warnings.catch_warnings():  # as in module_stack(): the hooks are opscope's, not the user's
            warnings.filterwarnings("ignore", message=_COMPILED_HOOK_WARNING, category=UserWarning)
            yield current, classes
    finally:
        before.remove()
        after.remove()


def _outside_modules() -> tuple[str, str]:
    return ("", "")


def record_lines(step: Any, model: Any = None) -> list[LineRecord]:
    """Runs `step()` once under a dispatch mode and returns one record per aten op, in order, with
    the module of `model` running it."""
    records: list[LineRecord] = []
    with module_stack(model) as current_module, line_mode(records, current_module):
        step()
    return records


def line_mode(records: list[LineRecord],
              current_module: Callable[[], tuple[str, str]] = _outside_modules) -> Any:
    """A TorchDispatchMode that appends one LineRecord per aten op to `records`, in order, with the module
    `current_module()` names. Entered and left around one step (script mode enters it at one step
    boundary and leaves it at the next)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    lock = threading.Lock()

    class _LineMode(TorchDispatchMode):  # type: ignore[no-untyped-call, unused-ignore]  # unannotated in torch
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                               kwargs: dict[str, Any] | None = None) -> Any:
            kwargs = kwargs or {}
            shapes, lists = _signature(func, args, kwargs)
            module, cls = current_module()
            rec = LineRecord(func._schema.name, shapes, caller_location(2), lists, module, cls)
            with lock:
                records.append(rec)
            return func(*args, **kwargs)

    return _LineMode()  # type: ignore[no-untyped-call, unused-ignore]  # unannotated in torch


def _trace_signature(dims_text: str) -> tuple[Any, ...]:
    try:
        dims = json.loads(dims_text) if dims_text else []
    except ValueError:
        return ()
    out = []
    for d in dims:
        if not d:
            continue
        if isinstance(d[0], list):
            out.append(tuple(tuple(x) for x in d))
        else:
            out.append(tuple(d))
    return tuple(out)


def join_lines(records: list[LineRecord], ev: Table) -> LineJoin:
    """Event index -> exact line, matching `records` (one step's worth) against every profiled step; with
    the TensorList element dtypes of the matched events and their subtrees (LineJoin.input_types)."""
    out = LineJoin()
    if not records:
        return out
    by_step: dict[Any, list[int]] = {}
    for i, s in enumerate(ev["step"]):
        by_step.setdefault(s, []).append(i)
    ts, end = ev["ts"], ev["end"]
    for s in sorted(by_step):
        # each step's events in start order, the longer first on ties (a parent before its children)
        order = sorted(by_step[s], key=lambda i: (ts[i], -end[i]))
        _join_step(records, ev, order, ev["parent"], out)
    return out


def _join_step(records: list[LineRecord], ev: Table, order: list[int], parent: list[int],
               out: LineJoin) -> None:
    names = ev["name"]
    dims = ev["input_dims"]
    types = ev["input_dtypes"]
    is_row = ev["is_row"]
    covered: dict[int, LineRecord] = {}  # event in a matched op's subtree -> that op's record
    p = 0
    n = len(records)
    for i in order:
        par = parent[i]
        if par in covered:
            covered[i] = rec = covered[par]
            if rec.list_dtypes:
                _fill_list_types(out, i, types[i], dims[i], [d for _, d in rec.list_dtypes])
            continue
        if not is_row[i] or p >= n:
            continue
        name = names[i]
        sig = None
        match = -1
        for q in range(p, min(p + WINDOW, n)):
            if records[q].name != name:
                continue
            if sig is None:
                sig = _trace_signature(dims[i])
            if records[q].shapes == sig:
                match = q
                break
        if match < 0 and p < n and records[p].name == name:
            match = p  # same op, shapes recorded differently (e.g. an optional list): trust the order
        if match >= 0:
            rec = records[match]
            out[i] = rec.location
            if rec.module_class:
                out.modules[i] = (rec.module, rec.module_class)
            covered[i] = rec
            if rec.list_dtypes:
                _fill_list_types(out, i, types[i], dims[i], dict(rec.list_dtypes))
            p = match + 1


def _fill_list_types(out: LineJoin, i: int, types_text: str, dims_text: str,
                     lists: dict[int, tuple[str, ...]] | list[tuple[str, ...]]) -> None:
    """Replaces event i's "TensorList" type entries with element dtypes: `lists` by schema index (the
    op's own record) or in order (an op inside its subtree), each only where the element count agrees."""
    if "TensorList" not in types_text:
        return
    try:
        entries, shapes = json.loads(types_text), json.loads(dims_text)
    except ValueError:
        return
    ordered = iter(lists) if isinstance(lists, list) else None
    by_index = lists if isinstance(lists, dict) else {}
    changed = False
    for k, entry in enumerate(entries):
        if entry != "TensorList":
            continue
        dtypes = next(ordered, None) if ordered is not None else by_index.get(k)
        shape = shapes[k] if k < len(shapes) else None
        if dtypes and all(dtypes) and isinstance(shape, list) and len(shape) == len(dtypes):
            entries[k] = list(dtypes)
            changed = True
    if changed:
        out.input_types[i] = json.dumps(entries)
