"""implicit-copy: an op copied its input because the input was not contiguous.

Fires for every copy classified "implicit" (see copies.py): a clone/contiguous/copy_ beneath a
reshape-like or compute op whose source is a non-contiguous, non-broadcast view and whose destination is
dense. One finding per (source line, op, forward/backward); a copy made in the backward pass points at
the forward line it differentiates. Saving: the copies' own time (they vanish when the producer
hands over the layout the consumer wants). Groups under MIN_SHARE of the run's op time are dropped.
"""

from __future__ import annotations

from collections.abc import Iterator

from opscope import units
from opscope.findings.base import Context, Finding, rule
from opscope.findings.common import base_name, count_per_step, fmt_shape, per_step, severity, share
from opscope.findings.copies import RESHAPE_LIKE, copies_of_kind, group

MIN_SHARE = 0.001  # of the run's total op time

# (op base names, suggestion): the first entry whose names contain the copying op's base name wins.
SUGGESTIONS: list[tuple[frozenset[str], str]] = [
    (RESHAPE_LIKE,
     "reshape/flatten of a transposed, permuted or sliced tensor cannot be a view, so it copies. Produce the "
     "layout the consumer needs directly (e.g. split heads as [b, t, h, d] and hand the strided "
     "[b, h, t, d] view to F.scaled_dot_product_attention or torch.matmul, which take strided inputs), or "
     "reorder the code so the transpose happens on the smaller tensor."),
    (frozenset({"matmul", "mm", "bmm", "linear", "einsum", "addmm", "baddbmm", "tensordot"}),
     "The matmul could not use a strided operand as is and copied it. Keep that operand contiguous "
     "(or transposed only in its last two dims, which BLAS handles without a copy)."),
    (frozenset({"layer_norm", "native_layer_norm", "group_norm", "native_group_norm", "batch_norm",
                "native_batch_norm", "softmax", "_softmax", "log_softmax", "_log_softmax", "rms_norm"}),
     "This kernel needs a contiguous input and copied it. Normalize before the transpose/permute, or "
     "keep the tensor in the layout the kernel reads."),
]
DEFAULT_SUGGESTION = ("The op needed a contiguous input and copied it. Keep the producer's output in the layout "
                      "this op wants (avoid the transpose/permute/slice in front of it), or move the layout change "
                      "to where the tensor is smallest.")


def suggestion_for(*ops: str) -> str:
    """The suggestion for the first of `ops` (outermost first) that the table knows."""
    for op in ops:
        base = base_name(op) if "::" in op else op
        hit = next((text for names, text in SUGGESTIONS if base in names), None)
        if hit is not None:
            return hit
    return DEFAULT_SUGGESTION


@rule("implicit-copy")
def implicit_copy(ctx: Context) -> Iterator[Finding]:
    copies = copies_of_kind(ctx, "implicit")
    key = lambda c: (c.location, c.parent_name, c.top_name, c.backward)  # noqa: E731
    for (loc, parent, top, backward), items in group(copies, key).items():
        time = sum(c.time_us for c in items)
        if share(time, ctx) < MIN_SHARE:
            continue
        nbytes = sum(c.bytes for c in items)
        biggest = max(items, key=lambda c: c.bytes)
        calls = len(items)
        what = parent or "an op"
        inside = f" (inside {top})" if top and top != parent else ""
        where = " in the backward pass of this line" if backward else ""
        message = (f"{what}{inside}{where} copied its non-contiguous input {fmt_shape(biggest.src)} into a new contiguous "
                   f"tensor: {units.nbytes(biggest.bytes)} moved per copy, {count_per_step(calls, ctx, 'copy', 'copies')} per step, "
                   f"{units.nbytes(nbytes)} and {units.duration(time)} in all ({units.duration(per_step(time, ctx))} per step).")
        yield Finding(rule="implicit-copy", severity=severity(time, ctx), op=what, source_location=loc,
                      message=message, suggestion=suggestion_for(top, what), est_savings_us=time)
