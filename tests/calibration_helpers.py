"""Stand-ins for the calibration tests (tests/machine): recorded /proc/stat snapshots and calibration documents."""

from __future__ import annotations

from opscope.machine import calibrate
from opscope.machine.calibrate import CalibrationResult
from opscope.machine.noise import CpuSampler


def _fake_result(threads: int, **overrides) -> CalibrationResult:
    import torch

    fields = dict(
        cpu_model=calibrate.cpu_model_name(), threads=threads, torch_version=str(torch.__version__),
        copy_gbps=20.0, triad_gbps=25.0, gemm_gflops={"float32": 300.0, "bfloat16": 1200.0},
        gemm_sizes={"float32": 1024, "bfloat16": 1024},
        bandwidth_repeats=3, gemm_repeats=1, array_bytes=256 << 20, llc_bytes=32 << 20, quick=True,
    )
    fields.update(overrides)
    # each figure the best of its repeats, as measure_cpu records them (the cache checks it)
    fields.setdefault("samples", {
        "copy_gbps": [0.95 * fields["copy_gbps"], fields["copy_gbps"]],
        "triad_gbps": [fields["triad_gbps"], 0.9 * fields["triad_gbps"]],
        **{f"gemm_{k}_gflops": [v] for k, v in fields["gemm_gflops"].items()}})
    return CalibrationResult(**fields)


class _Snapshots(CpuSampler):
    """A CpuSampler replaying /proc/stat busy ticks: each sample() advances the clock by `step` s, this
    process's CPU by `own` s and the machine's busy time by `busy` s (2 CPUs, 100 ticks/s)."""

    def __init__(self, busy: float, own: float, step: float = 1.0) -> None:
        self.n = 0
        super().__init__(read_stat=self._stat, clock=lambda: self.n * step, own_cpu=lambda: self.n * own,
                         cpus=[0, 1], ticks_per_s=100)
        self.busy, self.step = busy, step

    def _stat(self) -> str:
        self.n += 1
        ticks = round(self.n * self.busy * 100)
        return f"cpu  {ticks} 0 0 99999 0 0 0 0 0 0\ncpu0 {ticks} 0 0 0 0 0 0 0 0 0\ncpu1 0 0 0 0 0 0 0 0 0 0\n"


def _doc(**result_changes) -> dict:
    """A cache document as save() writes it, with `result_changes` applied (None deletes the key)."""
    result = _fake_result(2).to_json()
    for key, value in result_changes.items():
        if value is None:
            result.pop(key)
        else:
            result[key] = value
    return {"format": calibrate.CACHE_FORMAT, "result": result}


def _with_samples(**figures) -> dict:
    """Changes to copy_gbps / triad_gbps with samples to match (the figure is the best of them), so only
    the plausibility bound can reject them."""
    samples = dict(_fake_result(2).samples)
    for key, value in figures.items():
        samples[key] = [value]
    return {**figures, "samples": samples}
