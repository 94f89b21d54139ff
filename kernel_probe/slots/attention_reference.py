"""The Attention slot's float64 reference (the model's options, as its calls make them) and
torch's own paths, math and fused, whose errors the candidate's are judged against."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from kernel_lock.attention import alibi_bias, band_mask, causal_mask

__all__ = ["Options", "call_mask", "every_other_row", "explicit", "fused_path", "math_path"]


@dataclass(frozen=True)
class Options:
    """What a call computes besides q, k, v: the layer's options, the call's scale, the kind of
    attn_mask it passes and the key/value heads it passes (0: as many as the query's)."""

    window: int = -1
    softcap: float = 0.0
    alibi: bool = False
    scale: float | None = None
    causal: bool = False
    mask: str = "none"
    kv: int = 0

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> Options:
        """The model's options and calls (``canonical_options``); the check's key/value heads:
        one where the model groups its query heads."""
        window, cap, alibi = int(values["window"]), float(values["softcap"]), bool(values["alibi"])
        kv = 1 if values["kv_heads"] else 0
        return cls(window, cap, alibi, causal=bool(values["causal"]), mask=values["mask"], kv=kv)


def call_mask(kind: str, q: Any, k: Any) -> Any:
    """The attn_mask a model's call passes (None: none): every fourth key masked, as a padding
    mask masks keys, never a whole row; a float one adds a bias exact in every dtype."""
    if kind == "none":
        return None
    i = torch.arange(q.shape[-2], device=q.device)[:, None]
    j = torch.arange(k.shape[-2], device=q.device)[None, :]
    keep = (j % 4 != 3).expand(len(i), j.shape[1])[None, None].contiguous()
    if kind == "bool":
        return keep
    bias = (((3 * i + 5 * j) % 9 - 4) / 8).to(q.dtype)[None, None]
    return bias.masked_fill(~keep, -math.inf)


def every_other_row(x: Any) -> Any:
    """``x`` (BHSD) as every other sequence row of a buffer twice as long whose other rows are NaN:
    a strided sequence dimension, the last one contiguous (what SDPA's fused kernels take)."""
    buf = torch.full((*x.shape[:2], 2 * x.shape[2], x.shape[3]), float("nan"), dtype=x.dtype)
    buf[:, :, ::2] = x
    return buf[:, :, ::2]


def _scores(raw: Any, q: Any, k: Any, opts: Options) -> Any:
    """Scaled scores ``raw`` soft-capped, with alibi, masked to the band, causal, the call's
    attn_mask applied."""
    s = opts.softcap * torch.tanh(raw / opts.softcap) if opts.softcap > 0 else raw
    sq, sk = q.shape[-2], k.shape[-2]
    if opts.alibi:
        s = s + alibi_bias(q.shape[1], sq, sk, q.device, s.dtype)
    if opts.window >= 0:
        s = s.masked_fill(~band_mask(sq, sk, opts.window, q.device), -math.inf)
    if opts.causal:
        s = s.masked_fill(~causal_mask(sq, sk, q.device), -math.inf)
    mask = call_mask(opts.mask, s, k)  # in the scores' dtype (s stands for q: its rows)
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else s + mask
    return s


def _grouped(q: Any, kv: Any) -> Any:
    """Key or value heads repeated to the query's (SDPA's ``enable_gqa``)."""
    return (
        kv.repeat_interleave(q.shape[1] // kv.shape[1], dim=1) if kv.shape[1] != q.shape[1] else kv
    )


def explicit(q: Any, k: Any, v: Any, opts: Options) -> Any:
    """softmax(q k^T * scale [softcap] [+ alibi], masked) v, in the inputs' dtype."""
    k, v = _grouped(q, k), _grouped(q, v)
    scale = opts.scale if opts.scale is not None else 1.0 / math.sqrt(q.shape[-1])
    s = _scores((q @ k.transpose(-1, -2)) * scale, q, k, opts)
    return torch.softmax(s, dim=-1) @ v


def math_path(q: Any, k: Any, v: Any, opts: Options) -> Any:
    """torch's own math path in the inputs' dtype: SDPA's MATH backend, or the explicit formula."""
    if opts.softcap > 0 or opts.alibi:
        return explicit(q, k, v, opts)
    masked = opts.window >= 0 or opts.causal or opts.mask != "none"
    zeros = torch.zeros(q.shape[-2], k.shape[-2], dtype=q.dtype, device=q.device)
    mask = _scores(zeros, q, k, opts) if masked else None  # every mask as one additive mask
    gqa = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
    with sdpa_kernel([SDPBackend.MATH]):
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=opts.scale, **gqa
        )


def fused_path(q: Any, k: Any, v: Any, go: Any, opts: Options) -> dict[str, Any]:
    """The attention as a correct fused kernel orders it, in the inputs' dtype: float32
    accumulation, the output rounded once, a backward that recomputes P from the log-sum-exp and
    takes D from the rounded output (its error where the math path is exact by accident)."""
    dtype, kv = q.dtype, k.shape[1]
    q32, k32, v32, go32 = (t.float() for t in (q, _grouped(q, k), _grouped(q, v), go))
    scale = opts.scale if opts.scale is not None else 1.0 / math.sqrt(q.shape[-1])
    half = q.shape[-1] // 2
    # the forward's scores, and the backward's recomputed in another summation order (as a kernel's
    # other tiling does): their difference, ~eps * |s|, is what a recomputing backward cannot avoid
    raw = (q32 @ k32.transpose(-1, -2)) * scale
    raw_b = (
        q32[..., :half] @ k32[..., :half].transpose(-1, -2)
        + q32[..., half:] @ k32[..., half:].transpose(-1, -2)
    ) * scale
    s = _scores(raw, q, k, opts)
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    out = (torch.exp(s - lse).to(dtype).float() @ v32).to(dtype)  # P rounded to the dtype for P @ V
    p = torch.exp(_scores(raw_b, q, k, opts) - lse)
    delta = (go32 * out.float()).sum(-1, keepdim=True)
    ds = p * (go32 @ v32.transpose(-1, -2) - delta)
    if opts.softcap > 0:
        ds = ds * (1 - torch.tanh(raw_b / opts.softcap) ** 2)
    ds, p = ds.to(dtype).float(), p.to(dtype).float()  # rounded to the dtype for the last matmuls

    def summed(t: Any) -> Any:  # a key/value head's gradient: the sum over the heads it serves
        return t.unflatten(1, (kv, t.shape[1] // kv)).sum(2)

    return {
        "out": out,
        "dq": ((ds @ k32) * scale).to(dtype),
        "dk": summed((ds.transpose(-1, -2) @ q32) * scale).to(dtype),
        "dv": summed(p.transpose(-1, -2) @ go32).to(dtype),
    }
