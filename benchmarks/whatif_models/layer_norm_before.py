"""A block whose LayerNorm is written out by hand: mean, sub, pow, mean, add, sqrt, div, mul, add, each
reading and writing the whole [4096, 512] activation. opscope reports `fusion` at that line. The fix is
layer_norm_after.py (F.layer_norm: one fused kernel on CPU too)."""

import torch
import torch.nn as nn


class Norm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mu = x.mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt((x - mu).pow(2).mean(-1, keepdim=True) + self.eps) * self.weight + self.bias


class Block(nn.Module):
    def __init__(self, d: int = 512) -> None:
        super().__init__()
        self.norm = Norm(d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


def get_model() -> nn.Module:
    torch.manual_seed(0)
    return Block()


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(4096, 512)]
