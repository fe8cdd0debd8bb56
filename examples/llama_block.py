"""A LLaMA-style decoder block: RMSNorm (hand-written, as in LLaMA's reference code), causal
self-attention through scaled_dot_product_attention, and a SwiGLU MLP down(silu(gate(x)) * up(x)).
`opscope swap examples/llama_block.py --kernel rms_norm --kernel swiglu --kernel compile` puts the bundled
fused kernels (and torch.compile) in its place and measures them."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q = self.wq(x).view(b, t, self.n_heads, -1).transpose(1, 2)
        k = self.wk(x).view(b, t, self.n_heads, -1).transpose(1, 2)
        v = self.wv(x).view(b, t, self.n_heads, -1).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, d))


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, dim: int = 256, n_heads: int = 4, hidden: int = 688) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(dim)
        self.attention = Attention(dim, n_heads)
        self.ffn_norm = RMSNorm(dim)
        self.feed_forward = SwiGLU(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


def get_model() -> nn.Module:
    torch.manual_seed(0)
    return Block()


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(4, 256, 256)]


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    # A mean, as real losses are: --mode train's default (the output's sum) gives gradients so large that a
    # few SGD steps at lr 1e-3 send this block's weights to infinity.
    return output.pow(2).mean()
