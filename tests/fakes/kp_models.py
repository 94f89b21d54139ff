"""A model built the way anemoi builds its components: layers from factories, the factories kept as
an attribute (anemoi's `layer_factory`). Importable without kernel_lock, as a user's model code
is."""

from __future__ import annotations

import functools

import torch


class FactoryModel(torch.nn.Module):
    def __init__(self, LayerNorm, Linear):
        super().__init__()
        self.layer_factory = {
            "LayerNorm": LayerNorm,
            "Linear": Linear,
            "Activation": functools.partial(torch.nn.GELU),
        }
        self.body = torch.nn.Sequential(
            Linear(8, 16), LayerNorm(16, eps=1e-3), torch.nn.GELU(), Linear(16, 4, bias=False)
        )
        self.norm_class = type(self.body[1])
        self.shared = self.body[1]  # one module under two names stays one module

    def forward(self, x):
        return self.body(x)
