"""A small conv net in KernelBench style: `Model`, `get_inputs()`, `get_init_inputs()`.
Expect the convolution ops on top."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, channels: int = 32, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, channels, kernel_size=3, padding=1),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.Conv2d(channels, channels * 2, kernel_size=3, padding=1, stride=2),
            nn.BatchNorm2d(channels * 2),
            nn.ReLU(),
            nn.Conv2d(channels * 2, channels * 2, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Linear(channels * 2, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = x.mean(dim=(2, 3))
        return self.head(x)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(8, 3, 64, 64)]


def get_init_inputs() -> list:
    return [32, 10]
