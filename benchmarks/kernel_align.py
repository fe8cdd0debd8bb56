"""Lining up measured kernels with the run's kernel plan (opscope.nsight.measured.align), as `profile
--ncu` / `--nsys` and `analyze --ncu` do, on a long step: the 60 kernels of the real H100 BERT-small
step repeated (575 times: 34,500 kernels), measured as recorded, with every 50th kernel dropped, with a
kernel added every 50, and both. Prints align's time and number of matched kernels for each, and
difflib's (the matcher align used for every size before) where it finishes in reasonable time, and
whether the two agree.

    python benchmarks/kernel_align.py [--repeats 575] [--difflib-up-to 2400]
"""

from __future__ import annotations

import argparse
import difflib
import time
from pathlib import Path

from opscope.analysis.pipeline import analyze
from opscope.analysis.trace_file import trace_device, trace_meta, trace_peaks
from opscope.nsight.commands import kernel_key
from opscope.nsight.measured import kernel_plan, matched_pairs
from opscope.trace.reader import load_trace

BERT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "traces" / "h100_bert-small_bf16.json.gz"
EXTRA = "void at::native::unrolled_elementwise_kernel<at::native::FillFunctor<float>>(int, T1)"


def difflib_pairs(a: list[str], b: list[str]) -> list[tuple[int, int]]:
    """What align lined up before: difflib's longest matching blocks."""
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    return [(block.a + k, block.b + k) for block in matcher.get_matching_blocks() for k in range(block.size)]


def step_kernels() -> list[str]:
    trace = load_trace(BERT)
    device = trace_device(trace)
    peaks = trace_peaks(trace, device, None, None, lambda m: None)
    plan = kernel_plan(analyze(trace, peaks=peaks, meta=trace_meta(BERT, trace, device, peaks), source="trace"))
    return [name for name, kind in zip(plan["name"], plan["kind"], strict=True) if kind == "kernel"]


def measured_variants(expected: list[str]) -> dict[str, list[str]]:
    dropped = [n for i, n in enumerate(expected) if i % 50 != 7]
    added = [x for i, n in enumerate(expected) for x in ([n, EXTRA] if i % 50 == 23 else [n])]
    both = [x for i, n in enumerate(expected) if i % 50 != 7 for x in ([n, EXTRA] if i % 50 == 23 else [n])]
    return {"as recorded": list(expected), "every 50th dropped": dropped, "one added every 50": added,
            "dropped and added": both}


def timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=575)
    parser.add_argument("--difflib-up-to", type=int, default=2400,
                        help="run difflib too when the step has at most this many kernels")
    args = parser.parse_args()
    step = step_kernels()
    for repeats in sorted({10, 40, args.repeats}):
        expected = step * repeats
        a = [kernel_key(n) for n in expected]
        for label, measured in measured_variants(expected).items():
            b = [kernel_key(n) for n in measured]
            pairs, seconds = timed(matched_pairs, a, b)
            line = f"{len(a):>6} x {len(b):>6} {label:<20} align {seconds:8.3f} s {len(pairs):>6} matched"
            if len(a) <= args.difflib_up_to:
                reference, reference_s = timed(difflib_pairs, a, b)
                line += (f"   difflib {reference_s:8.3f} s {len(reference):>6} matched   "
                         f"same pairs: {pairs == reference}")
            print(line, flush=True)


if __name__ == "__main__":
    main()
