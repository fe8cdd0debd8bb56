"""Measures a captured 2-D convolution in NCHW and channels_last, for the `channels-last` finding.
Only `opscope profile` has this (it can run torch on the profiled device); `analyze` estimates."""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.nn.functional as F

from opscope.capture.harness import DTYPES

BUDGET_S = 0.02  # per layout: "a few milliseconds" of real runs, at least MIN_RUNS
MIN_RUNS = 3
MAX_RUNS = 50


def _time_conv(x: torch.Tensor, w: torch.Tensor, spec: dict[str, Any], device: torch.device) -> float:
    def run() -> None:
        F.conv2d(x, w, None, spec["stride"], spec["padding"], spec["dilation"], spec["groups"])

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    run()
    sync()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < MIN_RUNS or (time.perf_counter() - start < BUDGET_S and len(times) < MAX_RUNS):
        t0 = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def conv_layout_probe(device: torch.device):  # -> LayoutProbe
    cache: dict[tuple, tuple[float, float] | None] = {}

    def probe(spec: dict[str, Any]) -> tuple[float, float] | None:
        key = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in sorted(spec.items()))
        if key in cache:
            return cache[key]
        dtype = DTYPES.get(spec.get("dtype", "float32"))
        result = None
        if dtype is not None and len(spec["input"]) == 4 and len(spec["weight"]) == 4:
            try:
                with torch.inference_mode():
                    x = torch.randn(spec["input"], dtype=dtype, device=device)
                    w = torch.randn(spec["weight"], dtype=dtype, device=device)
                    nchw = _time_conv(x, w, spec, device)
                    x_cl = x.contiguous(memory_format=torch.channels_last)
                    w_cl = w.contiguous(memory_format=torch.channels_last)
                    cl = _time_conv(x_cl, w_cl, spec, device)
                result = (nchw, cl)
            except (RuntimeError, ValueError):
                result = None
        cache[key] = result
        return result

    return probe
