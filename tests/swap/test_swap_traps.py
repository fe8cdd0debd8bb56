"""The traps judge a kernel by the math it replaces, not by the original's rounding: a kernel exact in
float64 passes the device/dtype trap on a module that computes in float32 whatever it is given
(transformers' LlamaRMSNorm), and a kernel less accurate than the original still fails it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from opscope.kernels import catalog
from opscope.swap import apply, traps
from opscope.swap.mechanisms import RecordedCall, Swap
from opscope.swap.tolerance import Tol, tolerance_for


class ExactRMSNorm(nn.Module):
    """RMSNorm in whatever dtype it is given (float64 in, float64 math)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon = 1e-6

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states * torch.rsqrt(hidden_states.pow(2).mean(-1, keepdim=True) + self.variance_epsilon) * self.weight


class Holder(nn.Module):
    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm
        with torch.no_grad():
            norm.weight.uniform_(0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.norm(x)
        return out


def float32_math_kernel(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """LlamaRMSNorm's own math: float32 inside, the input's dtype out (then times the weight)."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    return module.weight * h.to(x.dtype)


def recorded_call(model: nn.Module, build: Callable[[apply.Builder], Swap]) -> tuple[RecordedCall, Callable[[torch.dtype], Tol]]:
    torch.manual_seed(0)
    x = torch.randn(2, 16, 64)
    swap = build(apply.Builder(model.eval(), lambda: model(x)))
    with swap.applied(), swap.recording() as recorder, torch.no_grad():
        model(x)
    (call,) = recorder.calls.values()
    return call, lambda d: tolerance_for(d, swap.tolerance_kernels)


def bundled_rms_norm(b: apply.Builder) -> Swap:
    return b.bundled("rms_norm", [apply.BundledKernel(catalog.find("rms_norm"))])


def user_kernel(fn: Any) -> Callable[[apply.Builder], Swap]:
    return lambda b: b.user("k", fn, None, "*RMSNorm")


def test_an_exact_kernel_passes_the_dtype_trap_on_a_module_computing_in_float32():
    torch.manual_seed(0)
    call, tol_of = recorded_call(Holder(LlamaRMSNorm(64)), bundled_rms_norm)
    assert traps.trap_device_dtype(call, tol_of=tol_of) == ""


def test_a_kernel_as_accurate_as_the_original_passes_and_a_less_accurate_one_fails():
    torch.manual_seed(0)
    call, tol_of = recorded_call(Holder(LlamaRMSNorm(64)), user_kernel(float32_math_kernel))
    assert traps.trap_device_dtype(call, tol_of=tol_of) == ""  # float32 inside, as the original
    torch.manual_seed(0)
    call, tol_of = recorded_call(Holder(ExactRMSNorm(64)), user_kernel(float32_math_kernel))
    problem = traps.trap_device_dtype(call, tol_of=tol_of)  # the original is exact in float64: it is not
    assert "float64" in problem and "reference" in problem
