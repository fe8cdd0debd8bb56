"""opscope's profiling overhead, measured side by side in one run.

Ratio = time per step of opscope's timed pass / the same steps under a bare
`torch.profiler.profile(record_shapes=True)`. Rounds alternate (bare, opscope, bare, ...) so drift on a
noisy machine hits both alike; the median per-step time of each is compared. The untimed phases
(calibration, the source-line pass, trace export and analysis) are reported separately from a full
`opscope profile` of the same model.

    python benchmarks/profile_overhead.py [examples/transformer_block.py] [--rounds 7] [--steps 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # as the CLI does: no kineto line per profiler start/stop

import torch  # noqa: E402

from opscope.capture.harness import Harness, resolve_device  # noqa: E402
from opscope.capture.torch_profiler import profile_target, profiler_activities, timed_pass  # noqa: E402
from opscope.target.model_file import load_target  # noqa: E402
from opscope.target.specs import ProfileOptions  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def bare_pass(harness: Harness, steps: int) -> float:
    t0 = time.perf_counter()
    with torch.profiler.profile(activities=profiler_activities(harness.device), record_shapes=True):
        for _ in range(steps):
            harness.step()
            harness.synchronize()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("targets", nargs="*", default=[str(ROOT / "examples" / n) for n in
                                                   ("mlp.py", "convnet.py", "transformer_block.py")])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    device = resolve_device("auto")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {device}")
    print(f"{'target':<24} {'bare ms/step':>12} {'opscope ms/step':>16} {'ratio':>7}   untimed phases (s)")
    for target_path in args.targets:
        target = load_target(target_path)
        harness = Harness(target, mode="inference", device=device, dtype=None)
        for _ in range(3):
            harness.step()
        bare, ours = [], []
        for _ in range(args.rounds):
            bare.append(bare_pass(harness, args.steps) / args.steps)
            ours.append(timed_pass(harness, args.steps, profiler_activities(device))[1] / args.steps)
        b, o = statistics.median(bare), statistics.median(ours)
        with tempfile.TemporaryDirectory() as tmp:
            _, t = profile_target(ProfileOptions(target=Path(target_path), out=Path(tmp) / "run", steps=args.steps))
        phases = (f"calibration {t.calibration:.2f}, lines {t.lines:.2f}, memory {t.memory:.2f}, export {t.export:.2f}, "
                  f"analysis {t.analysis:.2f}, load {t.load:.2f}")
        print(f"{Path(target_path).name:<24} {b * 1e3:>12.3f} {o * 1e3:>16.3f} {o / b:>7.3f}   {phases}")


if __name__ == "__main__":
    main()
