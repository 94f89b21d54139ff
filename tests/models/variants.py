"""Models whose layers are not torch's defaults, each ``build`` small: the sites a trace must find
with their exact semantics (``RMSNorm(eps=None)``, ``LayerNorm(bias=False)``, GQA with a padding
mask, a tanh GELU), one it cannot swap (``nn.MultiheadAttention``), a model of functional calls
only, one function called twice in one forward, calls no slot swaps (in place, a vector weight), a
block called twice, and a model the meta device cannot run (``.item()``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

try:
    from .block import BATCH, HIDDEN, SEQ, Block
except ImportError:  # loaded by its path, as a model spec: its folder is on the path
    from block import BATCH, HIDDEN, SEQ, Block  # type: ignore[no-redef]


class Norms(nn.Module):
    """``RMSNorm(eps=None)`` (torch's eps: the dtype's), ``LayerNorm(bias=False)``, tanh GELU."""

    def __init__(self) -> None:
        super().__init__()
        self.rms = nn.RMSNorm(HIDDEN)
        self.ln = nn.LayerNorm(HIDDEN, bias=False)
        self.fc = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.act = nn.GELU(approximate="tanh")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(self.ln(self.rms(x))))


def norms() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return Norms(), (torch.randn(BATCH, SEQ, HIDDEN),)


class GQA(nn.Module):
    """Grouped-query attention (8 query heads, 2 key/value heads) with a boolean padding mask."""

    heads, kv_heads, head_dim = 8, 2, 8

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(HIDDEN, self.heads * self.head_dim)
        self.kv = nn.Linear(HIDDEN, 2 * self.kv_heads * self.head_dim)
        self.out = nn.Linear(self.heads * self.head_dim, HIDDEN)

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, -1).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, -1).permute(2, 0, 3, 1, 4)
        mask = padding[:, None, None, :]  # (b, 1, 1, s): True = attend
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.out(a.transpose(1, 2).reshape(b, s, -1))


def gqa() -> tuple[nn.Module, tuple[torch.Tensor], dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    padding = torch.ones(BATCH, SEQ, dtype=torch.bool)
    padding[:, SEQ - 3 :] = False
    return GQA(), (torch.randn(BATCH, SEQ, HIDDEN),), {"padding": padding}


class MHA(nn.Module):
    """``nn.MultiheadAttention`` (out of reach: one fused call), then a Linear (in reach)."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(HIDDEN, 4, batch_first=True)
        self.fc = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.attn(x, x, x, need_weights=False)[0])


def mha() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return MHA(), (torch.randn(BATCH, SEQ, HIDDEN),)


class Functional(nn.Module):
    """Parameters only, every slot reached through torch.nn.functional (two layer_norm calls)."""

    def __init__(self) -> None:
        super().__init__()
        self.w_in = nn.Parameter(torch.randn(2 * HIDDEN, HIDDEN) / HIDDEN**0.5)
        self.w_out = nn.Parameter(torch.randn(HIDDEN, 2 * HIDDEN) / HIDDEN**0.5)
        self.g = nn.Parameter(torch.ones(HIDDEN))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.layer_norm(x, (HIDDEN,), self.g, None, 1e-6)
        h = F.silu(F.linear(h, self.w_in))
        h = F.linear(F.rms_norm(h, (2 * HIDDEN,), eps=1e-5), self.w_out)
        q = h.view(BATCH, SEQ, 4, -1).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, q, q, scale=0.5).transpose(1, 2).reshape(x.shape)
        return F.layer_norm(F.gelu(a), (HIDDEN,))


def functional() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return Functional(), (torch.randn(BATCH, SEQ, HIDDEN),)


class Twice(nn.Module):
    """One block called twice in a forward: each of its sites twice."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(self.block(x))


def twice() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return Twice(), (torch.randn(BATCH, SEQ, HIDDEN),)


class Windowed(nn.Module):
    """An Attention slot module (``kernel_lock.attention.SDPAttention``, window 4), a float mask."""

    def __init__(self) -> None:
        from kernel_lock.attention import SDPAttention

        super().__init__()
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.attn = SDPAttention(window=4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, 4, -1).permute(2, 0, 3, 1, 4)
        bias = torch.zeros(s, s, dtype=x.dtype)  # no device: the one the model runs on
        return self.attn(q, k, v, attn_mask=bias, scale=0.25).transpose(1, 2).reshape(x.shape)


def windowed() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return Windowed(), (torch.randn(BATCH, SEQ, HIDDEN),)


class HalfGELU(nn.GELU):
    """A subclass of torch's GELU with a forward of its own: its inner F.gelu call is the site."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * super().forward(x)


class LocalNorm(nn.LayerNorm):
    """A subclass of torch's LayerNorm that keeps its forward: a LayerNorm site of its own class."""


def subclasses() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return nn.Sequential(LocalNorm(HIDDEN, eps=1e-3), HalfGELU()), (torch.randn(BATCH, HIDDEN),)


def two_sizes() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """One norm called at two sequence lengths in a forward."""

    class TwoSizes(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(HIDDEN)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cat([self.norm(x), self.norm(x[:, : SEQ // 2])], dim=1)

    torch.manual_seed(0)
    return TwoSizes(), (torch.randn(BATCH, SEQ, HIDDEN),)


class DataDependent(nn.Module):
    """A forward the meta device cannot run: ``.item()`` decides how often the norm is applied."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(HIDDEN)
        self.fc = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.abs().max().item() > 0:  # always true for random inputs, unknowable on meta
            x = self.norm(x)
        return self.fc(x)


def data_dependent() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return DataDependent(), (torch.randn(8, SEQ, HIDDEN),)


class Repeated(nn.Module):
    """``F.layer_norm`` twice with the same semantics in one forward, and a GELU module that calls
    ``F.gelu`` twice: the second call of each is its module's ``#2`` site."""

    class Twice(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.gelu(F.gelu(x))

    def __init__(self) -> None:
        super().__init__()
        self.g = nn.Parameter(torch.ones(HIDDEN))
        self.act = self.Twice()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.layer_norm(x, (HIDDEN,), self.g)
        return F.layer_norm(self.act(h) * 2.0, (HIDDEN,), self.g)


def repeated() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return Repeated(), (torch.randn(BATCH, SEQ, HIDDEN),)


class OwnNorm(nn.LayerNorm):
    """A LayerNorm subclass with a forward of its own: no site (apply must not replace it); the
    ``F.layer_norm`` its forward makes is."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2.0 * super().forward(x)


class OutOfReach(nn.Module):
    """Calls no slot swaps: an in-place ReLU module and ``F.relu(x, True)`` (a swapped class would
    not overwrite its input), ``F.linear`` with a vector weight (no Linear computes it)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = OwnNorm(HIDDEN)
        self.relu = nn.ReLU(inplace=True)
        self.v = nn.Parameter(torch.randn(HIDDEN) / HIDDEN**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.relu(self.norm(x) + 0.0)
        return F.relu(h - 0.1, True) * F.linear(h, self.v)[..., None]


def out_of_reach() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return OutOfReach(), (torch.randn(BATCH, SEQ, HIDDEN),)


class Checkpointed(nn.Module):
    """A Linear and a LayerNorm under activation checkpointing (anemoi's mappers and processors
    checkpoint theirs): its backward recomputes the forward."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.norm = nn.Linear(64, 64), nn.LayerNorm(64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inner = lambda t: self.norm(self.up(t))  # noqa: E731
        return torch.utils.checkpoint.checkpoint(inner, x, use_reentrant=False)


def checkpointed() -> tuple[nn.Module, tuple[torch.Tensor]]:
    return Checkpointed(), (torch.randn(2, 16, 64, requires_grad=True),)
