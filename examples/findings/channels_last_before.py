"""A small conv net fed NCHW tensors (PyTorch's default layout).

`opscope profile examples/findings/channels_last_before.py` measures each convolution in both layouts
and reports `channels-last` where channels_last is faster on this machine. The fix is
channels_last_after.py: the same net, converted once to channels_last."""

import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 16, 3, padding=1)
        self.c3 = nn.Conv2d(16, 32, 3, padding=1, stride=2)
        self.head = nn.Conv2d(32, 10, 32)  # one output pixel per image: no pooling, no flatten of a 4-D map

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.c1(x))
        x = torch.relu(self.c2(x))
        x = torch.relu(self.c3(x))
        return self.head(x).flatten(1)


def get_model() -> nn.Module:
    torch.manual_seed(0)
    return Net()


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(8, 3, 64, 64)]
