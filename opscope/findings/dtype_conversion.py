"""dtype-conversion: `.to(dtype)` / `.float()` / `.half()` conversions and host<->device copies of
non-scalar tensors inside the profiled step.

Fires for copies classified "conversion" (see copies.py): a copy chain (aten::to -> _to_copy -> copy_,
or a bare copy_) whose destination dtype differs from its source's, or which launched a Memcpy HtoD/DtoH
(GPU traces). Tensors of one element are ignored. One finding per (source line, from -> to). Saving: the
conversions' time (they vanish when the tensor is kept in one dtype / on one device). Lines under
MIN_SHARE of the run's op time are dropped.
"""

from __future__ import annotations

from collections.abc import Iterator

from opscope import units
from opscope.findings.base import Context, Finding, rule
from opscope.findings.common import count_per_step, fmt_shape, per_step, severity, share
from opscope.findings.copies import Copy, copies_of_kind, group

MIN_SHARE = 0.001

DTYPE_SUGGESTION = ("Keep the tensor in one dtype: create it in the dtype it is used in, convert weights and "
                    "buffers once outside the step (model.to(dtype)), and let torch.autocast handle mixed "
                    "precision instead of converting by hand on every step.")
DEVICE_SUGGESTION = ("Move data to the device once, outside the step (or prefetch with pin_memory=True and "
                     "non_blocking=True); keep results on the device instead of copying them back every step.")


def _label(c: Copy) -> str:
    parts = []
    if c.dtype_change and c.dst is not None and c.src is not None:
        parts.append(f"{c.src.dtype_name} -> {c.dst.dtype_name}")
    if c.device_move:
        parts.append(f"device copy {c.device_move}")
    return ", ".join(parts)


@rule("dtype-conversion")
def dtype_conversion(ctx: Context) -> Iterator[Finding]:
    # A plain device-to-host copy blocks the CPU: host-sync reports it.
    conversions = [c for c in copies_of_kind(ctx, "conversion") if c.dtype_change or c.device_move != "DtoH"]
    for (loc, label), items in group(conversions, lambda c: (c.location, _label(c))).items():
        time = sum(c.time_us for c in items)
        if share(time, ctx) < MIN_SHARE:
            continue
        nbytes = sum(c.bytes for c in items)
        biggest = max(items, key=lambda c: c.bytes)
        kind = "device copy" if not biggest.dtype_change else "dtype conversion"
        message = (f"{kind} ({label}) of {fmt_shape(biggest.src)} inside the step: {units.nbytes(biggest.bytes)} "
                   f"moved per call, {count_per_step(len(items), ctx, 'call')} per step, {units.nbytes(nbytes)} and "
                   f"{units.duration(time)} in all ({units.duration(per_step(time, ctx))} per step).")
        suggestion = DTYPE_SUGGESTION if biggest.dtype_change else DEVICE_SUGGESTION
        op = ctx.events["name"][biggest.root]
        yield Finding(rule="dtype-conversion", severity=severity(time, ctx), op=op, source_location=loc,
                      message=message, suggestion=suggestion, est_savings_us=time)
