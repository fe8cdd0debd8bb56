"""transpose_copy_before.py fixed: the heads stay a strided [b, h, t, d] view, which
F.scaled_dot_product_attention reads as is, and its output transposed back is already contiguous, so
the final reshape is a view. No aten::clone / aten::copy_ of activations is left, and no
`implicit-copy` finding."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, d_model: int = 256, n_heads: int = 8) -> None:
        super().__init__()
        self.h = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.h, d // self.h).unbind(2)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.out(o.transpose(1, 2).reshape(b, t, d))


def get_model() -> nn.Module:
    torch.manual_seed(0)
    return Attention()


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(8, 128, 256)]
