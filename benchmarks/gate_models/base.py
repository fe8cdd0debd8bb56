"""The model benchmarks/gate_false_alarms.py gates: two linear layers, each a matmul per block of rows.
fc2's passes (line 27) are one op row, aten::mm of one block, PASSES calls a step; slow_op.py makes 11."""

import torch
import torch.nn as nn

PASSES = 10  # slow_op.py: 11 (the same op row, line and shapes doing 11/10 of the work)


class Net(nn.Module):
    # Every op row the same matmul, into buffers kept across steps. The gate normalizes an op row of a noisy
    # run by the load on the other rows, and load slows a matmul and a memory-bound op unlike: with a relu
    # (1% of the step) a loaded baseline made it 1.6-2.2x "slower" in quiet runs (false alarms). And no step
    # allocates: a fresh 15 MiB tensor page-faults in some processes and not others (relu, cat swung 5x).
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
        for i in range(PASSES):
            torch.mm(h[i % n], self.w2, out=y[i % n])
        return y


def get_model() -> nn.Module:
    torch.manual_seed(0)
    return Net()


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(10, 1536, 256)]
