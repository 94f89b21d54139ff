"""Activation modules offered as ``--candidate Activation=kp_activation.NAME``: one correct, and the
real differences the Activation checks must catch, each for its reason."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


class ExactGELU(nn.Module):
    """Correct: GELU's exact-erf form, written out (what torch.nn.GELU() computes)."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


class FastGELU(nn.Module):
    """GELU's tanh approximation under a name that does not say so (what liger's GEGLU and TE's gelu
    compute): offered for an erf model it is another function, about 4.7e-4 off near |x| = 2.7."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))


class InPlaceGELU(nn.Module):
    """Right values, written into its input's storage behind autograd's back (``.data``), as a
    kernel writing its output over its input does: the residual branch that shares x then sees
    gelu(x)."""

    def forward(self, x):
        y = F.gelu(x)
        x.data.copy_(y.detach())
        return y


class _DroppedTermGELU(torch.autograd.Function):
    """The forward of torch's GELU; the backward drops x * pdf(x), keeping only Phi(x) (a plausible
    hand-written kernel bug: the derivative of x * Phi(x) taken as Phi(x))."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return F.gelu(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


class WrongBackwardGELU(nn.Module):
    """A right forward with a wrong backward (``_DroppedTermGELU``)."""

    def forward(self, x):
        return _DroppedTermGELU.apply(x)


class SwiGLUish(nn.Module):
    """A GLU-family class (halves the last dimension): anemoi refuses it in
    layer_kernels.Activation."""

    def forward(self, x):
        a, b = x.chunk(2, dim=-1)
        return F.silu(a) * b


class NamedGELU(nn.SiLU):
    """SiLU under a GELU's name: it inherits torch.nn.SiLU's forward, so it computes silu."""
