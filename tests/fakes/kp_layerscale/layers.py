"""LayerScale modules: the reference, a correct fused one, and one whose backward is wrong."""

import torch
from torch import nn


class LayerScale(nn.Module):
    """``x * gamma``: the slot's reference (and default) implementation."""

    def __init__(self, dim, init_values=1e-5, device=None, dtype=None):
        super().__init__()
        self.gamma = nn.Parameter(
            torch.full((dim,), float(init_values), device=device, dtype=dtype)
        )

    def forward(self, x):
        return x * self.gamma


class FusedLayerScale(LayerScale):
    """Correct: the same product through ``torch.addcmul`` (another kernel, the same maths)."""

    def forward(self, x):
        return torch.addcmul(torch.zeros_like(x), x, self.gamma)


class _HalfGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gamma):
        ctx.save_for_backward(x, gamma)
        return x * gamma

    @staticmethod
    def backward(ctx, gy):
        x, gamma = ctx.saved_tensors
        dgamma = (gy * x).reshape(-1, x.shape[-1]).sum(0)
        return gy * gamma, 0.5 * dgamma  # a bug: half the weight gradient


class HalfGradLayerScale(LayerScale):
    """Wrong: its weight gradient is half what it should be (the forward is right)."""

    def forward(self, x):
        return _HalfGrad.apply(x, self.gamma)
