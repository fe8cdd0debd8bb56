"""An MLP whose GELU is written out by hand (the tanh approximation): six element-wise ops, each reading
and writing the whole [512, 1024] activation. opscope reports `fusion` at that line with the
intermediate bytes a single kernel would skip. The fix is fused_gelu_after.py."""

import torch
import torch.nn as nn


class MLP(nn.Module):
    def __init__(self, d: int = 256, hidden: int = 1024) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        h = 0.5 * h * (1.0 + torch.tanh(0.7978845608 * (h + 0.044715 * h.pow(3))))
        return self.fc2(h)


def get_model() -> nn.Module:
    torch.manual_seed(0)
    return MLP()


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(512, 256)]
