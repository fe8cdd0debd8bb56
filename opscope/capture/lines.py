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
"""

from __future__ import annotations

import json
import sys
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pandas as pd

from opscope.sources import HARNESS, frame_location

WINDOW = 8  # records a join may skip when the timed trace lacks one (e.g. an op not recorded)


@dataclass(frozen=True)
class LineRecord:
    name: str
    shapes: tuple  # shapes of tensor inputs, in schema order (nested tuples for tensor lists)
    location: str


# nn.Module instance -> "file:line" of the user code that created it (see module_origins()).
_MODULE_ORIGINS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@contextmanager
def module_origins() -> Iterator[None]:
    """While the user's model is built, remembers where each nn.Module was created. A model whose
    forward runs entirely inside torch (an nn.Sequential of torch layers) has no user frame when its
    ops run; its ops then point at the line that created the innermost module running them."""
    import torch

    original = torch.nn.Module.__init__

    def init(self, *args, **kwargs):  # noqa: ANN001, ANN202
        original(self, *args, **kwargs)
        if self in _MODULE_ORIGINS:
            return
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_locals.get("self") is not self:  # skip the module's own __init__ chain
                where = frame_location(frame.f_code.co_filename, frame.f_lineno)
                if where is not None:
                    if where != HARNESS:
                        _MODULE_ORIGINS[self] = where
                    return
            frame = frame.f_back

    torch.nn.Module.__init__ = init
    try:
        yield
    finally:
        torch.nn.Module.__init__ = original


def _module_of(frame: Any) -> Any:
    if frame.f_code.co_name != "forward":
        return None
    module = frame.f_locals.get("self")
    return module if module in _MODULE_ORIGINS else None


def caller_location(start_depth: int = 2) -> str:
    """Innermost user frame's 'file:line'; opscope's own frames mean the harness issued the op, unless
    a module's forward is running in between (then: where that module was created)."""
    frame = sys._getframe(start_depth)
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


def _signature(func: Any, args: tuple, kwargs: dict) -> tuple:
    shapes = []
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
    return tuple(shapes)


def record_lines(step: Any) -> list[LineRecord]:
    """Runs `step()` once under a dispatch mode and returns one record per aten op, in order."""
    from torch.utils._python_dispatch import TorchDispatchMode

    records: list[LineRecord] = []
    lock = threading.Lock()

    class _LineMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            kwargs = kwargs or {}
            rec = LineRecord(func._schema.name, _signature(func, args, kwargs), caller_location(2))
            with lock:
                records.append(rec)
            return func(*args, **kwargs)

    with _LineMode():
        step()
    return records


def _trace_signature(dims_text: str) -> tuple:
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


def join_lines(records: list[LineRecord], ev: pd.DataFrame) -> dict[int, str]:
    """Event index -> exact line, matching `records` (one step's worth) against every profiled step."""
    out: dict[int, str] = {}
    if not records:
        return out
    parent = ev["parent"].tolist()
    for _, group in ev.groupby("step", sort=True):
        order = group.sort_values(["ts", "end"], ascending=[True, False], kind="stable").index.tolist()
        _join_step(records, ev, order, parent, out)
    return out


def _join_step(records: list[LineRecord], ev: pd.DataFrame, order: list[int], parent: list[int],
               out: dict[int, str]) -> None:
    names = ev["name"]
    dims = ev["input_dims"]
    is_row = ev["is_row"]
    covered: set[int] = set()
    p = 0
    n = len(records)
    for i in order:
        par = parent[i]
        if par in covered:
            covered.add(i)
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
            out[i] = records[match].location
            covered.add(i)
            p = match + 1
