"""Synthetic samples for the gate's tests: runs whose step and op times are drawn from known distributions
(seeded), built as opscope.gating.samples.Samples without profiling anything."""

from __future__ import annotations

import random

from opscope.gating.samples import Machine, ModuleSamples, OpSamples, RunInfo, Samples

# op, line, module, time per step (µs)
OPS = [("aten::mm", "model.py:14", "fc1", 30_000.0), ("aten::mm", "model.py:15", "fc2", 30_000.0),
       ("aten::clamp_min", "model.py:14", "", 8_000.0)]
# what bounds each (ops.csv bound), with bounds=True
BOUNDS = {"aten::mm": "compute", "aten::clamp_min": "memory", "aten::add": "memory", "aten::copy_": "memory"}


def synthetic(runs: int, *, seed: int, steps: int = 10, spread: float = 0.03, load: list[float] | None = None,
              slower: dict[str, float] | None = None, extra: tuple[str, str, float] | None = None,
              noisy: bool = False, bandwidth: float = 20.0, threads: int = 1, per_step: bool = False,
              bounds: bool = False, kind_load: dict[str, list[float]] | None = None,
              run_level: dict[str, list[float]] | None = None,
              more: list[tuple[str, str, str, float]] | None = None) -> Samples:
    """`runs` runs of OPS: each op's time per run and each step lognormal around its mean (`spread` sigma),
    times a run's `load`; `slower` multiplies the op at a line; `extra` adds a new op row (op, line, µs);
    `per_step` gives each op row its time in each step too (as profile runs keep them). `bounds` fills each
    row's bound (BOUNDS; else "", as in old baselines); `kind_load` multiplies each run's rows of a bound
    (load slows kinds unalike); `run_level` multiplies the op rows of a line by a factor per run, every step of
    the run alike (an allocation that page-faults in some processes only); `more` adds matched op rows."""
    rng = random.Random(seed)
    load = load or [1.0] * runs

    def factor(op: str, line: str, i: int) -> float:
        kind = (kind_load or {}).get(BOUNDS.get(op, ""), [1.0] * runs)[i]
        return load[i] * kind * (run_level or {}).get(line, [1.0] * runs)[i]

    rows = []
    for op, line, module, mean in OPS + (more or []):
        slow = (slower or {}).get(line, 1.0)
        rows.append(OpSamples(op=op, line=line, shapes="[[32768, 128]]", module=module,
                              bound=BOUNDS.get(op, "unknown") if bounds else "",
                              times_us=[mean * slow * factor(op, line, i) * rng.lognormvariate(0, spread)
                                        for i in range(runs)]))
    if extra is not None:
        rows.append(OpSamples(op=extra[0], line=extra[1], shapes="[[128, 32768]]", module="",
                              bound=BOUNDS.get(extra[0], "unknown") if bounds else "",
                              times_us=[extra[2] * factor(extra[0], extra[1], i) * rng.lognormvariate(0, spread)
                                        for i in range(runs)]))
    if per_step:  # each op row's time in each step, around its run's time
        for r in rows:
            r.step_times_us = [[t * rng.lognormvariate(0, spread) for _ in range(steps)] for t in r.times_us]
    op_time = [sum(r.times_us[i] for r in rows) for i in range(runs)]
    step_times = [[op_time[i] * 1.02 * rng.lognormvariate(0, spread) for _ in range(steps)] for i in range(runs)]
    modules = [ModuleSamples(module="", module_class="Net", times_us=list(op_time))]
    for name in ("fc1", "fc2"):
        modules.append(ModuleSamples(module=name, module_class="Linear",
                                     times_us=[sum(r.times_us[i] for r in rows if r.module == name) for i in range(runs)]))
    return Samples(torch_version="2.13.0+cpu", target="model.py",
                   machine=Machine(device_type="cpu", device_name="CPU", threads=[threads],
                                   memory_bandwidth_gbps=bandwidth, flops_gflops={"float32": 5 * bandwidth}),
                   runs=[RunInfo(path=f"run-{i + 1}", steps=steps, noisy=noisy,
                                 noise_reason="other processes used 1.0 of 2 cores" if noisy else None)
                         for i in range(runs)],
                   step_times_us=step_times, op_time_us=op_time, ops=rows, modules=modules)
