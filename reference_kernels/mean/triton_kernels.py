"""mean over one dim in Triton: the sum kernel's reduction scaled by 1/R (reference_kernels/sum)."""

from __future__ import annotations

import torch

from reference_kernels.sum.triton_kernels import reduce_forward


def mean_forward(x: torch.Tensor, dim: int, keepdim: bool) -> torch.Tensor:
    return reduce_forward(x, dim, keepdim, True, "opscope::mean")
