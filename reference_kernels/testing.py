"""Checks shared by the kernel tests (and meant for `opscope swap`'s verification): compare a kernel's
result with a higher-precision reference under the manifest's per-dtype tolerance, after a guard that
fails degenerate results a loose tolerance could let through (all zeros, NaN/Inf where the reference is
finite, a constant where the reference varies)."""

from __future__ import annotations

from typing import Any

import torch

from reference_kernels.manifest import KernelManifest, Tolerance

_NAMES = {torch.float32: "float32", torch.float64: "float64", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def dtype_name(dtype: torch.dtype) -> str:
    return _NAMES[dtype]


def reference_dtype(dtype: torch.dtype) -> torch.dtype:
    """The precision the reference is computed in: float64 for float32/float64, float32 for the half
    types (which is also how PyTorch computes them, so the only difference left is the final rounding)."""
    return torch.float64 if dtype in (torch.float32, torch.float64) else torch.float32


def to_reference(value: Any, dtype: torch.dtype, requires_grad: bool = False) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.detach().to(reference_dtype(dtype)).requires_grad_(requires_grad)
    return value


def tolerance(manifest: KernelManifest, dtype: torch.dtype) -> Tolerance:
    return manifest.tolerance[dtype_name(dtype)]


# float32 gradients are checked to GRAD_ULPS float32 ulps of the gradient's own scale (its largest
# magnitude), when that is looser than the manifest's atol. Why: a gradient element is a sum, over the
# reduced rows, of terms as large as the gradient's scale, each computed in float32 (on a GPU with fast-math
# erf/exp, a few ulps off) and summed in another order than the float64 reference, so its rounding error is
# a few ulps of the terms' size, not of the element's own value (an element near 0 by cancellation keeps
# its terms' error). The H200 measured 4e-6 on a bias_gelu bias gradient of scale ~3: ~11 ulps of it.
GRAD_ULPS = 32


def gradient_tolerance(tol: Tolerance, expected: torch.Tensor, dtype: torch.dtype) -> Tolerance:
    """The tolerance for a gradient of a `dtype` kernel against its reference `expected`: the manifest's,
    with atol raised to GRAD_ULPS float32 ulps of max |expected| in float32 (the half types' manifest
    tolerances are already coarser than their rounding)."""
    if dtype != torch.float32 or not expected.numel():
        return tol
    scale = float(expected.detach().abs().max())
    return Tolerance(rtol=tol.rtol, atol=max(tol.atol, GRAD_ULPS * torch.finfo(torch.float32).eps * scale))


def check_not_degenerate(actual: torch.Tensor, expected: torch.Tensor, what: str = "result") -> None:
    a, e = actual.detach().double(), expected.detach().double()
    finite = torch.isfinite(e)
    if not torch.isfinite(a[finite]).all():
        raise AssertionError(f"{what}: NaN or Inf where the reference is finite")
    if e.numel() and (e != 0).any() and not (a != 0).any():
        raise AssertionError(f"{what}: all zeros, the reference is not")
    ef, af = e[finite], a[finite]
    if ef.numel() > 1 and ef.max() != ef.min() and af.max() == af.min():
        raise AssertionError(f"{what}: constant, the reference varies")


def assert_matches(actual: torch.Tensor, expected: torch.Tensor, tol: Tolerance, what: str = "result") -> None:
    """Shape and dtype as the reference's tensor would have them, no degenerate output, then
    |actual - expected| <= atol + rtol * |expected| elementwise (compared in float64)."""
    if tuple(actual.shape) != tuple(expected.shape):
        raise AssertionError(f"{what}: shape {list(actual.shape)}, expected {list(expected.shape)}")
    check_not_degenerate(actual, expected, what)
    torch.testing.assert_close(actual.detach().double(), expected.detach().double(), rtol=tol.rtol,
                               atol=tol.atol, equal_nan=True, msg=lambda m: f"{what}: {m}")
