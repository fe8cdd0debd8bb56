"""Measures a captured op in NCHW and channels_last, for the `channels-last` finding: 2-D convolutions,
pooling, batch norm and upsampling. Only `opscope profile` has this (it can run torch on the profiled
device); `analyze` estimates."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from opscope.capture.harness import DTYPES
from opscope.findings.base import LayoutProbe

BUDGET_S = 0.02  # per layout: "a few milliseconds" of real runs, at least MIN_RUNS
MIN_RUNS = 3
MAX_RUNS = 50

# spec["op"] -> the call that op makes, given its input and the spec (opscope.findings.channels_last
# builds the specs from the trace's recorded arguments)
Call = Callable[[torch.Tensor, dict[str, Any]], Callable[[], Any]]


def _conv(x: torch.Tensor, spec: dict[str, Any]) -> Callable[[], Any]:
    w = torch.randn(spec["weight"], dtype=x.dtype, device=x.device)
    if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        w = w.contiguous(memory_format=torch.channels_last)
    return lambda: F.conv2d(x, w, None, spec["stride"], spec["padding"], spec["dilation"], spec["groups"])


def _max_pool(x: torch.Tensor, spec: dict[str, Any]) -> Callable[[], Any]:
    return lambda: F.max_pool2d(x, spec["kernel"], spec["stride"] or None, spec["padding"], spec["dilation"],
                                ceil_mode=spec["ceil_mode"])


def _avg_pool(x: torch.Tensor, spec: dict[str, Any]) -> Callable[[], Any]:
    return lambda: F.avg_pool2d(x, spec["kernel"], spec["stride"] or None, spec["padding"], spec["ceil_mode"],
                                spec["count_include_pad"])


def _adaptive_avg_pool(x: torch.Tensor, spec: dict[str, Any]) -> Callable[[], Any]:
    return lambda: F.adaptive_avg_pool2d(x, spec["output_size"])


def _adaptive_max_pool(x: torch.Tensor, spec: dict[str, Any]) -> Callable[[], Any]:
    return lambda: F.adaptive_max_pool2d(x, spec["output_size"])


def _batch_norm(x: torch.Tensor, spec: dict[str, Any]) -> Callable[[], Any]:
    c = x.shape[1]
    # the statistics and affine parameters as recorded (float32 beside a half input is common)
    dtype = DTYPES.get(spec.get("params_dtype", ""), x.dtype)
    mean, var = torch.zeros(c, dtype=dtype, device=x.device), torch.ones(c, dtype=dtype, device=x.device)
    weight, bias = torch.ones(c, dtype=dtype, device=x.device), torch.zeros(c, dtype=dtype, device=x.device)
    return lambda: F.batch_norm(x, mean, var, weight, bias, spec["training"], 0.1, spec["eps"])


def _upsample(x: torch.Tensor, spec: dict[str, Any]) -> Callable[[], Any]:
    align = spec.get("align_corners")
    return lambda: F.interpolate(x, size=spec["output_size"], mode=spec["mode"], align_corners=align)


CALLS: dict[str, Call] = {
    "conv2d": _conv, "max_pool2d": _max_pool, "avg_pool2d": _avg_pool,
    "adaptive_avg_pool2d": _adaptive_avg_pool, "adaptive_max_pool2d": _adaptive_max_pool,
    "batch_norm": _batch_norm, "upsample": _upsample,
}


def _time_layouts(nchw_call: Callable[[], Any], cl_call: Callable[[], Any],
                  device: torch.device) -> tuple[float, float]:
    """Median µs per call in NCHW and in channels_last. Both layouts are warmed up first (one-time costs
    such as oneDNN primitive creation must not land on either), then timed in alternation so a noisy
    moment hits both alike."""
    sync: Callable[[], None] = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(2):
        nchw_call()
        cl_call()
    sync()
    nchw: list[float] = []
    cl: list[float] = []
    start = time.perf_counter()
    while len(nchw) < MIN_RUNS or (time.perf_counter() - start < 2 * BUDGET_S and len(nchw) < MAX_RUNS):
        for call, out in ((nchw_call, nchw), (cl_call, cl)):
            t0 = time.perf_counter()
            call()
            sync()
            out.append(time.perf_counter() - t0)
    return statistics.median(nchw) * 1e6, statistics.median(cl) * 1e6


def measure(spec: dict[str, Any], device: torch.device) -> tuple[float, float] | None:
    """(µs per call in NCHW, in channels_last) of the op `spec` describes, or None if it cannot be run."""
    dtype = DTYPES.get(spec.get("dtype", "float32"))
    make = CALLS.get(spec.get("op", "conv2d"))
    if dtype is None or make is None or len(spec["input"]) != 4:
        return None
    try:
        with torch.inference_mode():
            x = torch.randn(spec["input"], dtype=dtype, device=device)
            x_cl = x.contiguous(memory_format=torch.channels_last)
            return _time_layouts(make(x, spec), make(x_cl, spec), device)
    except (RuntimeError, ValueError, TypeError, KeyError, IndexError):
        return None  # arguments this torch does not take for this op: no measurement, no finding


def layout_probe_for(device: torch.device) -> LayoutProbe:
    """The probe `opscope profile` hands the findings: measure(), once per distinct spec."""
    cache: dict[str, tuple[float, float] | None] = {}

    def probe(spec: dict[str, Any]) -> tuple[float, float] | None:
        key = repr(sorted(spec.items()))
        if key not in cache:
            cache[key] = measure(spec, device)
        return cache[key]

    return probe
