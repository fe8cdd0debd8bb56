"""A 3-layer MLP (get_model / get_inputs style). Expect aten::addmm on top."""

import torch
import torch.nn as nn


class MLP(nn.Module):
    def __init__(self, d_in: int = 512, d_hidden: int = 2048, d_out: int = 512) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_hidden)
        self.fc3 = nn.Linear(d_hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


def get_model() -> nn.Module:
    torch.manual_seed(0)
    return MLP()


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(256, 512)]
