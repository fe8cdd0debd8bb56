"""gemm-alignment (GPU runs): float16/bfloat16 GEMMs against a weight whose N (output features) or K
(input features) is not a multiple of ALIGN (8), so tensor-core kernels must fall back to narrower,
slower memory accesses (cuBLAS/CUTLASS pick "align2"/"align1" kernels).

Considers forward mm/addmm/_addmm_activation calls (the second operand is 2-D: a weight, as nn.Linear
issues), user code only, grouped per ops.csv row. Saving: the GEMM's time minus the time its padded
size (N, K rounded up to 8) would take at the FLOP-weighted achieved rate of this run's aligned GEMMs of
the same dtype, when that is positive; otherwise unknown (null), and the severity follows the GEMM's
share of op time (>= 10 % medium, else low).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from opscope import units
from opscope.findings.base import Context, Finding, rule
from opscope.findings.common import count_per_step, severity, share
from opscope.findings.layout import tensor
from opscope.findings.tree import col, events_by_ops_row, ops_rows

ALIGN = 8
HALF = ("float16", "bfloat16")
OPERANDS = {"aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::addmm_": (1, 2), "aten::_addmm_activation": (1, 2)}
NARROW_KERNEL_TAGS = ("align1", "align2", "align4")

SUGGESTION = ("Pad the dimension to a multiple of 8 (64 is better): e.g. a vocabulary of 30522 -> 30528 "
              "(transformers: model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=64)), hidden and "
              "intermediate sizes to multiples of 64; slice the padded logits if needed.")


def gemm_dims(ctx: Context, i: int, name: str) -> tuple[int, int, int, str] | None:
    """(M, N, K, dtype name) of a 2-D GEMM event, or None."""
    a_i, b_i = OPERANDS[name]
    a, b = tensor(ctx, i, a_i), tensor(ctx, i, b_i)
    if a is None or b is None or a.ndim != 2 or b.ndim != 2:
        return None
    return a.shape[0], b.shape[1], a.shape[1], a.dtype_name


@rule("gemm-alignment")
def gemm_alignment(ctx: Context) -> Iterator[Finding]:
    if not ctx.gpu:
        return
    bwd = col(ctx, "bwd_root")
    aligned_rate: dict[str, list[float]] = {}
    candidates = []
    for r, evs in events_by_ops_row(ctx).items():
        row = ops_rows(ctx)[r]
        name = row["op"]
        if name not in OPERANDS or bwd[evs[0]] >= 0:
            continue
        dims = gemm_dims(ctx, evs[0], name)
        if dims is None or dims[3] not in HALF:
            continue
        m, n, k, dt = dims
        time, calls = float(row["time_us_total"]), int(row["calls"])
        if n % ALIGN or k % ALIGN:
            candidates.append((row, dims, time, calls))
        elif time > 0:
            acc = aligned_rate.setdefault(dt, [0.0, 0.0])
            acc[0] += 2.0 * m * n * k * calls
            acc[1] += time
    for row, (m, n, k, dt), time, calls in candidates:
        bad = [f"{label} = {v}" for label, v in (("N (output features)", n), ("K (input features)", k)) if v % ALIGN]
        saving = None
        ref = aligned_rate.get(dt)
        if ref and ref[1] > 0:
            rate = ref[0] / ref[1]  # FLOP per µs
            padded = 2.0 * m * (math.ceil(n / ALIGN) * ALIGN) * (math.ceil(k / ALIGN) * ALIGN) * calls
            est = time - padded / rate
            saving = est if est > 0 else None
        kernels = str(row.get("kernels", "") or "")
        narrow = next((t for t in NARROW_KERNEL_TAGS if t in kernels), "")
        note = f" The kernel used is an {narrow} variant." if narrow else ""
        sev = severity(saving, ctx) if saving is not None else ("medium" if share(time, ctx) >= 0.10 else "low")
        message = (f"{dt} GEMM [{m} x {k}] @ [{k} x {n}] has {' and '.join(bad)}, not a multiple of {ALIGN}: "
                   f"tensor-core kernels need aligned dims.{note} It took {units.duration(time)} "
                   f"({count_per_step(calls, ctx, 'call')} per step, {share(time, ctx):.0%} of op time)"
                   + ("." if saving is not None else "; saving not estimated (no comparable aligned GEMM in the run)."))
        yield Finding(rule="gemm-alignment", severity=sev, op=row["op"], source_location=row["source_location"],
                      message=message, suggestion=SUGGESTION, est_savings_us=saving)
