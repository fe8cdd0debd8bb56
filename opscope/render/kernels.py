"""The console view of `opscope kernels`: the listing of the bundled kernels and the benchmark's results, from the
documents opscope.kernels builds (plain dicts; nothing here imports torch or the kernels)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text


def listing(doc: dict[str, Any], console: Console) -> None:
    """`opscope kernels`: one row per kernel, then what each backend can do on this machine."""
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("kernel", "replaces", "dtypes", "backends", "usable here"):
        table.add_column(col)
    short = {"float32": "f32", "float64": "f64", "bfloat16": "bf16", "float16": "f16"}
    for k in doc["kernels"]:
        # a module's, function's or method's last name (torch.nn.RMSNorm -> RMSNorm); an aten op or a pattern whole
        targets = ", ".join(dict.fromkeys(r["target"].rsplit(".", 1)[-1] if r["kind"] in ("module", "functional", "method")
                                          else r["target"] for r in k["replaces"]))
        # Text cells: rich would read a pattern's brackets (x[..., :n]) as markup
        table.add_row(*map(Text, (k["name"], targets, " ".join(short[d] for d in k["dtypes"]),
                                  " ".join(k["backends"]), " ".join(k["usable_here"]) or "-")))
    console.print(table)
    mach = doc["machine"]
    console.print()
    for backend, status in mach["backends"].items():
        console.print(f"{backend:<7} {status}", markup=False, soft_wrap=True)
    if mach["note"]:
        console.print(f"note: {mach['note']}", markup=False, soft_wrap=True)


def benchmark(doc: dict[str, Any], console: Console) -> None:
    """`opscope kernels --bench`: one row per (kernel, case), the goals, and the machine."""
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("kernel", "case", "kernel ms (p20-p80)", "GB/s", "% BW", "bound (in cache GB/s)", "vs aten",
                "vs compile", "vs best", "suggested"):
        table.add_column(col, justify="left" if col in ("kernel", "case", "suggested") else "right")

    def ratio(value: Any) -> str:
        return f"{value:.2f}x" if isinstance(value, (int, float)) else "-"

    for r in doc["results"]:
        t = r["timings"]["kernel"]
        pct = f"{r['pct_bandwidth']:.0f}%" if r["pct_bandwidth"] is not None else "-"
        table.add_row(r["kernel"], r["case"], f"{t['median_ms']:.2f} ({t['p20_ms']:.2f}-{t['p80_ms']:.2f})",
                      f"{r['gbps']:.1f}", pct, _bound(r), ratio(r.get("vs_aten")), ratio(r.get("vs_compile")),
                      ratio(r.get("vs_best")), "yes" if r.get("suggested") else "no")
    console.print(table)
    suggested = sum(bool(r.get("suggested")) for r in doc["results"])
    console.print(f"suggested: {suggested} of {len(doc['results'])} cases (vs best >= 1.0: faster than both aten "
                  "and torch.compile)", markup=False)
    for r in doc["results"]:
        if r.get("why"):
            console.print(f"  {'' if r.get('suggested') else 'not suggested: '}{r['kernel']} {r['case']}: {r['why']}",
                          markup=False, soft_wrap=True)
    met = sum(g["met"] for g in doc["goals"])
    console.print(f"goals met: {met} of {len(doc['goals'])}", markup=False)
    for g in doc["goals"]:
        if not g["met"]:
            console.print(f"  not met: {g['kernel']} {g['case']}: {g['goal']} (measured {g['value']})", markup=False)
    mach = doc["machine"]
    console.print(f"machine: {mach['cpu']}, {mach['threads']} threads, {mach['isa']}; torch {mach['torch']}; "
                  f"bandwidth ceiling {mach['peak_bandwidth_gbps']:.1f} GB/s ({mach['peak_origin']})"
                  if mach["peak_bandwidth_gbps"] else "", markup=False, soft_wrap=True)
    if mach["gpu"] is None:
        console.print("no GPU here: the Triton and CUDA kernels are compiled and interpreter-checked, not timed",
                      markup=False)


def _bound(result: dict[str, Any]) -> str:
    """What limits the case here (opscope.kernels.bench.bound), with the rate it reached in cache."""
    rate = result.get("in_cache_gbps")
    if rate is None:
        return "-"
    return f"{result.get('bound') or '?'} ({rate:.0f})"


def tuning(doc: dict[str, Any], console: Console) -> None:
    """`opscope kernels --tune`: per kernel and case, the shape class, the chosen grain and each candidate's time."""
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("kernel", "case", "dtype", "shape class", "chosen", "candidates (ms per call)"):
        table.add_column(col)
    for r in doc["results"]:
        cands = "  ".join(f"{g}: {ms:.4g}" for g, ms in r["candidates_ms"].items())
        table.add_row(r["kernel"], r["case"], r["dtype"], r["shape_class"], r["chosen"], cands)
    console.print(table)
    what = "Triton launches on" if doc.get("backend") == "triton" else "machine:"
    console.print(f"{what} {doc['machine']}, {doc['threads']} threads; cached in {doc['cache']} "
                  "(grain_size=0: the kernel's built-in default)", markup=False, soft_wrap=True)
