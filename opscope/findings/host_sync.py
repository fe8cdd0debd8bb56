"""host-sync (GPU runs): ops inside the step that make the CPU wait for the GPU: aten::item /
_local_scalar_dense (`.item()`, `if tensor:`, `float(t)`), aten::nonzero (data-dependent shapes,
boolean-mask indexing), aten::is_nonzero / equal, and any op whose kernels include a device-to-host
copy (Memcpy DtoH, e.g. `.cpu()`, `.tolist()`).

One finding per (source line, outermost op); the chain is_nonzero -> item -> _local_scalar_dense counts
once. Saving: the CPU wall time spent in those ops (the CPU is blocked until the GPU drains its queue,
and then the GPU idles until new work is launched); an upper bound on what the step loses, most of it
real when the run is launch-bound.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

from opscope import units
from opscope.findings.base import Context, Finding, rule
from opscope.findings.common import per_step, severity, short
from opscope.findings.tree import col, names, row_ancestors, user_mask

SYNC_OPS = frozenset({"aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero",
                      "aten::equal", "aten::nonzero_numpy", "aten::masked_select", "aten::unique",
                      "aten::_unique2"})
DTOH = "Memcpy DtoH"

SUGGESTIONS = {
    "nonzero": "Avoid data-dependent shapes in the step: use masks (torch.where, multiplication) instead of "
               "boolean indexing / nonzero, or torch.nonzero_static with a fixed size.",
    "copy": "Keep the result on the GPU; copy to the CPU once after the loop (or asynchronously with "
            "non_blocking=True into pinned memory) instead of every step.",
    "item": "Keep the value on the GPU: replace Python `if tensor:` / `.item()` checks with tensor ops "
            "(torch.where, masking), do such checks once outside the step, or only every N steps.",
}


def _kind(names_in_chain: list[str]) -> str:
    if any("nonzero" in n and "is_nonzero" not in n or "masked_select" in n or "unique" in n for n in names_in_chain):
        return "nonzero"
    if any(n in ("aten::item", "aten::_local_scalar_dense", "aten::is_nonzero", "aten::equal") for n in names_in_chain):
        return "item"
    return "copy"


@dataclass
class _Sync:
    """The syncs of one (source line, outermost op)."""

    count: int = 0
    cpu: float = 0.0
    names: set[str] = field(default_factory=set)
    dtoh: bool = False


@rule("host-sync")
def host_sync(ctx: Context) -> Iterator[Finding]:
    if not ctx.gpu:
        return
    nm = names(ctx)
    mask = user_mask(ctx)
    kern = col(ctx, "kernels")
    locs = col(ctx, "source_location")
    dur = col(ctx, "dur")
    tops: dict[int, tuple[list[str], list[bool]]] = {}
    for i, name in enumerate(nm):
        if not mask[i] or not (name in SYNC_OPS or DTOH in kern[i]):
            continue
        chain = row_ancestors(ctx, i)
        inner, dtoh = tops.setdefault(chain[-1] if chain else i, ([], []))
        inner.append(name)
        dtoh.append(DTOH in kern[i])
    groups: dict[tuple[str, str], _Sync] = defaultdict(_Sync)
    for top, (inner, dtoh) in tops.items():
        g = groups[(locs[top], nm[top])]
        g.count += 1
        g.cpu += float(dur[top])
        g.names.update(inner)
        g.names.add(nm[top])
        g.dtoh = g.dtoh or any(dtoh)
    for (loc, op), g in groups.items():
        synced = sorted(g.names)
        kind = _kind(synced)
        message = (f"{short(op)} synchronizes the CPU with the GPU ({', '.join(short(n) for n in synced)}"
                   f"{'; a Memcpy DtoH' if g.dtoh else ''}): {per_step(g.count, ctx):g} per step, the CPU blocked "
                   f"{units.duration(g.cpu)} in all, and the GPU runs dry until new work is launched.")
        yield Finding(rule="host-sync", severity=severity(g.cpu, ctx), op=op, source_location=loc,
                      message=message, suggestion=SUGGESTIONS[kind], est_savings_us=g.cpu)
