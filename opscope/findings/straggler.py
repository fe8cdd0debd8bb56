"""straggler (merged runs of multi-process jobs): one rank computes longer per step than the others. In a
synchronous job (DDP, FSDP, tensor parallelism) every other rank then waits for it inside collectives
each step, so the whole job runs at the slowest rank's pace.

Reads the merged run's ranks.csv (Context.ranks; None for a one-process run, where this never fires); a
value that is not a finite number (opscope.units.number) counts as missing.
Fires when the slowest rank's compute time per step (compute_time_us, opscope.analysis.ranks) is at
least MIN_EXCESS above the median rank's. Saving, an upper bound: the excess over the median, in every
step of every rank (each waits that long for the straggler); a merged run counts rank-steps, so that is
steps x (slowest - median), and per step the excess itself.
"""

from __future__ import annotations

from collections.abc import Iterator

from opscope import units
from opscope.findings.base import Context, Finding, rule
from opscope.findings.common import severity
from opscope.table import median, nrows

MIN_EXCESS = 0.10  # below this, two ranks' compute times differ by run-to-run noise

SUGGESTION = ("Find what differs on that rank: compare its ops with another rank's (`opscope compare RUN/ranks/0 "
              "RUN/ranks/N`). Usual causes: uneven work (sequence lengths or batch sizes that differ per rank: "
              "bucket or balance the samples), a slower or throttled device (clocks, temperature, a shared GPU), "
              "other processes on its CPU cores, or work only that rank does (logging, evaluation, checkpoints "
              "on rank 0: move them off the step or spread them).")


@rule("straggler")
def straggler(ctx: Context) -> Iterator[Finding]:
    ranks = ctx.ranks
    if ranks is None or nrows(ranks) < 2 or "compute_time_us" not in ranks:
        return
    compute = [units.number(v) for v in ranks["compute_time_us"]]
    known = [c for c in compute if c is not None]
    if len(known) < 2:
        return
    mid = median(known)
    slowest = max(known)
    i = compute.index(slowest)  # the first rank with the most compute
    if mid <= 0 or (slowest - mid) / mid < MIN_EXCESS:
        return
    rank = int(ranks["rank"][i])
    excess = slowest - mid
    waits = [w for j, v in enumerate(ranks.get("collective_time_us", [])) if j != i and (w := units.number(v)) is not None]
    others = nrows(ranks) - 1
    low, high = (units.duration(min(waits)), units.duration(max(waits))) if waits else ("", "")
    spent = low if low == high else f"{low} to {high}"
    wait_text = (f"; {'it spends' if others == 1 else 'they spend'} {spent} per step in collectives"
                 if waits and max(waits) > 0 else "")
    saving = excess * max(ctx.steps, 1)
    message = (f"rank {rank} computes {units.duration(slowest)} per step, {excess / mid:.0%} more than the median rank "
               f"({units.duration(mid)}; fastest {units.duration(min(known))}): in a synchronous job "
               f"{'the other rank waits' if others == 1 else f'the other {others} ranks wait'} for it every "
               f"step{wait_text}. As fast as the median, every rank's step would be up to {units.duration(excess)} "
               "shorter (an upper bound).")
    yield Finding(rule="straggler", severity=severity(saving, ctx), op="", source_location="", message=message,
                  suggestion=SUGGESTION, est_savings_us=saving)
