"""opscope's CPU calibration next to a plain torch measurement of the same things, in one run.

    python benchmarks/calibrate_vs_torch.py [--threads N] [--quick] [--size-mib MIB] [--gemm-n N]

The plain side is deliberately naive: torch.empty buffers (the default allocator), a `dst.copy_(src)`
loop and a `torch.mm` loop timed with time.perf_counter, median of the iterations after one warm-up.
Copy counts 2 x bytes per iteration (read src + write dst), GEMM 2*n^3 FLOPs. A ratio near 1 means the
calibration measures what a straightforward torch loop sees; see opscope/calibrate.py for why it picks
its buffer and matrix sizes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from opscope import calibrate  # noqa: E402


def plain_copy_gbps(size_mib: int, iters: int) -> list[float]:
    n = size_mib * (1 << 20) // 4
    src = torch.ones(n, dtype=torch.float32)
    dst = torch.zeros(n, dtype=torch.float32)
    dst.copy_(src)  # warm-up
    rates = []
    for _ in range(iters):
        t0 = time.perf_counter()
        dst.copy_(src)
        rates.append(2 * n * 4 / (time.perf_counter() - t0) / 1e9)
    return rates


def plain_mm_gflops(n: int, dtype: torch.dtype, iters: int) -> list[float]:
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    torch.mm(a, b)  # warm-up
    rates = []
    for _ in range(iters):
        t0 = time.perf_counter()
        torch.mm(a, b)
        rates.append(2 * n**3 / (time.perf_counter() - t0) / 1e9)
    return rates


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads (default: torch's)")
    parser.add_argument("--quick", action="store_true", help="compare against the quick calibration")
    parser.add_argument("--size-mib", type=int, default=1024, help="plain copy buffer size (default 1024)")
    parser.add_argument("--gemm-n", type=int, default=2048, help="plain GEMM size n (default 2048)")
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()

    previous = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()

    t0 = time.perf_counter()
    result = calibrate.measure_cpu(threads, quick=args.quick)
    opscope_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    copy = statistics.median(plain_copy_gbps(args.size_mib, args.iters))
    mm = {"float32": statistics.median(plain_mm_gflops(args.gemm_n, torch.float32, args.iters))}
    if "bfloat16" in result.gemm_gflops:
        mm["bfloat16"] = statistics.median(plain_mm_gflops(args.gemm_n, torch.bfloat16, args.iters))
    plain_s = time.perf_counter() - t0
    torch.set_num_threads(previous)

    print(f"{result.cpu_model}, {threads} threads, torch {torch.__version__}")
    print(f"opscope calibration ({'quick' if args.quick else 'full'}): {opscope_s:.1f} s; plain torch: {plain_s:.1f} s")
    print()
    print(f"{'quantity':<28}{'opscope':>14}{'plain torch':>14}{'ratio':>8}")
    rows = [
        ("copy GB/s", result.copy_gbps, copy),
        ("bandwidth ceiling GB/s", result.memory_bandwidth_gbps, copy),
    ]
    rows += [(f"GEMM {k} GFLOP/s", result.gemm_gflops.get(k, float("nan")), v) for k, v in mm.items()]
    for name, ours, theirs in rows:
        print(f"{name:<28}{ours:>14,.1f}{theirs:>14,.1f}{ours / theirs:>8.2f}")
    print()
    print(f"opscope: copy/triad on 3 x {result.array_bytes >> 20} MiB arrays, GEMM sizes {result.gemm_sizes}; "
          f"plain: copy on 2 x {args.size_mib} MiB, torch.mm {args.gemm_n}^3; medians of {args.iters} iterations")
    print("the bandwidth ceiling is max(copy, triad); the plain loop only measures copy")
    print()
    print(calibrate.format_report(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
