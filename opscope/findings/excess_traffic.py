"""excess-traffic (runs with Nsight Compute measurements): an op whose kernels moved far more DRAM
bytes than the op's modeled minimum traffic.

Per ops.csv row with `measured_dram_bytes_per_call` (opscope.nsight.measured): measured DRAM bytes per
call > EXCESS_RATIO x `bytes_per_call` (each input read once, each output written once) and at least
MIN_EXCESS_BYTES more. The extra traffic is poor reuse (inputs re-read because they do not stay in L2),
uncoalesced or strided access (whole sectors fetched for a few useful bytes), or spills; or the cost model
under-counts this op. Names the op, its line and the kernel with the most DRAM traffic.

Saving: when the kernels are DRAM-bound in practice (DRAM throughput at >= DRAM_BOUND_PCT % of its peak),
the time they would take moving only the minimum at the same bandwidth is saved:
time x (1 - modeled / measured). Otherwise null: less traffic may not make a kernel faster that is
limited by something else.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from opscope import units
from opscope.findings.base import Context, Finding, rule
from opscope.findings.common import count_per_step, severity, share, short
from opscope.findings.tree import ops_rows

EXCESS_RATIO = 2.0
MIN_EXCESS_BYTES = 1 << 20  # per call: a few hundred KB of sector overfetch is not worth a finding
DRAM_BOUND_PCT = 50.0

SUGGESTION = ("Find where the extra DRAM traffic comes from in the kernel's Memory Workload Analysis "
              "(ncu --set full): re-reads of an input that does not stay in L2 (tile the work or fuse the "
              "consumer so the data is used while it is cached), uncoalesced or strided access (make the "
              "dimension the kernel walks contiguous, e.g. .contiguous() where the tensor is produced, or "
              "channels_last for convolutions), or register spills. If the kernel does only what the op "
              "must, the cost model under-counts this op: the ratio is its error.")


def _num(value: object) -> float:
    """The value as a finite float, else NaN (comparisons with NaN are false: the row is skipped)."""
    x = units.number(value)
    return math.nan if x is None else x


@rule("excess-traffic")
def excess_traffic(ctx: Context) -> Iterator[Finding]:
    if "measured_dram_bytes_per_call" not in ctx.ops:
        return
    for row in ops_rows(ctx):
        measured = _num(row.get("measured_dram_bytes_per_call"))
        modeled = _num(row.get("bytes_per_call"))
        if not (modeled > 0 and measured > EXCESS_RATIO * modeled and measured - modeled >= MIN_EXCESS_BYTES):
            continue
        ratio = measured / modeled
        time, calls = float(row["time_us_total"]), int(row["calls"])
        dram_pct = _num(row.get("measured_dram_pct_peak"))
        saving = time * (1.0 - modeled / measured) if dram_pct >= DRAM_BOUND_PCT and time > 0 else None
        kernels = [k for k in str(row.get("measured_kernels") or "").split(";") if k]
        kernel = kernels[0] if kernels else "its kernels"
        location = row["source_location"] if isinstance(row.get("source_location"), str) else ""
        where = location or "an unknown line"
        sol = f" at {dram_pct:.0f}% of DRAM peak" if math.isfinite(dram_pct) else ""
        why = ("DRAM-bound, so moving only the minimum would save about "
               f"{units.duration(saving)}" if saving is not None else
               f"not DRAM-bound (under {DRAM_BOUND_PCT:.0f}% of DRAM peak), so less traffic may not make it faster")
        message = (f"{short(row['op'])} {row['input_dims']} at {where}: kernel {kernel} moved {units.nbytes(measured)} of "
                   f"DRAM traffic per call (Nsight Compute){sol}, {ratio:.1f}x the modeled minimum "
                   f"{units.nbytes(modeled)} ({count_per_step(calls, ctx, 'call')} per step, {units.duration(time)} in all, "
                   f"{share(time, ctx):.0%} of op time); {why}.")
        yield Finding(rule="excess-traffic", severity=severity(saving, ctx), op=row["op"],
                      source_location=location,
                      message=message, suggestion=SUGGESTION, est_savings_us=saving)

