"""Shared pieces of the Triton kernels: launch helpers, the deterministic column sum used by the
backward passes (bias, weight gradients) and by sum/mean over a non-last dim.

Every Triton kernel computes in float32 (float64 for float64 tensors: F64 flag) and stores in the
output's dtype; this is also what lets them run under the Triton interpreter (TRITON_INTERPRET=1),
which has no bfloat16 arithmetic. Blocks are large and fixed, so the interpreter runs few programs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import triton
import triton.language as tl

from reference_kernels import tuning

BLOCK = 1024        # elements per program, elementwise kernels
ROW_BLOCK = 1024    # columns per step, row kernels (rows longer than this loop)
ROWS_PER_CHUNK = 32  # rows per program in backward partial sums (fixed: results do not depend on the grid)
SPLIT_ROWS = 256     # rows per program in column sums (fixed, likewise)
COLUMN_BLOCK = 256   # columns per program in column sums


# A forward's launch options a tuning sets (`opscope kernels --tune --device cuda`, over the manifest's
# [tune.triton] space): BLOCK for element-wise kernels only (a row kernel's BLOCK fixes its order of
# additions, and so its result: not a knob, as the reductions' chunk sizes on the CPU), num_warps and
# num_stages for all (they change the schedule, never a result). Cached under "triton:<function>".
TUNED_PREFIX = "triton:"
_forced: dict[str, int] | None = None  # the configuration a tuner is timing


@contextlib.contextmanager
def forced(config: dict[str, int]) -> Iterator[None]:
    """Within the block every forward launches with `config` (the tuner timing it), not the cached one."""
    global _forced
    before, _forced = _forced, dict(config)
    try:
        yield
    finally:
        _forced = before


def launch_options(kernel: str, fn: str, args: tuple[Any, ...], block: int, block_is_knob: bool) -> dict[str, int]:
    """BLOCK, and num_warps and num_stages where tuned, for one launch of `kernel`'s `fn` on `args`: the
    configuration being timed, else the tuned one of these arguments' class, else the defaults (BLOCK as
    given, Triton's own num_warps and num_stages)."""
    values = _forced if _forced is not None else tuning.lookup(kernel, TUNED_PREFIX + fn, args) or {}
    out = {"BLOCK": int(values.get("block") or block) if block_is_knob else block}
    for name in ("num_warps", "num_stages"):
        if values.get(name):
            out[name] = int(values[name])
    return out


def is_f64(t: torch.Tensor) -> bool:
    return t.dtype == torch.float64


def acc_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if is_f64(t) else torch.float32


def row_block(n: int) -> int:
    return min(ROW_BLOCK, triton.next_power_of_2(max(n, 1)))


@triton.jit
def column_sum_kernel(x_ptr, out_ptr, R, K0, stride_k1, stride_r, scale, SPLITS, ROWS: tl.constexpr,
                      BLOCK_C: tl.constexpr, F64: tl.constexpr):
    """out[k1 * SPLITS + s, c] = scale * sum of x[k1 * stride_k1 + r * stride_r + c] over the rows r of
    split s (rows s * ROWS up to ROWS of them), one program per (k1, column block, split), rows added in
    order. The loop's bound is constexpr, so it is the same loop compiled and interpreted."""
    k1 = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    split = tl.program_id(2)
    m = cols < K0
    if F64:
        acc = tl.zeros([BLOCK_C], dtype=tl.float64)
    else:
        acc = tl.zeros([BLOCK_C], dtype=tl.float32)
    base = x_ptr + k1 * stride_k1
    for i in range(0, ROWS):
        r = split * ROWS + i
        v = tl.load(base + r * stride_r + cols, mask=m & (r < R), other=0.0)
        if F64:
            acc += v.to(tl.float64)
        else:
            acc += v.to(tl.float32)
    tl.store(out_ptr + (k1 * SPLITS + split) * K0 + cols, (acc * scale).to(out_ptr.dtype.element_ty), mask=m)


def column_sum(x: torch.Tensor, out_dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """Sum a contiguous [K1, R, K0] (or [R, K0]) tensor over R: returns [K1, K0] (or [K0]).

    A split reduction: rows are summed in splits of SPLIT_ROWS, one program per (k1, column block,
    split), into float32/float64 partials, which are then summed over the splits the same way; one
    program walking a whole column (the first version) left an H200 with 4 programs for 4096x4096. The
    split size is fixed, so the order of additions, and the result, do not depend on the GPU."""
    x3 = x if x.dim() == 3 else x.unsqueeze(0)
    k1, r, k0 = x3.shape
    splits = triton.cdiv(r, SPLIT_ROWS)
    final = splits <= 1
    out = torch.empty((k1 * max(splits, 1), k0), dtype=out_dtype if final else acc_dtype(x), device=x.device)
    if out.numel():
        block = min(COLUMN_BLOCK, triton.next_power_of_2(max(k0, 1)))
        rows = min(SPLIT_ROWS, triton.next_power_of_2(max(r, 1)))
        column_sum_kernel[(k1, triton.cdiv(k0, block), max(splits, 1))](
            x3, out, r, k0, r * k0, k0, scale if final else 1.0, max(splits, 1), ROWS=rows, BLOCK_C=block,
            F64=is_f64(x))
    if not final:
        out = column_sum(out.view(k1, splits, k0), out_dtype, scale)
    return out if x.dim() == 3 else out[0]
