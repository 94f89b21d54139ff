"""A fake "fast" training library, correct in its maths, awkward the way real ones are.

``FastLayerNorm`` takes its size as ``hidden_size`` (liger's constructor: anemoi's
``LayerNorm(normalized_shape=C)`` needs an adapter) and keeps an ``_extra_state`` entry in its state
dict (as transformer-engine does: the torch.nn twin needs the ``drop:_extra_state`` migration).
``FastLinear`` is a plain correct Linear. Models built with them pickle references to this package.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class FastLayerNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-5, bias=True):
        super().__init__()
        self.hidden_size, self.eps = int(hidden_size), eps
        self.weight = nn.Parameter(torch.ones(self.hidden_size))
        self.bias = nn.Parameter(torch.zeros(self.hidden_size)) if bias else None

    def forward(self, x):
        xf = x.float()
        mean = xf.mean(-1, keepdim=True)
        var = (xf - mean).pow(2).mean(-1, keepdim=True)
        y = (xf - mean) * torch.rsqrt(var + self.eps) * self.weight.float()
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype)

    def get_extra_state(self):
        return torch.empty(0, dtype=torch.uint8)

    def set_extra_state(self, state):
        pass


class FastLinear(nn.Linear):
    """torch.nn.Linear's parameters under another class (what a fused-GEMM library ships)."""

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)
