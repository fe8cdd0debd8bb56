"""base.py with an accidental copy: `.contiguous()` of a transposed activation (line 26), a new op row.
The rest is base.py's, fc2 one line lower."""

import torch
import torch.nn as nn

PASSES = 10  # slow_op.py: 11 (the same op row, line and shapes doing 11/10 of the work)


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
        a = a.transpose(1, 2).contiguous().transpose(1, 2)  # the accidental copy
        for i in range(PASSES):
            torch.mm(a[i % n], self.w2, out=y[i % n])
        return y


def get_model() -> nn.Module:
    torch.manual_seed(0)
    return Net()


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(10, 1536, 256)]
