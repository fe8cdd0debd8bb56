"""The inclusive module tree (modules.csv): per nn.Module, the op time, FLOPs and bytes of every ops.csv
row that ran inside it (its own forward or any submodule's), its dominant bound class and the findings
about its ops. Built from the ops table, so its numbers are ops.csv's, added up once per module.

Names: an op row's `module` is the qualified name of the innermost module whose forward issued it ("" for
the model itself); its enclosing modules are the dotted prefixes of that name. `module_class` is empty
for ops outside the model's forward (loss, backward seed and optimizer of opscope's harness, or anything
the trace records outside a module): they form the OUTSIDE row, so that the depth-0 rows (the model and
OUTSIDE) add up to the run's op time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

from opscope.table import Table, filled, pairwise_sum

OUTSIDE = "(outside the model)"
COLUMNS = ["module", "module_class", "depth", "time_us_total", "time_share", "self_time_us", "flops_total",
           "bytes_total", "bound", "findings"]
BOUNDS = ("memory", "compute", "overhead", "unknown")


def has_module_columns(ops: Table) -> bool:
    return "module_class" in ops and any(c != "" for c in filled(ops["module_class"]))


def parents(path: str) -> list[str]:
    """'a.b.c' -> ['', 'a', 'a.b', 'a.b.c']: the module and every module enclosing it, outermost first."""
    if not path:
        return [""]
    parts = path.split(".")
    return [""] + [".".join(parts[:d]) for d in range(1, len(parts) + 1)]


def depth_of(path: str) -> int:
    return 0 if path in ("", OUTSIDE) else path.count(".") + 1


def common_module(paths: Iterable[str]) -> str:
    """The innermost module enclosing all `paths` (their longest common dotted prefix)."""
    split = [p.split(".") if p else [] for p in paths]
    if not split:
        return ""
    common: list[str] = []
    for parts in zip(*split, strict=False):
        if any(x != parts[0] for x in parts):
            break
        common.append(parts[0])
    return ".".join(common)


def finding_modules(findings: list[dict[str, Any]], ops: Table) -> None:
    """Adds "module" to each finding: the innermost module enclosing every ops.csv row with the finding's
    op and source line (else every row at its source line); None when no such row ran inside the model."""
    if not has_module_columns(ops):
        for f in findings:
            f["module"] = None
        return
    by_op_line: dict[tuple[str, str], list[str | None]] = {}
    by_line: dict[str, list[str | None]] = {}
    for op, loc, module, cls in zip(ops["op"], filled(ops["source_location"]), filled(ops["module"]),
                                    filled(ops["module_class"]), strict=True):
        inside = module if cls else None
        by_op_line.setdefault((op, loc), []).append(inside)
        by_line.setdefault(loc, []).append(inside)
    for f in findings:
        loc = f.get("source_location") or ""
        found = by_op_line.get((f.get("op") or "", loc)) or (by_line.get(loc) if loc else None) or []
        inside = [m for m in found if m is not None]
        f["module"] = common_module(inside) if inside and len(inside) == len(found) else None


def module_table(ops: Table, findings: list[dict[str, Any]],
                 classes: dict[str, str] | None = None) -> Table | None:
    """modules.csv: one row per module that ran ops (and each module enclosing one), in tree order
    (children by inclusive time, largest first), then OUTSIDE; None when the run has no module paths.
    `classes` (qualified name -> class) names modules that issued no op of their own (a container such as
    a ModuleList, a block whose forward only calls submodules)."""
    if not has_module_columns(ops):
        return None
    time = [float(t) for t in ops["time_us_total"]]
    total = pairwise_sum(time)  # as np.nansum: NaN counts 0, same order
    calls = [float(c) for c in ops["calls"]]
    flops = [float(f) * c for f, c in zip(ops["flops_per_call"], calls, strict=True)]
    nbytes = [float(b) * c for b, c in zip(ops["bytes_per_call"], calls, strict=True)]
    node_time: dict[str, float] = {}
    node_self: dict[str, float] = {}
    node_flops: dict[str, float] = {}
    node_bytes: dict[str, float] = {}
    node_bound: dict[str, dict[str, float]] = {}
    node_class: dict[str, str] = dict(classes or {})
    chains: dict[str, list[str]] = {}  # own node -> it and its enclosing modules (rows share a few modules)
    for k, (module, cls, bound) in enumerate(zip(filled(ops["module"]), filled(ops["module_class"]),
                                                  filled(ops["bound"], "unknown"), strict=True)):
        own = module if cls else OUTSIDE
        if cls:
            node_class.setdefault(module, cls)
        node_self[own] = node_self.get(own, 0.0) + time[k]
        chain = chains.get(own)
        if chain is None:
            chain = chains[own] = parents(module) if cls else [OUTSIDE]
        for node in chain:
            node_time[node] = node_time.get(node, 0.0) + time[k]
            if not math.isnan(flops[k]):
                node_flops[node] = node_flops.get(node, 0.0) + flops[k]
            if not math.isnan(nbytes[k]):
                node_bytes[node] = node_bytes.get(node, 0.0) + nbytes[k]
            shares = node_bound.setdefault(node, {})
            shares[bound] = shares.get(bound, 0.0) + time[k]
    node_findings = dict.fromkeys(node_time, 0)
    for f in findings:
        module = f.get("module")
        for node in (parents(module) if isinstance(module, str) else [OUTSIDE]):
            if node in node_findings:
                node_findings[node] += 1

    children: dict[str, list[str]] = {}
    for node in node_time:
        if node not in ("", OUTSIDE):
            up = node.rsplit(".", 1)[0] if "." in node else ""
            children.setdefault(up, []).append(node)
    order: list[str] = []

    def visit(node: str) -> None:
        order.append(node)
        for child in sorted(children.get(node, []), key=lambda c: (-node_time[c], _natural(c))):
            visit(child)

    if "" in node_time:
        visit("")
    if OUTSIDE in node_time:
        order.append(OUTSIDE)
    rows = []  # modules.csv's rows, in COLUMNS order
    for node in order:
        shares = node_bound[node]
        rows.append({
            "module": node,
            "module_class": node_class.get(node, ""),
            "depth": depth_of(node),
            "time_us_total": node_time[node],
            "time_share": node_time[node] / total if total > 0 else 0.0,
            "self_time_us": node_self.get(node, 0.0),
            "flops_total": node_flops.get(node, math.nan),
            "bytes_total": node_bytes.get(node, math.nan),
            "bound": max(BOUNDS, key=lambda b: (shares.get(b, 0.0), -BOUNDS.index(b))),
            "findings": node_findings[node],
        })
    return {c: [r[c] for r in rows] for c in COLUMNS}


def _natural(name: str) -> list[int | str]:
    """'h.10' after 'h.9': digit runs compare as numbers."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]
