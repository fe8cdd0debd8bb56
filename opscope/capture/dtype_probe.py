"""Replays a captured op call with its floating-point tensors in float32, for the `dtype-slow-path`
finding: how long the same work takes at float32 on the profiled device. Only `opscope profile` has this
(it can run torch); `analyze` estimates from the float32 ceiling.

The call is rebuilt from what the trace recorded (shapes, strides, dtypes, concrete arguments) and run
through `torch.ops.aten.<op>`, so the dispatcher picks whatever float32 path this machine would take.
When the spec asks for it ("own": true, for ops that are quick enough), the call is also replayed in its
recorded dtype, alternating with the float32 one, so both are timed alike (warm, in a loop); a slow
reduced-precision op is not re-run, its profiled time stands. Runs after the timed pass, warm (one
untimed call of each first), a few calls per op, and never more than BUDGET_S for all ops of a run.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from opscope.findings.base import DtypeProbe

BUDGET_S = 1.0  # all replays of one run together
PER_OP_S = 0.05  # timed runs per op stop after this long (at least MIN_RUNS)
MIN_RUNS = 3
MAX_RUNS = 20

TORCH_DTYPES = {
    "float": torch.float32, "double": torch.float64, "c10::Half": torch.float16, "c10::BFloat16": torch.bfloat16,
    "long int": torch.int64, "int": torch.int32, "short int": torch.int16, "signed char": torch.int8,
    "unsigned char": torch.uint8, "bool": torch.bool,
}


def _tensor(arg: dict[str, Any], device: torch.device, float32: bool) -> torch.Tensor:
    """A tensor with the recorded shape and strides (expanded and sliced views included), floating
    dtypes as float32 if asked, filled with normal noise (integers: zeros)."""
    dtype = TORCH_DTYPES[arg["dtype"]]
    if dtype.is_floating_point and float32:
        dtype = torch.float32
    shape, stride = list(arg["shape"]), list(arg.get("stride") or [])
    if len(stride) != len(shape):
        stride = list(torch.empty(shape, device="meta").stride())
    storage = 1 + sum((n - 1) * abs(s) for n, s in zip(shape, stride, strict=True)) if all(shape) else 0
    base = torch.randn(storage, device=device).to(dtype) if dtype.is_floating_point else \
        torch.zeros(storage, dtype=dtype, device=device)
    return base.as_strided(shape, stride)


def build_call(spec: dict[str, Any], device: torch.device, float32: bool = True) -> Callable[[], Any]:
    """The recorded call (floating tensors in float32 if asked), ready to run (warmed once). The trace records
    every argument in schema order, keyword-only ones included, so the overload is the one whose schema
    has that many arguments and that accepts them; out= variants are never used. Raises on what it
    cannot build."""
    namespace, _, name = spec["op"].partition("::")
    packet = getattr(getattr(torch.ops, namespace), name)
    values = [_tensor(a, device, float32) if "shape" in a else a["value"] for a in spec["args"]]
    error: Exception = ValueError(f"no overload of {spec['op']} takes {len(values)} arguments")
    for overload in packet.overloads():
        op = getattr(packet, overload)
        params = op._schema.arguments
        if len(params) != len(values) or any(p.alias_info is not None and p.alias_info.is_write for p in params):
            continue
        args = [v for p, v in zip(params, values, strict=True) if not p.kwarg_only]
        kwargs = {p.name: v for p, v in zip(params, values, strict=True) if p.kwarg_only}
        try:
            op(*args, **kwargs)  # warm: one-time costs (oneDNN primitive creation, allocator) land here
        except (RuntimeError, TypeError) as exc:
            error = exc
            continue
        return functools.partial(op, *args, **kwargs)
    raise error


def float32_probe(device: torch.device) -> DtypeProbe:
    """A probe with its own time budget (BUDGET_S) and cache, for one run."""
    deadline: list[float] = []  # set at the first call: the budget starts when the rules first ask
    cache: dict[str, tuple[float | None, float] | None] = {}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def probe(spec: dict[str, Any]) -> tuple[float | None, float] | None:
        key = repr(spec)
        if key in cache:
            return cache[key]
        if not deadline:
            deadline.append(time.perf_counter() + BUDGET_S)
        result = None
        if time.perf_counter() < deadline[0]:
            try:
                with torch.no_grad():
                    result = _time(spec, device, sync, deadline[0])
            except (RuntimeError, TypeError, ValueError, AttributeError, KeyError, IndexError):
                result = None  # an op or argument the replay cannot rebuild: no measurement, no guess
        cache[key] = result
        return result

    return probe


def _time(spec: dict[str, Any], device: torch.device, sync: Callable[[], None],
          deadline: float) -> tuple[float | None, float] | None:
    """Median µs per call (own dtype or None, float32): warmed, then timed in alternation."""
    calls = {"float32": build_call(spec, device, float32=True)}
    if spec.get("own"):
        calls["own"] = build_call(spec, device, float32=False)
    sync()
    runs: dict[str, list[float]] = {k: [] for k in calls}
    start = time.perf_counter()
    while len(runs["float32"]) < MAX_RUNS and time.perf_counter() < deadline:
        for name, call in calls.items():
            t0 = time.perf_counter()
            call()
            sync()
            runs[name].append(time.perf_counter() - t0)
        if len(runs["float32"]) >= MIN_RUNS and time.perf_counter() - start >= PER_OP_S:
            break
    if not runs["float32"]:
        return None
    own = statistics.median(runs["own"]) * 1e6 if runs.get("own") else None
    return own, statistics.median(runs["float32"]) * 1e6
