"""base.py with one pass of fc2 too many (an off-by-one: block 0 again): fc2's op row (aten::mm at
line 27, the same shapes) does 11/10 of base.py's work, 10% more time by construction."""

import torch
import torch.nn as nn

PASSES = 11  # base.py: 10


class Net(nn.Module):
    # fc1 and fc2 matmul into buffers kept across steps; between them an out-of-place relu, a memory-bound op
    # that allocates 15 MiB each step (it page-faults every step in some processes and in none in others, and
    # load slows it unlike the matmuls: the gate measures it against its own kind and its baseline's runs).
    def __init__(self, width: int = 256, blocks: int = 10, rows: int = 1536) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(width, width) / width**0.5)
        self.w2 = nn.Parameter(torch.randn(width, width) / width**0.5)
        self.register_buffer("h", torch.zeros(blocks, rows, width))
        self.register_buffer("y", torch.zeros(blocks, rows, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, y, n = self.h, self.y, self.h.shape[0]
        for i in range(n):
            torch.mm(x[i], self.w1, out=h[i])
        a = torch.relu(h)
        for i in range(PASSES):
            torch.mm(a[i % n], self.w2, out=y[i % n])
        return y


def get_model() -> nn.Module:
    torch.manual_seed(0)
    return Net()


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(10, 1536, 256)]
