"""Seeded sample inputs for the tests, opcheck and the trap checks (small, several layouts)."""

from __future__ import annotations

import json
from collections.abc import Callable

import torch


def randn_factory(dtype: torch.dtype, seed: int) -> Callable[..., torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=g, dtype=torch.float32).to(dtype)

    return randn


def reduced_dim(concrete: list[str]) -> tuple[int, bool] | None:
    """(dim, keepdim) of a profiled aten::sum.dim_IntList / aten::mean.dim row from its recorded scalar
    arguments (`["", "[-1]", "True", ""]`); None unless exactly one dim is reduced."""
    if len(concrete) < 3:
        return None
    try:
        dims = json.loads(concrete[1])
    except ValueError:
        return None
    if not isinstance(dims, list) or len(dims) != 1 or not isinstance(dims[0], int):
        return None
    return dims[0], concrete[2] == "True"
