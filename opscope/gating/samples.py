"""The samples the gate tests, taken from run directories: per step (each step's wall time), per op row (op +
source line + shapes: its time per step in each run) and per module (its inclusive time per step in each
run), with the machine and the noise each run measured. A run's ops.csv and modules.csv sum over its
steps, so an op row or module has one sample per run; steps have one per step."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import msgspec
from msgspec import Struct

from opscope.errors import OpscopeError
from opscope.limits import bounded
from opscope.run.model import Run, shown_path
from opscope.run.read import read_run

# Kept per run set: the op rows and modules with the most time (a baseline stays small enough to commit).
MAX_OP_ROWS = 400
MAX_MODULES = 200
TEXT_LIMIT = 400  # the most of one name or shape list kept


class Machine(Struct, kw_only=True):
    """Where the runs ran, and the ceilings opscope measured (or knew) there."""

    device_type: str = ""
    device_name: str = ""
    threads: list[int] = []
    memory_bandwidth_gbps: float | None = None
    flops_gflops: dict[str, float] = {}
    ceilings_origin: dict[str, str] = {}


class RunInfo(Struct, kw_only=True):
    path: str = ""
    created: str | None = None
    steps: int = 0
    noisy: bool = False
    noise_reason: str | None = None


class OpSamples(Struct, kw_only=True):
    """One op row across the runs: its time per step in each run (0.0 where a run lacks it) and its share of
    that run's op time."""

    op: str
    line: str = ""
    shapes: str = ""
    module: str = ""
    # what bounds it (ops.csv bound: compute, memory, overhead, unknown): the gate measures the load a row sees
    # on rows of its own kind. "" in baselines saved before opscope kept it.
    bound: str = ""
    times_us: list[float] = []
    # each run's time per step (summary.json op_step_times_us of profile runs); None when a run lacks them
    step_times_us: list[list[float]] | None = None


class ModuleSamples(Struct, kw_only=True):
    module: str  # its path ("" for the model itself)
    module_class: str = ""
    times_us: list[float] = []


class Samples(Struct, kw_only=True):
    """What the gate compares: one or more runs of the same code."""

    torch_version: str | None = None
    opscope_version: str | None = None
    target: str = ""
    machine: Machine = msgspec.field(default_factory=Machine)
    runs: list[RunInfo] = []
    step_times_us: list[list[float]] = []  # per run, each step's wall time (one value when a run kept none)
    op_time_us: list[float] = []  # per run, all op time per step
    ops: list[OpSamples] = []
    modules: list[ModuleSamples] = []


def op_key(op: OpSamples) -> tuple[str, str, str]:
    return (op.op, op.line, op.shapes)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def _text(value: Any) -> str:
    return bounded(value, TEXT_LIMIT) if isinstance(value, str) else ""


def step_samples(run: Run) -> list[float]:
    """Each step's wall time (summary step_times_us), else the median or mean step as one sample."""
    s = run.summary
    kept = s.get("step_times_us")
    if isinstance(kept, list):
        values = [v for v in (_number(x) for x in kept) if v is not None and v > 0]
        if values:
            return values
    for key in ("step_time_us_p50", "step_time_us"):
        value = _number(s.get(key))
        if value is not None and value > 0:
            return [value]
    raise OpscopeError(f"{shown_path(run.path or Path('.'))} has no step time: the gate needs runs with steps")


def _row_steps(run: Run) -> dict[int, list[float]]:
    """ops.csv row -> its time in each step (summary.json op_step_times_us), for the rows the run kept."""
    out: dict[int, list[float]] = {}
    for entry in run.summary.get("op_step_times_us") or []:
        if isinstance(entry, dict) and isinstance(entry.get("row"), int) and isinstance(entry.get("times_us"), list):
            values = [v for v in (_number(x) for x in entry["times_us"]) if v is not None]
            if values:
                out[entry["row"]] = values
    return out


def read_samples(paths: list[Path]) -> Samples:
    """The samples of the run directories `paths` (runs of the same code on the same kind of device).
    Anything missing or damaged is an OpscopeError."""
    if not paths:
        raise OpscopeError("no runs given")
    runs = [read_run(p) for p in paths]
    types = {str(r.meta.get("device", {}).get("type", "")) for r in runs}
    if len(types) > 1:
        raise OpscopeError(f"the runs are from different devices ({', '.join(sorted(types))}): gate runs of one kind")
    first = runs[0].meta
    peaks = first.get("peaks") or {}
    flops = peaks.get("flops_gflops") if isinstance(peaks.get("flops_gflops"), dict) else {}
    machine = Machine(
        device_type=_text(first.get("device", {}).get("type")), device_name=_text(first.get("device", {}).get("name")),
        threads=sorted({int(r.meta["threads"]) for r in runs if isinstance(r.meta.get("threads"), int)}),
        memory_bandwidth_gbps=_number(peaks.get("memory_bandwidth_gbps")),
        flops_gflops={_text(k): v for k, v in ((k, _number(v)) for k, v in (flops or {}).items()) if v is not None},
        ceilings_origin={_text(k): _text(v) for k, v in (peaks.get("origin") or {}).items()})
    samples = Samples(torch_version=first.get("torch_version") if isinstance(first.get("torch_version"), str) else None,
                      opscope_version=_text(first.get("opscope_version")) or None, target=_text(first.get("target")),
                      machine=machine)
    rows: dict[tuple[str, str, str], OpSamples] = {}
    step_sums: dict[tuple[str, str, str], list[list[float] | None]] = {}
    modules: dict[str, ModuleSamples] = {}
    for i, run in enumerate(runs):
        steps = max(1, int(_number(run.summary.get("steps")) or 1))
        noise = run.summary.get("noise")
        noise = noise if isinstance(noise, dict) else {}
        samples.runs.append(RunInfo(path=_text(shown_path(run.path or Path("."))), created=_text(run.meta.get("created")),
                                    steps=steps, noisy=noise.get("verdict") == "noisy",
                                    noise_reason=_text(noise.get("reason")) or None))
        samples.step_times_us.append(step_samples(run))
        ops = run.ops
        total = 0.0
        per_step = _row_steps(run)
        for j in range(len(ops["op"])):
            t = _number(ops["time_us_total"][j])
            if t is None:
                continue
            total += t / steps
            key = (_text(ops["op"][j]), _text(ops["source_location"][j]), _text(ops["input_dims"][j]))
            row = rows.get(key)
            if row is None:
                module = ops["module"][j] if "module" in ops else ""
                row = rows[key] = OpSamples(op=key[0], line=key[1], shapes=key[2], module=_text(module),
                                            times_us=[0.0] * len(runs))
            if not row.bound and "bound" in ops:
                row.bound = _text(ops["bound"][j])
            row.times_us[i] += t / steps
            # per step: summed over the ops.csv rows of this key; unknown (None) once one of them has none
            by_step = step_sums.setdefault(key, [[] for _ in runs])
            have, kept = by_step[i], per_step.get(j)
            if have is not None:
                by_step[i] = None if kept is None else (
                    [a + b for a, b in zip(have, kept, strict=False)] if have else list(kept))
        samples.op_time_us.append(total)
        table = run.modules
        if table is not None:
            for j in range(len(table["module"])):
                t = _number(table["time_us_total"][j])
                if t is None:
                    continue
                name = _text(table["module"][j])
                mod = modules.get(name)
                if mod is None:
                    mod = modules[name] = ModuleSamples(module=name, module_class=_text(table["module_class"][j]),
                                                        times_us=[0.0] * len(runs))
                mod.times_us[i] += t / steps
    for key, row in rows.items():
        by_step = step_sums.get(key, [])
        if by_step and all(x for x in by_step):  # every run kept this row's steps
            row.step_times_us = [list(x or []) for x in by_step]
    samples.ops = sorted(rows.values(), key=lambda r: -max(r.times_us))[:MAX_OP_ROWS]
    samples.modules = sorted(modules.values(), key=lambda m: -max(m.times_us))[:MAX_MODULES]
    return samples
