"""Seeded sample inputs for the tests, opcheck and the trap checks (small, several layouts)."""

from __future__ import annotations

from collections.abc import Callable

import torch


def randn_factory(dtype: torch.dtype, seed: int) -> Callable[..., torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=g, dtype=torch.float32).to(dtype)

    return randn
