"""kernel-copy (a note): torch's own convolution / matmul / attention kernel copies data although the
user's code handed it tensors in a layout it accepts.

Fires for copies classified "internal" (see copies.py: the copy runs inside such an op, and its source
is an input in the op's preferred layout, or an intermediate of the op while every input is in a
preferred layout), e.g. oneDNN's AVX2 convolution_backward moving a channels_last net's weight gradient
through NCHW. Nothing in the user's code causes these copies, so they are never an `implicit-copy` or
`contiguous-call` finding; when they cost at least MIN_SHARE of the run's op time they are worth knowing
about as the op's own cost. One finding per (source line, op, forward/backward), always low severity,
saving unknown (`null`): only a different kernel, layout or machine removes them, and opscope has not
measured those.
"""

from __future__ import annotations

from collections.abc import Iterator

from opscope import units
from opscope.findings.base import Context, Finding, rule
from opscope.findings.common import count_per_step, fmt_shape, share
from opscope.findings.copies import COPY_OPS, copies_of_kind, group, layout_family
from opscope.findings.tree import col, descendants, names

MIN_SHARE = 0.05  # of the run's total op time: below that the kernel's copies are not worth a note

LAYOUTS = {
    "conv": "contiguous (NCHW) or channels_last",
    "matmul": "contiguous or transposed in the last two dims",
    "attention": "dense with the last dim innermost",
}
SUGGESTION = ("Nothing in this line's code causes these copies; they are how this torch build runs the op on "
              "this machine. If the op's time matters, time it in its other accepted layout (a convolution in "
              "NCHW instead of channels_last, or the reverse) on this machine and keep the faster one; another "
              "torch version or CPU/GPU may pick a kernel that does not copy.")


def device_kernels(ctx: Context, op: int) -> list[str]:
    """GPU kernels an op launched itself or through the non-copy ops beneath it (none on CPU runs)."""
    nm, kernels = names(ctx), col(ctx, "kernels")
    found: dict[str, None] = {}
    for j in [op, *descendants(ctx, op)]:
        if nm[j] not in COPY_OPS:
            found.update(dict.fromkeys(k for k in str(kernels[j] or "").split(";") if k))
    return list(found)


@rule("kernel-copy")
def kernel_copy(ctx: Context) -> Iterator[Finding]:
    nm = names(ctx)
    key = lambda c: (c.location, nm[c.owner], c.backward)  # noqa: E731
    for (loc, owner, backward), items in group(copies_of_kind(ctx, "internal"), key).items():
        time = sum(c.time_us for c in items)
        if share(time, ctx) < MIN_SHARE:
            continue
        nbytes = sum(c.bytes for c in items)
        shapes = sorted({fmt_shape(c.src) for c in items})
        on_gpu = device_kernels(ctx, items[0].owner)
        kernel = f" ({', '.join(on_gpu[:2])})" if on_gpu else ""
        where = " in the backward pass of this line" if backward else ""
        message = (f"torch's {owner} kernel{kernel}{where} copies data of its own: {count_per_step(len(items), ctx, 'copy', 'copies')} "
                   f"per step of {'; '.join(shapes[:3])}, {units.nbytes(nbytes)} and {units.duration(time)} in all "
                   f"({share(time, ctx):.0%} of op time). Its inputs are already in a layout it accepts "
                   f"({LAYOUTS[layout_family(owner)]}), so this is the kernel's cost, not a layout problem of "
                   f"this code.")
        yield Finding(rule="kernel-copy", severity="low", op=owner, source_location=loc, message=message,
                      suggestion=SUGGESTION, est_savings_us=None)
