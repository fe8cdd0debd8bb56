"""Multi-head attention that splits heads with transpose + reshape. The reshape of the transposed
tensor cannot be a view, so every call copies q, k and v: opscope reports `implicit-copy` at those lines,
with the bytes and time of each copy. The fix is transpose_copy_after.py."""

import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, d_model: int = 256, n_heads: int = 8) -> None:
        super().__init__()
        self.h = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.h, d // self.h).unbind(2)
        q = q.transpose(1, 2).reshape(b * self.h, t, -1)
        k = k.transpose(1, 2).reshape(b * self.h, t, -1)
        v = v.transpose(1, 2).reshape(b * self.h, t, -1)
        att = torch.softmax(torch.bmm(q, k.transpose(1, 2)) * (d // self.h) ** -0.5, dim=-1)
        o = torch.bmm(att, v).view(b, self.h, t, -1)
        return self.out(o.transpose(1, 2).reshape(b, t, d))


def get_model() -> nn.Module:
    torch.manual_seed(0)
    return Attention()


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(8, 128, 256)]
