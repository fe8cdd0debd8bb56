"""Benchmark the bundled reference kernels (same harness as `opscope kernels --bench`), several times in a
row, and print the spread of each kernel's ratios across the runs (this project's 2-core machines are
shared, so one run's numbers move; the README table gives the median run and the range).

    PYTHONPATH=. python benchmarks/kernels_bench.py --runs 3 --out reports/kernels-bench
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from opscope.kernels import bench as kb


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="kernels (default: all)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--tune", action="store_true", help="tune grain sizes before the first run")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("reports/kernels-bench"))
    args = ap.parse_args()
    runs = []
    for i in range(args.runs):
        doc = kb.run(args.names, repeats=args.repeats, compiled=not args.no_compile, do_tune=args.tune and i == 0,
                     progress=print)
        kb.save(doc, args.out / f"run{i + 1}")
        runs.append(doc)
    summary = []
    for j, r in enumerate(runs[0]["results"]):
        row = {"kernel": r["kernel"], "case": r["case"]}
        for key in ("gbps", "pct_bandwidth", "in_cache_gbps"):
            vals = [run["results"][j][key] for run in runs if run["results"][j].get(key) is not None]
            if vals:
                row[key] = [round(statistics.median(vals), 2), round(min(vals), 2), round(max(vals), 2)]
        for key in r["ratios"]:
            vals = [run["results"][j]["ratios"][key] for run in runs]
            row[key] = [round(statistics.median(vals), 3), round(min(vals), 3), round(max(vals), 3)]
        row["kernel_ms"] = [round(statistics.median(run["results"][j]["timings"]["kernel"]["median_ms"] for run in runs), 3)]
        # the verdict of the median run's ratios (opscope kernels --bench --json carries the same keys per run)
        ratios = {k: row[k][0] for k in r["ratios"]}
        pct = row["pct_bandwidth"][0] if "pct_bandwidth" in row else None
        in_cache = row["in_cache_gbps"][0] if "in_cache_gbps" in row else None
        peak = runs[0]["machine"]["peak_bandwidth_gbps"]
        # what limits the case here (the median run's in-cache rate against the ceiling), and how close it gets
        limit = kb.bound(in_cache, peak)
        attainable = min(in_cache, peak) if limit is not None else peak
        summary.append({"kernel": r["kernel"], "case": r["case"], **kb.verdict(ratios, pct), "bound": limit,
                        "pct_attainable": round(100 * row["gbps"][0] / attainable, 1) if attainable else None,
                        **{k: v for k, v in row.items() if k not in ("kernel", "case", "pct_bandwidth")},
                        "pct_bandwidth_range": row.get("pct_bandwidth")})
    (args.out / "summary.json").write_text(json.dumps({"machine": runs[0]["machine"], "runs": args.runs,
                                                       "rows": summary}, indent=1) + "\n")
    for row in summary:
        print(json.dumps({k: row.get(k) for k in ("kernel", "case", "vs_aten", "vs_compile", "vs_best", "pct_bandwidth",
                                              "bound", "in_cache_gbps", "pct_attainable", "suggested", "why")}))
    print(f"suggested: {sum(r['suggested'] for r in summary)} of {len(summary)} cases")
    short = [r for r in summary if r["pct_attainable"] is not None and r["pct_attainable"] < kb.BANDWIDTH_GOAL_PCT]
    print(f"below {kb.BANDWIDTH_GOAL_PCT:g} % of their ceiling (the memory's, or their in-cache rate where that is "
          f"lower): {len(short)} of {len(summary)}"
          + "".join(f"\n  {r['kernel']} {r['case']}: {r['pct_attainable']} % ({r['bound'] or 'not probed'})"
                    for r in short))


if __name__ == "__main__":
    main()
