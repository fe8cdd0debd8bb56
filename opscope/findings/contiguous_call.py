"""contiguous-call: an explicit `.contiguous()` in the forward code that really copied.

Fires for copies classified "contiguous" (see copies.py): an aten::contiguous issued directly by the
user's code (no op above it, not in backward) with a copy beneath it (a `.contiguous()` on an already
dense tensor is free and not even recorded). One finding per source line. Saving: the copies' time, an
upper bound: if the next op needs a dense input it will copy instead (then `implicit-copy` reports it).
Lines under MIN_SHARE of the run's op time are dropped.
"""

from __future__ import annotations

from collections.abc import Iterator

from opscope import units
from opscope.findings.base import Context, Finding, rule
from opscope.findings.common import count_per_step, fmt_shape, per_step, severity, share
from opscope.findings.copies import copies_of_kind, group

MIN_SHARE = 0.001

SUGGESTION = ("Remove the .contiguous() if the next op accepts strided input (element-wise ops, reductions, "
              "torch.matmul when only the last two dims are transposed, F.scaled_dot_product_attention all do). "
              "If a dense tensor is really needed, create it in that layout upstream (e.g. transpose the weight "
              "once instead of the activation every step). The saving is an upper bound: a consumer that needs "
              "a dense input would copy by itself.")


@rule("contiguous-call")
def contiguous_call(ctx: Context) -> Iterator[Finding]:
    for loc, items in group(copies_of_kind(ctx, "contiguous"), lambda c: c.location).items():
        time = sum(c.time_us for c in items)
        if share(time, ctx) < MIN_SHARE:
            continue
        nbytes = sum(c.bytes for c in items)
        biggest = max(items, key=lambda c: c.bytes)
        message = (f".contiguous() copied {fmt_shape(biggest.src)} ({units.nbytes(biggest.bytes)} moved per call, "
                   f"{count_per_step(len(items), ctx, 'call')} per step): {units.nbytes(nbytes)} and {units.duration(time)} in all "
                   f"({units.duration(per_step(time, ctx))} per step).")
        yield Finding(rule="contiguous-call", severity=severity(time, ctx), op="aten::contiguous",
                      source_location=loc, message=message, suggestion=SUGGESTION, est_savings_us=time)
