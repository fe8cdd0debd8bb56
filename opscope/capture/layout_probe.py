"""Measures a captured 2-D convolution in NCHW and channels_last, for the `channels-last` finding.
Only `opscope profile` has this (it can run torch on the profiled device); `analyze` estimates."""

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


def _time_layouts(x: torch.Tensor, w: torch.Tensor, x_cl: torch.Tensor, w_cl: torch.Tensor,
                  spec: dict[str, Any], device: torch.device) -> tuple[float, float]:
    """Median µs per call of the conv in NCHW and in channels_last. Both layouts are warmed up first
    (one-time costs such as oneDNN primitive creation must not land on either), then timed in
    alternation so a noisy moment hits both alike."""
    def run(a: torch.Tensor, b: torch.Tensor) -> None:
        F.conv2d(a, b, None, spec["stride"], spec["padding"], spec["dilation"], spec["groups"])

    sync: Callable[[], None] = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(2):
        run(x, w)
        run(x_cl, w_cl)
    sync()
    nchw: list[float] = []
    cl: list[float] = []
    start = time.perf_counter()
    while len(nchw) < MIN_RUNS or (time.perf_counter() - start < 2 * BUDGET_S and len(nchw) < MAX_RUNS):
        for a, b, out in ((x, w, nchw), (x_cl, w_cl, cl)):
            t0 = time.perf_counter()
            run(a, b)
            sync()
            out.append(time.perf_counter() - t0)
    return statistics.median(nchw) * 1e6, statistics.median(cl) * 1e6


def conv_layout_probe(device: torch.device) -> LayoutProbe:
    cache: dict[tuple[tuple[str, Any], ...], tuple[float, float] | None] = {}

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
                    x_cl = x.contiguous(memory_format=torch.channels_last)
                    w_cl = w.contiguous(memory_format=torch.channels_last)
                    result = _time_layouts(x, w, x_cl, w_cl, spec, device)
            except (RuntimeError, ValueError):
                result = None
        cache[key] = result
        return result

    return probe
