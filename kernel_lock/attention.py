"""The Attention slot's implementations: SDPA's ``forward(q, k, v, attn_mask, dropout_p,
is_causal, scale, enable_gqa)`` on (batch, heads, seq, dim), plus the options the lock pins
(``window``: |i - j| <= window, -1 global; ``softcap``; ``dropout``; ``alibi``; ``causal``). An
option a class cannot honour raises ``NotImplementedError`` (unless anemoi's wrapper ignores it)."""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .slots.attention import SDPA_BACKENDS

__all__ = [
    "Attention",
    "FlashAttention2",
    "FlashAttention3",
    "FlashAttention4",
    "FlexAttention",
    "SDPAttention",
    "TEDotProductAttention",
    "alibi_bias",
    "alibi_slopes",
    "band_mask",
    "causal_mask",
]


def band_mask(q_len: int, k_len: int, window: int, device: Any) -> torch.Tensor:
    """The boolean window mask (True = attend where ``|i - j| <= window``)."""
    i = torch.arange(q_len, device=device)[:, None]
    j = torch.arange(k_len, device=device)[None, :]
    return (i - j).abs() <= window


def causal_mask(q_len: int, k_len: int, device: Any) -> torch.Tensor:
    """SDPA's ``is_causal`` as a boolean mask (True = attend where ``j <= i``, top-left)."""
    i = torch.arange(q_len, device=device)[:, None]
    return torch.arange(k_len, device=device)[None, :] <= i


def alibi_slopes(heads: int) -> torch.Tensor:
    """anemoi-models' ``get_alibi_slopes`` (ALiBi's slopes), in float32."""
    n = 2 ** math.floor(math.log2(heads))
    slopes = torch.pow(2.0 ** (-8.0 / n), torch.arange(1, 1 + n))
    if n < heads:
        extra = torch.pow(2.0 ** (-4.0 / n), torch.arange(1, 1 + 2 * (heads - n), 2))
        slopes = torch.cat([slopes, extra])
    return slopes.float()


def alibi_bias(heads: int, q_len: int, k_len: int, device: Any, dtype: Any) -> torch.Tensor:
    """``-slope_h * |i - j|`` as an additive (heads, q_len, k_len) bias."""
    i = torch.arange(q_len, device=device)[:, None]
    dist = (i - torch.arange(k_len, device=device)[None, :]).abs()
    return (-alibi_slopes(heads).to(device)[:, None, None] * dist).to(dtype)


class Attention(nn.Module):
    """The slot's contract; subclasses implement ``attend``. No parameters, so no state."""

    def __init__(
        self,
        window: int = -1,
        softcap: float = 0.0,
        dropout: float = 0.0,
        alibi: bool = False,
        causal: bool = False,
    ):
        super().__init__()
        if int(window) != window or window < -1:
            raise ValueError(f"window must be -1 (global) or a half-width >= 0, got {window!r}")
        if not (softcap >= 0.0 and math.isfinite(softcap)):
            raise ValueError(f"softcap must be >= 0 (0: none), got {softcap!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        self.window, self.softcap = int(window), float(softcap)
        self.dropout, self.alibi, self.causal = float(dropout), bool(alibi), bool(causal)
        # one mask per (q_len, k_len, device), as anemoi's SDPA wrapper reuses its one
        self._masks: dict[tuple[int, int, str], torch.Tensor] = {}

    def extra_repr(self) -> str:
        """The options in the module's repr."""
        w, c, d, a = self.window, self.softcap, self.dropout, self.alibi
        return f"window={w}, softcap={c}, dropout={d}, alibi={a}" + (", causal=True" * self.causal)

    def window_mask(self, q_len: int, k_len: int, device: Any) -> torch.Tensor | None:
        """The band as a boolean mask (None: global)."""
        if self.window < 0:
            return None
        key = (q_len, k_len, str(device))
        if key not in self._masks:
            self._masks[key] = band_mask(q_len, k_len, self.window, device)
        return self._masks[key]

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float | None = None,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        """``scaled_dot_product_attention(q, k, v, ...)`` with this layer's options (a causal
        layer is causal whatever the call says)."""
        if dropout_p is None:
            dropout_p = self.dropout if self.training else 0.0
        causal = bool(is_causal) or self.causal
        return self.attend(q, k, v, attn_mask, float(dropout_p), causal, scale, bool(enable_gqa))

    def attend(self, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> torch.Tensor:
        """The attention, SDPA's arguments normalised; each backend implements it."""
        raise NotImplementedError

    def _masked(self, q: Any, k: Any, attn_mask: Any, is_causal: bool) -> tuple[Any, bool]:
        """(the mask, is_causal) for SDPA, which takes one or the other: the window and the
        caller's mask, and with either, the causal triangle folded into the mask."""
        band = self.window_mask(q.shape[-2], k.shape[-2], q.device)
        mask = attn_mask if band is None else _both(attn_mask, band)
        if mask is None or not is_causal:
            return mask, is_causal
        return _both(mask, causal_mask(q.shape[-2], k.shape[-2], q.device)), False

    def _refuse(self, what: str, softcap: bool = True, alibi: bool = True) -> None:
        """Raise for a softcap or alibi ``what`` cannot honour."""
        if softcap and self.softcap > 0:
            raise NotImplementedError(f"softcap is not supported by {what}")
        if alibi and self.alibi:
            raise NotImplementedError(f"alibi slopes are not supported by {what}")


def _both(mask: Any, allow: torch.Tensor) -> torch.Tensor:
    """``mask`` (None, boolean, or additive float) where ``allow`` allows, -inf or False else."""
    if mask is None:
        return allow
    return mask & allow if mask.dtype == torch.bool else mask.masked_fill(~allow, -math.inf)


class SDPAttention(Attention):
    """torch's SDPA, the window as a mask; ``backend`` forced through ``sdpa_kernel``."""

    def __init__(
        self,
        window: int = -1,
        softcap: float = 0.0,
        dropout: float = 0.0,
        alibi: bool = False,
        backend: str = "default",
        causal: bool = False,
    ):
        super().__init__(window, softcap, dropout, alibi, causal)
        if backend != "default" and backend not in SDPA_BACKENDS:
            raise ValueError(
                f"backend must be 'default' or one of {', '.join(SDPA_BACKENDS)}, got {backend!r}"
            )
        self.backend = backend

    def extra_repr(self) -> str:
        """The options and the SDPA backend asked for."""
        return f"{super().extra_repr()}, backend={self.backend!r}"

    def attend(self, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
        """torch's scaled_dot_product_attention under the backend asked for."""
        self._refuse("torch's scaled_dot_product_attention")
        mask, is_causal = self._masked(q, k, attn_mask, is_causal)
        call = {"attn_mask": mask, "dropout_p": dropout_p, "is_causal": is_causal, "scale": scale}
        call.update({"enable_gqa": True} if enable_gqa else {})
        if self.backend == "default":
            return F.scaled_dot_product_attention(q, k, v, **call)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[self.backend])]):
            return F.scaled_dot_product_attention(q, k, v, **call)


_flex: dict[str, Callable[..., Any]] = {}


class FlexAttention(Attention):
    """``flex_attention``: window as ``block_mask``, softcap and alibi as ``score_mod``."""

    def __init__(
        self,
        window: int = -1,
        softcap: float = 0.0,
        dropout: float = 0.0,
        alibi: bool = False,
        compiled: bool = True,
        causal: bool = False,
    ):
        super().__init__(window, softcap, dropout, alibi, causal)
        self.compiled = compiled
        self._blocks: dict[tuple[int, int, str], Any] = {}

    def attend(self, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
        """torch's flex_attention with this layer's block mask and score modification."""
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        if dropout_p > 0:
            raise NotImplementedError("flex_attention has no dropout")
        if attn_mask is not None or is_causal:
            raise NotImplementedError(
                "this flex_attention adapter takes no attn_mask and no is_causal"
            )
        if self.compiled and "flex" not in _flex:
            _flex["flex"] = torch.compile(flex_attention, dynamic=False)
        fn = _flex["flex"] if self.compiled else flex_attention
        block = None
        if self.window >= 0:
            key = (q.shape[-2], k.shape[-2], str(q.device))
            if key not in self._blocks:
                w = self.window

                def band(b, h, qi, kj):
                    return (qi - kj).abs() <= w

                self._blocks[key] = create_block_mask(band, None, None, *key[:2], device=key[2])
            block = self._blocks[key]
        score_mod = None
        cap, slopes = self.softcap, alibi_slopes(q.shape[1]).to(q.device) if self.alibi else None
        if cap > 0 or slopes is not None:

            def score_mod(score, b, h, qi, kj):
                if cap > 0:
                    score = cap * torch.tanh(score / cap)
                if slopes is not None:
                    score = score - slopes[h] * (qi - kj).abs()
                return score

        return fn(
            q, k, v, score_mod=score_mod, block_mask=block, scale=scale, enable_gqa=enable_gqa
        )


def _bshd(*tensors: torch.Tensor) -> list[torch.Tensor]:
    # anemoi's einops.rearrange("batch heads grid vars -> batch grid heads vars"): a transposed view
    return [t.transpose(1, 2) for t in tensors]


class _FlashAttention(Attention):
    """A flash-attn generation, called exactly as anemoi's ``FlashAttentionWrapper``."""

    MODULE = ""
    GENERATION = 0
    _func: Callable[..., Any] | None = None

    def func(self) -> Callable[..., Any]:
        if self._func is None:
            self._func = importlib.import_module(self.MODULE).flash_attn_func
        return self._func

    def _window(self) -> tuple[int, int]:
        return (self.window, self.window) if self.window >= 0 else (-1, -1)

    def attend(self, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
        if attn_mask is not None:
            raise NotImplementedError(
                f"flash-attn {self.GENERATION} takes no attn_mask (only the window)"
            )
        options = {} if scale is None else {"softmax_scale": scale}
        out = self.call(*_bshd(q, k, v), dropout_p, is_causal, options)
        if isinstance(out, tuple):  # v4, and early v3, return (out, softmax_lse)
            out = out[0]
        return out.transpose(1, 2)

    def call(self, q, k, v, dropout_p, is_causal, options):
        raise NotImplementedError


class FlashAttention2(_FlashAttention):
    """flash-attn 2: window, dropout, softcap and alibi all passed."""

    MODULE, GENERATION = "flash_attn", 2

    def call(self, q, k, v, dropout_p, is_causal, options):
        """flash-attn 2's ``flash_attn_func`` on BSHD tensors, every option passed."""
        slopes = None
        if self.alibi:  # anemoi: alibi_slopes.repeat(batch_size, 1)
            slopes = alibi_slopes(q.shape[2]).repeat(q.shape[0], 1).to(q.device)
        options |= {"dropout_p": dropout_p, "softcap": self.softcap, "alibi_slopes": slopes}
        return self.func()(q, k, v, causal=is_causal, window_size=self._window(), **options)


class FlashAttention3(_FlashAttention):
    """flash-attn 3: window and softcap; no dropout; alibi raises (as in anemoi)."""

    MODULE, GENERATION = "flash_attn_interface", 3

    def call(self, q, k, v, dropout_p, is_causal, options):
        """flash-attn 3's ``flash_attn_func``: window and softcap."""
        self._refuse("flash attention v3 (anemoi raises)", softcap=False)
        window, cap = self._window(), self.softcap
        return self.func()(q, k, v, causal=is_causal, window_size=window, softcap=cap, **options)


class FlashAttention4(_FlashAttention):
    """flash-attn 4: the window and ``softmax_scale``; alibi ignored (as in anemoi)."""

    MODULE, GENERATION = "flash_attn.cute", 4

    def call(self, q, k, v, dropout_p, is_causal, options):
        """flash-attn 4's ``flash_attn_func``: window and scale (its default made explicit)."""
        scale = options["softmax_scale"] if options else 1.0 / math.sqrt(q.shape[-1])
        return self.func()(
            q, k, v, softmax_scale=scale, causal=is_causal, window_size=self._window()
        )


class TEDotProductAttention(Attention):
    """transformer-engine's ``DotProductAttention`` (bshd), built on first call."""

    def attend(self, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
        """transformer-engine's DotProductAttention, one module per (heads, dim, scale, dropout,
        causal)."""
        self._refuse("transformer-engine's DotProductAttention", alibi=False)
        if self.alibi:
            raise NotImplementedError("this adapter passes no alibi slopes to transformer-engine")
        if attn_mask is not None:
            raise NotImplementedError("this adapter takes no attn_mask (only the window)")
        key = (q.shape[1], q.shape[-1], scale, dropout_p, is_causal)
        built = self.__dict__.setdefault("_te", {})
        if key not in built:
            te = importlib.import_module("transformer_engine.pytorch")
            built[key] = te.DotProductAttention(
                q.shape[1],
                q.shape[-1],
                attention_dropout=dropout_p,
                qkv_format="bshd",
                attn_mask_type="causal" if is_causal else "no_mask",
                window_size=(self.window, self.window) if self.window >= 0 else (-1, -1),
                softmax_scale=scale,
            )
        q, k, v = _bshd(q, k, v)
        out = built[key](q.contiguous(), k.contiguous(), v.contiguous())  # (B, S, H*D)
        return out.view(q.shape[0], q.shape[1], q.shape[2], q.shape[3]).transpose(1, 2)


class FunctionAttention(Attention):
    """A user's function with SDPA's signature, the window as ``attn_mask``."""

    FUNCTION: Callable[..., Any] | None = None

    def attend(self, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
        """The function (``FUNCTION``), the window folded into the mask."""
        if self.softcap > 0 or self.alibi:
            raise NotImplementedError(
                "a function with SDPA's signature takes no softcap and no alibi slopes"
            )
        fn = type(self).FUNCTION
        assert fn is not None
        mask, is_causal = self._masked(q, k, attn_mask, is_causal)
        call = {"attn_mask": mask, "dropout_p": dropout_p}
        call.update({"is_causal": True} if is_causal else {})
        call.update({"scale": scale} if scale is not None else {})
        call.update({"enable_gqa": True} if enable_gqa else {})
        return fn(q, k, v, **call)


def for_function(fn: Callable[..., Any], target: str) -> type[FunctionAttention]:
    """The Attention class that calls ``fn`` (named ``target`` in the lock)."""
    doc = f"``{target}`` with the Attention slot's options (the window as a boolean attn_mask)."
    name = f"FunctionAttention_{target.rpartition('.')[2]}"
    return type(name, (FunctionAttention,), {"FUNCTION": staticmethod(fn), "__doc__": doc})
