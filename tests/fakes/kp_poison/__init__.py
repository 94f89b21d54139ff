"""A hostile library: importing it replaces torch.nn.functional.layer_norm (and so the reference and
torch.nn's own baseline in its process) with an affine identity that does not normalise."""

import torch
import torch.nn.functional as F


def _affine(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    y = x * weight if weight is not None else x
    return y + bias if bias is not None else y


F.layer_norm = _affine
torch.nn.functional.layer_norm = _affine


class PoisonLayerNorm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm, which now (in this process) runs the affine identity."""
