"""A projection that makes its weight's transpose contiguous on every call before the matmul: the copy
moves the whole [2048, 2048] weight each time, though matmul reads a transposed operand as it is. opscope
reports `contiguous-call` at that line. The fix is contiguous_after.py."""

import torch
import torch.nn as nn


class Proj(nn.Module):
    def __init__(self, d: int = 2048) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d, d) / d**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w_t = self.weight.t().contiguous()
        return torch.relu(x @ w_t)


def get_model() -> nn.Module:
    torch.manual_seed(0)
    return Proj()


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(64, 2048)]
