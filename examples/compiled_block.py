"""A transformer block compiled with torch.compile (inductor): attention via scaled_dot_product_attention,
then Linear -> GELU -> Linear, each with a residual and a LayerNorm. On CPU inductor writes C++ kernels;
`opscope profile` shows one row per kernel (`graph_0_cpp_fused_...`). The first run compiles (tens of
seconds on a small CPU); later ones reuse inductor's cache."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d_model: int = 128, n_heads: int = 4) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln1 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, 4 * d_model)
        self.fc2 = nn.Linear(4 * d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q = q.view(b, t, self.n_heads, -1).transpose(1, 2)
        k = k.view(b, t, self.n_heads, -1).transpose(1, 2)
        v = v.view(b, t, self.n_heads, -1).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = self.ln1(x + self.proj(y.transpose(1, 2).reshape(b, t, d)))
        return self.ln2(x + self.fc2(F.gelu(self.fc1(x))))


def get_model() -> nn.Module:
    torch.manual_seed(0)
    return torch.compile(Block())


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(2, 64, 128)]
