"""What-if predictions against real fixes (issue 27): for each model with a known fix, profile the model as it
is, ask `opscope.whatif` what the step would be with the finding's fix, then profile the fixed model and
compare the predicted step time with the measured one.

    python benchmarks/whatif_validation.py [--steps 20] [--rounds 3] [--threads N]

The models: examples/findings/ (channels-last, a hand-written GELU fused, transpose+reshape copies with
attention rewritten as SDPA) and benchmarks/whatif_models/ (a hand-written LayerNorm, a `.contiguous()`
copy per call). Each round profiles before and after back to
back (interleaved, so that a slower machine moment hits both); the table shows medians over the rounds, the
error of the prediction ((predicted - measured) / measured) and the findings applied. Timings on a shared
machine are noisy: read the error next to the rounds' spread.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import opscope

REPO = Path(__file__).resolve().parent.parent
# (name, before, after, the rules whose findings the fix answers)
CASES = [
    ("channels-last", "examples/findings/channels_last_before.py", "examples/findings/channels_last_after.py",
     ("channels-last",)),
    ("fused GELU", "examples/findings/fused_gelu_before.py", "examples/findings/fused_gelu_after.py", ("fusion",)),
    ("fused LayerNorm", "benchmarks/whatif_models/layer_norm_before.py",
     "benchmarks/whatif_models/layer_norm_after.py", ("fusion",)),
    (".contiguous() copy", "benchmarks/whatif_models/contiguous_before.py",
     "benchmarks/whatif_models/contiguous_after.py", ("contiguous-call",)),
    # the fix there is more than its findings: SDPA replaces bmm/softmax/bmm as well as the copies
    ("copies + SDPA", "examples/findings/transpose_copy_before.py", "examples/findings/transpose_copy_after.py",
     ("implicit-copy", "fusion")),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="opscope-whatif-") as tmp:
        for name, before, after, rules in CASES:
            recorded, predicted, measured, applied = [], [], [], set()
            for r in range(args.rounds):
                run_b = opscope.profile(REPO / before, steps=args.steps, warmup=args.warmup, threads=args.threads,
                                        out=Path(tmp) / f"{name}-before-{r}")
                ids = [f.id for f in run_b.findings if f.rule in rules]
                if not ids:
                    print(f"{name}: round {r}: no {'/'.join(rules)} finding on this machine; skipped")
                    continue
                result = opscope.whatif(run_b.dir, findings=ids)
                run_a = opscope.profile(REPO / after, steps=args.steps, warmup=args.warmup, threads=args.threads,
                                        out=Path(tmp) / f"{name}-after-{r}")
                recorded.append(result.recorded_step_time_us)
                predicted.append(result.predicted_step_time_us)
                assert run_a.step_time_us is not None
                measured.append(run_a.step_time_us)
                applied.update(ids)
            if not measured:
                continue
            p, m = statistics.median(predicted), statistics.median(measured)
            spread = (max(measured) - min(measured)) / m if len(measured) > 1 else 0.0
            rows.append((name, statistics.median(recorded), p, m, (p - m) / m, spread, len(applied)))
    print(f"{'fix':<20} {'before ms':>10} {'predicted':>10} {'measured':>10} {'error':>8} {'spread':>8}  findings")
    for name, rec, p, m, err, spread, n in rows:
        print(f"{name:<20} {rec / 1e3:>10.2f} {p / 1e3:>10.2f} {m / 1e3:>10.2f} {err:>+8.1%} {spread:>8.1%}  {n}")


if __name__ == "__main__":
    main()
