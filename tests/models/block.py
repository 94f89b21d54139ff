"""Issue 53's transformer block: LayerNorm, Linear, causal ``F.scaled_dot_product_attention``,
GELU. ``build()`` -> (the block, (x,)) at batch 2, sequence 16, hidden 64, 4 heads."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

BATCH, SEQ, HIDDEN, HEADS = 2, 16, 64, 4


class Block(nn.Module):
    def __init__(self, hidden: int = HIDDEN, heads: int = HEADS):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, 4 * hidden)
        self.act = nn.GELU()
        self.down = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
        return x + self.down(self.act(self.up(self.norm2(x))))


def build() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return Block(), (torch.randn(BATCH, SEQ, HIDDEN),)
