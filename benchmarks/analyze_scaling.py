"""How `opscope analyze` scales with trace size: wall time, peak memory and events/second.

Traces: the largest shared trace as is; a ~132k-event trace (the size of the real owlv2 H100 trace
peer tools were measured on: TraceLens takes 8.6 s and 677 MB for its per-op report, HTA 3.2 s just to
load it; that trace is not in this repository, so this one stands in for it) at 1x, 5x and 20x its
events; and, with --million, a 1,000,000-cpu_op trace. All are built by replicating every event of the
shared H100 ViT trace with shifted timestamps and fresh correlation / External ids, gzipped like the
real one. Each analysis runs in a fresh subprocess (`python -m opscope analyze`), so peak RSS is the
whole process's. The last lines compare the largest multiple with 1x (issue 28's goals: peak RSS at
most 2x, time at most linear).

    python benchmarks/analyze_scaling.py [--multiples 1,5,20] [--million]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests" / "fixtures" / "traces" / "h100_vit-image-classifier_bf16.json.gz"
OUT = ROOT / "benchmarks" / "out"


def replicate(target_cpu_ops: int, path: Path) -> tuple[int, int]:
    """Writes a trace with about `target_cpu_ops` cpu_op events; returns (events, cpu_ops)."""
    doc = json.loads(gzip.decompress(SOURCE.read_bytes()))
    events = doc.pop("traceEvents")
    body = [e for e in events if e.get("ph") != "M"]
    meta = [e for e in events if e.get("ph") == "M"]
    per_copy = sum(1 for e in body if e.get("cat") == "cpu_op")
    copies = max(1, round(target_cpu_ops / per_copy))
    t0 = min(e["ts"] for e in body if "ts" in e)
    span = max(e["ts"] + e.get("dur", 0) for e in body if "ts" in e) - t0 + 100.0
    n_events = 0
    with gzip.open(path, "wt", compresslevel=1) as f:
        f.write(json.dumps({k: v for k, v in doc.items()})[:-1] + ', "traceEvents": [')
        f.write(",".join(json.dumps(e) for e in meta))
        n_events += len(meta)
        for c in range(copies):
            shift = c * span
            chunk = []
            for e in body:
                e2 = dict(e)
                if "ts" in e2:
                    e2["ts"] = e["ts"] + shift
                args = e.get("args")
                if isinstance(args, dict):
                    a2 = dict(args)
                    for key in ("External id", "correlation", "Python id"):
                        if isinstance(a2.get(key), int):
                            a2[key] = a2[key] + c * 10_000_000
                    if isinstance(a2.get("Python parent id"), int):
                        a2["Python parent id"] += c * 10_000_000
                    e2["args"] = a2
                if e2.get("ph") in ("s", "f") and isinstance(e2.get("id"), int):
                    e2["id"] = e2["id"] + c * 10_000_000
                if isinstance(e2.get("name"), str) and e2["name"].startswith("ProfilerStep#"):
                    e2["name"] = f"ProfilerStep#{c}"
                chunk.append(json.dumps(e2))
            f.write("," + ",".join(chunk))
            n_events += len(chunk)
        f.write("]}")
    return n_events, copies * per_copy


def run_analyze(trace: Path) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of `opscope analyze` in a fresh process."""
    with tempfile.TemporaryDirectory() as tmp:
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c",
                               "import resource, sys; from opscope.cli.app import main; sys.argv[0]='opscope';"
                               "\ntry:\n    main()\nfinally:\n"
                               "    print('maxrss', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)",
                               "analyze", str(trace), "--out", str(Path(tmp) / "run"), "--json"],
                              capture_output=True, text=True, env={**os.environ, "COLUMNS": "120"})
        wall = time.perf_counter() - t0
        del before
        if proc.returncode != 0:
            raise SystemExit(proc.stderr)
        rss_kib = int(next(ln.split()[1] for ln in proc.stderr.splitlines() if ln.startswith("maxrss")))
    return wall, rss_kib / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--multiples", default="1,5,20",
                    help="sizes of the ~132k-event trace to measure, as multiples of it (default 1,5,20)")
    ap.add_argument("--million", action="store_true", help="also the 1,000,000-cpu_op trace")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    multiples = [int(x) for x in args.multiples.split(",") if x.strip()]
    cases: list[tuple[str, Path, int | None]] = [("shared H100 ViT trace", SOURCE, None)]
    targets = [(f"~132k events x{m}", 32_000 * m, OUT / (f"synthetic_132k_x{m}.json.gz" if m != 1 else
                                                       "synthetic_132k.json.gz"), m) for m in multiples]
    if args.million:
        targets.append(("1,000,000 cpu_ops", 1_000_000, OUT / "synthetic_1m.json.gz", None))
    for label, n_ops, path, multiple in targets:
        if not path.exists():
            t0 = time.perf_counter()
            n_events, n_cpu = replicate(n_ops, path)
            print(f"built {path.name}: {n_events:,} events, {n_cpu:,} cpu_ops, "
                  f"{path.stat().st_size / 2**20:.0f} MiB in {time.perf_counter() - t0:.0f} s")
        cases.append((label, path, multiple))
    print(f"\n{'trace':<24} {'events':>10} {'cpu_ops':>10} {'size MiB':>9} {'wall s':>7} {'peak MiB':>9} "
          f"{'events/s':>10} {'RSS / x1':>9} {'time / x1':>10}")
    base: tuple[float, float] | None = None
    scaled: list[tuple[int, float, float]] = []
    for label, path, multiple in cases:
        n_events = n_cpu = 0
        with gzip.open(path, "rb") as f:  # counted in blocks: the 20x trace is 0.7 GB of text
            tail = b""
            while block := f.read(1 << 24):
                text = tail + block
                n_events += text.count(b'"ph"')
                n_cpu += text.count(b'"cat": "cpu_op"')
                tail = text[-32:]
                n_events -= tail.count(b'"ph"')
                n_cpu -= tail.count(b'"cat": "cpu_op"')
            n_events += tail.count(b'"ph"')
            n_cpu += tail.count(b'"cat": "cpu_op"')
        wall, rss = run_analyze(path)
        ratios = ""
        if multiple == 1:
            base = (wall, rss)
        if multiple is not None and base is not None:
            ratios = f" {rss / base[1]:>9.2f} {wall / base[0]:>10.2f}"
            scaled.append((multiple, wall, rss))
        print(f"{label:<24} {n_events:>10,} {n_cpu:>10,} {path.stat().st_size / 2**20:>9.1f} {wall:>7.2f} "
              f"{rss:>9.0f} {n_events / wall:>10,.0f}{ratios}")
    if base is not None and len(scaled) > 1:
        top, wall, rss = scaled[-1]
        print(f"\nx{top}: peak RSS {rss / base[1]:.2f}x the x1's (goal: at most 2x); time {wall / base[0]:.2f}x "
              f"for {top}x the events (goal: at most linear, {top}x)")


if __name__ == "__main__":
    main()
