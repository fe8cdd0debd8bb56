"""What a profile is asked to do (ProfileOptions), built from the supervised child's spec; torch-free."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class ProfileOptions:
    target: Path
    entry: str | None = None
    device: str = "auto"
    dtype: str | None = None
    mode: str = "inference"
    warmup: int = 2
    steps: int = 5
    threads: int | None = None
    peak_bw: float | None = None
    peak_flops: list[str] = field(default_factory=list)
    out: Path | None = None
    nvtx: bool = False  # NVTX ranges around the timed steps and top-level module forwards (for Nsight)


def options_from_spec(spec: dict[str, Any]) -> ProfileOptions:
    spec = dict(spec)
    spec["target"] = Path(spec["target"])
    spec["out"] = Path(spec["out"]) if spec.get("out") else None
    return ProfileOptions(**spec)


# NVTX ranges of the measured passes (and of `opscope profile --nvtx`): one push/pop range per step, with
# the same name every step so that one ncu filter selects them all; one per forward of each top-level
# module (the model's direct children), named after it.
STEP_RANGE = "opscope_step"


MODULE_RANGE_PREFIX = "opscope_module:"
