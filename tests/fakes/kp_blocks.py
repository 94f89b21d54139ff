"""Small models for ``kernel_lock.apply``: the issue's transformer block (LayerNorm, Linear, causal
``F.scaled_dot_product_attention``, GELU) and one whose layers are not torch's defaults
(``RMSNorm(eps=None)``, ``LayerNorm(bias=False)``, grouped-query attention with a padding mask).
Plain torch: importable without kernel_lock, as a user's model code is."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

DIM, HEADS, KV_HEADS, SEQ, BATCH = 32, 4, 2, 8, 2


class Block(nn.Module):
    def __init__(self, dim: int = DIM, heads: int = HEADS):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.act, self.fc2 = nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        qkv = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))


class Blocks(nn.Module):
    def __init__(self, depth: int = 2):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(depth))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def block_input(seed: int = 0) -> torch.Tensor:
    return torch.randn(BATCH, SEQ, DIM, generator=torch.Generator().manual_seed(seed))


class Unusual(nn.Module):
    """RMSNorm(eps=None), LayerNorm(bias=False), GQA with a boolean padding mask."""

    def __init__(self, dim: int = DIM):
        super().__init__()
        head = dim // HEADS
        self.rms, self.norm = nn.RMSNorm(dim), nn.LayerNorm(dim, bias=False)
        self.q, self.kv = nn.Linear(dim, dim), nn.Linear(dim, 2 * KV_HEADS * head)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(self, x, mask):
        b, s, d = x.shape
        h = self.norm(self.rms(x))
        q = self.q(h).view(b, s, HEADS, d // HEADS).transpose(1, 2)
        k, v = self.kv(h).view(b, s, 2, KV_HEADS, d // HEADS).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return x + self.out(a.transpose(1, 2).reshape(b, s, d))


def padding_mask() -> torch.Tensor:
    """(batch, 1, seq, seq): the second sequence's last three keys are padding."""
    keep = torch.ones(BATCH, SEQ, dtype=torch.bool)
    keep[1, -3:] = False
    return keep[:, None, None, :].expand(BATCH, 1, SEQ, SEQ)


class Functional(nn.Module):
    """Only functional calls in its own forward: layer_norm, linear, gelu twice (erf, then
    tanh), rms_norm."""

    def __init__(self, dim: int = DIM):
        super().__init__()
        self.ln_w, self.ln_b = nn.Parameter(torch.randn(dim)), nn.Parameter(torch.randn(dim))
        self.w, self.b = (
            nn.Parameter(torch.randn(dim, dim) / dim**0.5),
            nn.Parameter(torch.zeros(dim)),
        )
        self.rms_w = nn.Parameter(torch.randn(dim))

    def forward(self, x):
        h = F.layer_norm(x, (x.shape[-1],), self.ln_w, self.ln_b, eps=1e-5)
        h = F.gelu(F.linear(h, self.w, self.b))
        return F.rms_norm(F.gelu(h, approximate="tanh"), (x.shape[-1],), self.rms_w, eps=1e-6)
