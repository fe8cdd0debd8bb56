"""The float32 gradient tolerance (reference_kernels.testing.gradient_tolerance) on the H200's numbers:
bias_gelu's bias gradient was 4e-6 off on an element of a gradient of scale ~3, against atol 1e-6."""

from __future__ import annotations

import pytest
import torch

from kernels_helpers import MANIFESTS
from reference_kernels.testing import GRAD_ULPS, assert_matches, gradient_tolerance, tolerance


def _h200_case() -> tuple[torch.Tensor, torch.Tensor]:
    expected = torch.linspace(-3.0, 2.5, 40, dtype=torch.float64)
    expected[6] = 0.1048  # an element near 0 by cancellation of larger terms
    actual = expected.clone()
    actual[6] += 3.98e-6
    return actual, expected


def test_the_h200_bias_gelu_gradient_passes_at_its_scale() -> None:
    tol = tolerance(MANIFESTS["bias_gelu"], torch.float32)
    actual, expected = _h200_case()
    with pytest.raises(AssertionError):
        assert_matches(actual, expected, tol, "grad")  # the manifest's atol alone: the H200 failure
    assert_matches(actual, expected, gradient_tolerance(tol, expected, torch.float32), "grad")


def test_the_gradient_tolerance_still_catches_a_wrong_gradient() -> None:
    tol = tolerance(MANIFESTS["bias_gelu"], torch.float32)
    actual, expected = _h200_case()
    grad_tol = gradient_tolerance(tol, expected, torch.float32)
    assert grad_tol.atol == pytest.approx(GRAD_ULPS * torch.finfo(torch.float32).eps * 3.0)
    actual[6] += 1e-4  # ~280 ulps of the gradient's scale
    with pytest.raises(AssertionError):
        assert_matches(actual, expected, grad_tol, "grad")


def test_only_float32_gradients_get_the_scaled_atol() -> None:
    expected = torch.full((4,), 3.0)
    for dtype in (torch.bfloat16, torch.float16, torch.float64):
        tol = tolerance(MANIFESTS["bias_gelu"], dtype)
        assert gradient_tolerance(tol, expected, dtype) == tol
