"""How `opscope analyze` scales with trace size: wall time, peak memory and events/second.

Traces: the largest shared trace as is, a ~132k-event trace (the size of the real H100 trace peer
tools were measured on: one takes 8.6 s and 677 MB for its per-op report, another 3.2 s just to load
it) and a 1,000,000-cpu_op trace, both built by replicating every event of the shared H100 ViT trace
with shifted timestamps and fresh correlation / External ids, gzipped like the real one. Each analysis runs in a fresh
subprocess (`python -m opscope analyze`), so peak RSS is the whole process's.

    python benchmarks/analyze_scaling.py [--skip-million]
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
    ap.add_argument("--skip-million", action="store_true")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    cases = [("shared H100 ViT trace", SOURCE, None)]
    targets = [("~132k events", 32_000, OUT / "synthetic_132k.json.gz")]
    if not args.skip_million:
        targets.append(("1,000,000 cpu_ops", 1_000_000, OUT / "synthetic_1m.json.gz"))
    for label, n_ops, path in targets:
        if not path.exists():
            t0 = time.perf_counter()
            n_events, n_cpu = replicate(n_ops, path)
            print(f"built {path.name}: {n_events:,} events, {n_cpu:,} cpu_ops, "
                  f"{path.stat().st_size / 2**20:.0f} MiB in {time.perf_counter() - t0:.0f} s")
        cases.append((label, path, None))
    print(f"\n{'trace':<24} {'events':>10} {'cpu_ops':>10} {'size MiB':>9} {'wall s':>7} {'peak MiB':>9} {'events/s':>10}")
    for label, path, _ in cases:
        raw = gzip.decompress(path.read_bytes())
        n_events = raw.count(b'"ph"')
        n_cpu = raw.count(b'"cat": "cpu_op"')
        del raw
        wall, rss = run_analyze(path)
        print(f"{label:<24} {n_events:>10,} {n_cpu:>10,} {path.stat().st_size / 2**20:>9.1f} {wall:>7.2f} "
              f"{rss:>9.0f} {n_events / wall:>10,.0f}")


if __name__ == "__main__":
    main()
