"""profile's in-context timing of the swap candidates (opscope.kernels.incontext), as the analysis takes it."""

from __future__ import annotations

from typing import Any

import torch

from opscope.analysis.pipeline import KernelTimer
from opscope.table import Table


def kernel_timer_for(device: torch.device) -> KernelTimer:
    """Times each candidate against the op it replaces on the run's recorded shapes, in this process
    (torch and the built kernels are here; the model does not run again)."""
    from opscope.kernels.incontext import measure

    def timer(candidates: list[dict[str, Any]], ops: Table, steps: int) -> list[dict[str, Any]]:
        return measure(candidates, ops, steps=steps, device=device.type)

    return timer
