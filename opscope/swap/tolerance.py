"""Comparing a swapped model's tensors with the original's: the tolerance per dtype, one tensor, a group of
named tensors (one check), and bitwise equality."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Tol:
    rtol: float
    atol: float  # times the reference tensor's RMS


MODEL_TOLERANCE = {
    torch.float32: Tol(2e-4, 2e-5),
    torch.float64: Tol(1e-9, 1e-10),
    torch.bfloat16: Tol(3.2e-2, 2e-2),
    torch.float16: Tol(4e-3, 2e-3),
}


def tolerance_for(dtype: torch.dtype, manifests: list[Any]) -> Tol:
    base = MODEL_TOLERANCE.get(dtype, MODEL_TOLERANCE[torch.float32])
    rtol, atol = base.rtol, base.atol
    name = str(dtype).removeprefix("torch.")
    for m in manifests:
        t = m.tolerance.get(name)
        if t is not None:
            rtol, atol = max(rtol, t.rtol), max(atol, t.atol)
    return Tol(rtol, atol)


@dataclass
class Check:
    """One row of the verification table."""

    check: str
    passed: bool
    seed: int | None = None
    tensors: int = 0
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    out_of_tolerance: float | None = None  # share of compared elements
    worst: str = ""   # the tensor (or kernel call) the numbers or the failure are about
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass
class TensorDiff:
    max_abs: float = 0.0
    max_rel: float = 0.0
    out: int = 0
    n: int = 0
    problem: str = ""


def compare_tensor(got: Any, want: torch.Tensor, tol: Tol) -> TensorDiff:
    from reference_kernels.testing import check_not_degenerate

    if not isinstance(got, torch.Tensor):
        return TensorDiff(problem="missing (None)" if got is None else f"not a tensor ({type(got).__name__})")
    if tuple(got.shape) != tuple(want.shape):
        return TensorDiff(problem=f"shape {list(got.shape)}, the original's is {list(want.shape)}")
    if got.dtype != want.dtype:
        return TensorDiff(problem=f"dtype {str(got.dtype).removeprefix('torch.')}, the original's is "
                                  f"{str(want.dtype).removeprefix('torch.')}")
    if got.device != want.device:
        return TensorDiff(problem=f"on {got.device}, the original's is on {want.device}")
    g = got.detach().to(torch.float64)
    w = want.detach().to(torch.float64)
    n = w.numel()
    if n == 0:
        return TensorDiff()
    both_nan = torch.isnan(g) & torch.isnan(w)
    same_inf = torch.isinf(w) & (g == w)
    finite_w = torch.isfinite(w)
    rms = float(torch.sqrt(torch.mean(torch.where(finite_w, w, 0.0) ** 2)))
    diff = torch.where(both_nan | same_inf, 0.0, (g - w).abs())
    diff = torch.nan_to_num(diff, nan=math.inf)
    bound = tol.rtol * w.abs() + tol.atol * (rms if rms > 0 else 1.0)
    out = int((diff > torch.nan_to_num(bound, nan=0.0, posinf=math.inf)).sum())
    max_abs = float(diff.max())
    scale = float(w[finite_w].abs().max()) if bool(finite_w.any()) else 0.0
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
    try:
        check_not_degenerate(g, w, "")
    except AssertionError as exc:
        return TensorDiff(max_abs=max_abs, max_rel=max_rel, n=n, out=n, problem=str(exc).removeprefix(": "))
    return TensorDiff(max_abs=max_abs, max_rel=max_rel, out=out, n=n)


def compare_group(name: str, seed: int | None, got: dict[str, Any], want: dict[str, torch.Tensor],
                  tol_of: Callable[[torch.dtype], Tol]) -> Check | None:
    """One check over a group of named tensors (outputs, input gradients, parameter gradients)."""
    if not want and not got:
        return None
    check = Check(check=name, passed=True, seed=seed)
    worst_score = -1.0
    total_out = total_n = 0
    problems: list[str] = []
    for key in dict.fromkeys([*want, *got]):
        if key not in want:
            if got[key] is not None:
                check.passed = False
                check.worst = check.worst or key
                problems.append(f"{key}: the swapped model has it, the original does not")
            continue
        check.tensors += 1
        d = compare_tensor(got.get(key), want[key], tol_of(want[key].dtype))
        total_out, total_n = total_out + d.out, total_n + d.n
        check.max_abs_err = max(check.max_abs_err or 0.0, d.max_abs)
        check.max_rel_err = max(check.max_rel_err or 0.0, d.max_rel)
        if d.problem or d.out:
            if check.passed:  # the first failing tensor names the row
                check.worst = key
            problems.append(f"{key}: {d.problem}" if d.problem else f"{key}: {d.out} of {d.n} elements out of tolerance")
            check.passed = False
        elif check.passed and d.max_rel > worst_score:
            worst_score, check.worst = d.max_rel, key
    check.out_of_tolerance = total_out / total_n if total_n else 0.0
    if problems:
        more = f"; {len(problems) - 3} more" if len(problems) > 3 else ""
        check.detail = "; ".join(problems[:3]) + more
    return check


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    return bool(torch.equal(a, b))
