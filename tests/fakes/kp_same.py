"""Another package's classes that compute exactly what torch's do (each a subclass keeping its
forward): a lock pinning them swaps every site, and the model computes bit for bit as written."""

from __future__ import annotations

from torch import nn

from kernel_lock.attention import SDPAttention


class SameLayerNorm(nn.LayerNorm):
    """torch.nn.LayerNorm under another name."""


class SameRMSNorm(nn.RMSNorm):
    """torch.nn.RMSNorm under another name."""


class SameLinear(nn.Linear):
    """torch.nn.Linear under another name."""


class SameGELU(nn.GELU):
    """torch.nn.GELU under another name (``approximate`` as torch's)."""


class SameSiLU(nn.SiLU):
    """torch.nn.SiLU under another name."""


class SameAttention(SDPAttention):
    """kernel_lock's SDPA attention under another name."""
