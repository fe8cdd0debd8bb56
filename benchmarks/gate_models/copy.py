"""base.py with an accidental copy: `.contiguous()` of a transposed activation (line 15), a new op row."""

import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self, width: int = 128, out: int = 128) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, width, bias=False)
        self.fc2 = nn.Linear(width, out, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        h = h.t().contiguous().t()  # the accidental copy
        return self.fc2(h)


def get_model() -> nn.Module:
    torch.manual_seed(0)
    return Net()


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(32768, 128)]
