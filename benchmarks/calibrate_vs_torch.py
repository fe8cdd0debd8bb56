"""opscope's CPU calibration next to a plain torch measurement, quiet and under load, in one run.

    python benchmarks/calibrate_vs_torch.py [--threads N] [--quick] [--size-mib MIB] [--gemm-n N]

Two phases: first as the machine is ("quiet"), then with one busy-loop process per core ("loaded").
Each phase runs opscope's calibration (calibrate.measure_cpu, which also reads other processes' CPU use)
and a deliberately naive plain torch measurement: torch.empty buffers (the default allocator), a
`dst.copy_(src)` loop and a `torch.mm` loop timed with time.perf_counter, median of the iterations after
one warm-up. Copy counts 2 x bytes per iteration (read src + write dst), GEMM 2*n^3 FLOPs.

Printed: opscope against plain torch in the quiet phase (a ratio near 1 means the calibration measures
what a straightforward torch loop sees), then each figure loaded / quiet with opscope's stable flag. The
goal: opscope's loaded figures land within 15 % of the quiet ones, or the loaded calibration says it is
unstable (and would not be cached). Nothing is written to the calibration cache.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from opscope.machine import (
    calibrate,
    noise,  # noqa: E402
)

TOLERANCE = 0.15


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


def phase(threads: int, args: argparse.Namespace) -> dict:
    t0 = time.perf_counter()
    result = calibrate.measure_cpu(threads, quick=args.quick)
    opscope_s = time.perf_counter() - t0
    sampler = noise.CpuSampler()
    before = sampler.sample()
    plain = {"copy": statistics.median(plain_copy_gbps(args.size_mib, args.iters)),
             "float32": statistics.median(plain_mm_gflops(args.gemm_n, torch.float32, args.iters))}
    if "bfloat16" in result.gemm_gflops:
        plain["bfloat16"] = statistics.median(plain_mm_gflops(args.gemm_n, torch.bfloat16, args.iters))
    after = sampler.sample()
    plain_noise = noise.window_noise(sampler, before, after, threads, during="while it measured")
    return {"result": result, "plain": plain, "opscope_s": opscope_s, "plain_s": after.wall_s - before.wall_s,
            "plain_noise": plain_noise}


def fmt(v: float | None) -> str:
    return "—" if v is None else f"{v:,.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads (default: torch's)")
    parser.add_argument("--quick", action="store_true", help="use the quick calibration")
    parser.add_argument("--size-mib", type=int, default=1024, help="plain copy buffer size (default 1024)")
    parser.add_argument("--gemm-n", type=int, default=2048, help="plain GEMM size n (default 2048)")
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()

    previous = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    cores = len(noise.affinity_cpus())
    try:
        quiet = phase(threads, args)
        with noise.busy_loops(cores):
            loaded = phase(threads, args)
    finally:
        torch.set_num_threads(previous)

    q, ld = quiet["result"], loaded["result"]
    print(f"{q.cpu_model}, {threads} threads, {cores} cores, torch {torch.__version__}; "
          f"{'quick' if args.quick else 'full'} calibration")
    print(f"quiet: opscope {quiet['opscope_s']:.1f} s, plain {quiet['plain_s']:.1f} s; loaded ({cores} busy loops): "
          f"opscope {loaded['opscope_s']:.1f} s, plain {loaded['plain_s']:.1f} s")
    print()
    print("quiet phase, opscope vs plain torch")
    print(f"{'quantity':<30}{'opscope':>12}{'plain torch':>14}{'ratio':>8}")
    rows = [("copy GB/s", q.copy_gbps, quiet["plain"]["copy"]),
            ("bandwidth ceiling GB/s", q.memory_bandwidth_gbps, quiet["plain"]["copy"])]
    rows += [(f"GEMM {k} GFLOP/s", q.gemm_gflops.get(k), v) for k, v in quiet["plain"].items() if k != "copy"]
    for name, ours, theirs in rows:
        ratio = f"{ours / theirs:>8.2f}" if ours and theirs else f"{'—':>8}"
        print(f"{name:<30}{fmt(ours):>12}{fmt(theirs):>14}{ratio}")
    print()
    print("quiet vs loaded")
    print(f"{'quantity':<30}{'quiet':>12}{'loaded':>12}{'loaded/quiet':>14}")
    pairs = [("opscope copy GB/s", q.copy_gbps, ld.copy_gbps),
             ("opscope bandwidth GB/s", q.memory_bandwidth_gbps, ld.memory_bandwidth_gbps)]
    pairs += [(f"opscope GEMM {k} GFLOP/s", q.gemm_gflops[k], ld.gemm_gflops.get(k)) for k in q.gemm_gflops]
    pairs += [(f"plain {'copy GB/s' if k == 'copy' else f'GEMM {k} GFLOP/s'}", v, loaded["plain"].get(k))
              for k, v in quiet["plain"].items()]
    worst = 1.0
    for name, a, b in pairs:
        ratio = b / a if a and b else None
        if ratio is not None and name.startswith("opscope"):
            worst = min(worst, ratio)
        print(f"{name:<30}{fmt(a):>12}{fmt(b):>12}{'—' if ratio is None else f'{ratio:.2f}':>14}")
    for name, shares in (("others' CPU share, opscope", [r.noise.get("other_cpu_share") for r in (q, ld)]),
                         ("others' CPU share, plain", [p["plain_noise"].get("other_cpu_share")
                                                       for p in (quiet, loaded)])):
        print(f"{name:<30}" + "".join(f"{'—' if v is None else f'{v:.2f}':>12}" for v in shares))
    print(f"{'opscope stable':<30}{q.stable!s:>12}{ld.stable!s:>12}")
    print()
    if not q.stable or quiet["plain_noise"]["verdict"] == "noisy":
        print("the quiet phase was not quiet (other processes' CPU share above): rerun on an idle machine")
    within = worst >= 1 - TOLERANCE
    verdict = ("loaded within 15% of quiet" if within else
               "loaded calibration says it is unstable" if not ld.stable else
               f"FAIL: loaded reads {1 - worst:.0%} low and is marked stable")
    print(f"goal (loaded within {TOLERANCE:.0%} of quiet, or marked unstable): {verdict}")
    print()
    print(f"opscope: copy/triad on 3 x {q.array_bytes >> 20} MiB arrays, GEMM sizes {q.gemm_sizes}, best of the "
          f"repeats; plain: copy on 2 x {args.size_mib} MiB, torch.mm {args.gemm_n}^3, medians of {args.iters} "
          "iterations; the bandwidth ceiling is max(copy, triad), the plain loop only measures copy")
    print()
    print("quiet:")
    print(calibrate.format_report(q))
    print()
    print("loaded:")
    print(calibrate.format_report(ld))
    return 0 if (within or not ld.stable) else 1


if __name__ == "__main__":
    raise SystemExit(main())
