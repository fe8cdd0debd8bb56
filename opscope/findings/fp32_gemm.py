"""fp32-gemm (GPU runs): float32 matmuls/convolutions running on the plain FP32 units although TF32
(or bf16/fp16) would use tensor cores.

Per ops.csv row (user code): family matmul or conv, dtype float32, and no kernel name showing TF32 math
(tf32 / xf32 / s1688 tags, see opscope.machine.peaks). Saving: the op assumed to keep its fraction of peak
when the peak becomes the TF32 one: time x (1 - peak_fp32 / peak_tf32), but never below the
op's bytes at peak bandwidth; unknown (null) when the device's TF32 peak is unknown.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

from opscope import units
from opscope.findings.base import Context, Finding, rule
from opscope.findings.common import count_per_step, ideal_memory_us, severity, share
from opscope.findings.tree import events_by_ops_row, ops_rows

TF32_KERNEL = re.compile(r"tf32|xf32|tensorop_s1688|s1688gemm", re.IGNORECASE)
FAMILIES = ("matmul", "conv")

SUGGESTION = ("Allow TF32 for float32 matmuls: torch.set_float32_matmul_precision('high') (and "
              "torch.backends.cudnn.allow_tf32 = True for convolutions, the default), or run the model in "
              "bfloat16 with torch.autocast(device_type='cuda', dtype=torch.bfloat16).")


@rule("fp32-gemm")
def fp32_gemm(ctx: Context) -> Iterator[Finding]:
    if not ctx.gpu:
        return
    p32 = ctx.peaks.flops_gflops.get("float32")
    ptf = ctx.peaks.flops_gflops.get("tfloat32")
    for r in events_by_ops_row(ctx):
        row = ops_rows(ctx)[r]
        if row["family"] not in FAMILIES or row["dtype"] != "float32":
            continue
        kernels = str(row.get("kernels", "") or "")
        time, calls = float(row["time_us_total"]), int(row["calls"])
        if not kernels or TF32_KERNEL.search(kernels) or time <= 0:
            continue
        saving = None
        if p32 and ptf and ptf > p32:
            floor = ideal_memory_us(float(row["bytes_per_call"]), ctx) or 0.0
            new = max(time * p32 / ptf, calls * (floor if math.isfinite(floor) else 0.0))
            saving = max(time - new, 0.0)
        extra = (f"; with TF32 ({units.gflops(ptf)} vs {units.gflops(p32)} peak) it would take about "
                 f"{units.duration(time - saving)}"
                 if saving is not None else "")
        message = (f"float32 {row['family']} {row['op']} {row['input_dims']} runs without tensor cores (kernels: no "
                   f"TF32): {units.duration(time)} in all, {count_per_step(calls, ctx, 'call')} per step, {share(time, ctx):.0%} of "
                   f"op time{extra}.")
        yield Finding(rule="fp32-gemm", severity=severity(saving, ctx), op=row["op"],
                      source_location=row["source_location"], message=message, suggestion=SUGGESTION,
                      est_savings_us=saving)
