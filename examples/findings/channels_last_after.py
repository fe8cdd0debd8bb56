"""channels_last_before.py fixed: model and input converted to channels_last once, outside the step.
Convolutions, ReLU and the rest keep the layout, so nothing converts between layers and opscope reports
no `channels-last` finding."""

import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 16, 3, padding=1)
        self.c3 = nn.Conv2d(16, 32, 3, padding=1, stride=2)
        self.head = nn.Conv2d(32, 10, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.c1(x))
        x = torch.relu(self.c2(x))
        x = torch.relu(self.c3(x))
        return self.head(x).flatten(1)


def get_model() -> nn.Module:
    torch.manual_seed(0)
    return Net().to(memory_format=torch.channels_last)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(8, 3, 64, 64).contiguous(memory_format=torch.channels_last)]
