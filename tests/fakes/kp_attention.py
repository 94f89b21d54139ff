"""Attention functions with SDPA's signature, offered as ``--candidate
Attention=kp_attention.NAME``: one correct, and the flaws the Attention checks must catch, each for
its reason."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Correct: torch's SDPA (the window arrives as the boolean attn_mask)."""
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
    )


def biased_output(
    q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """An offset bug: every output row shifted by 2.4 eps(dtype) x that row's max|out| (row-local,
    so no key outside the band reaches it), under a third of the max-error tolerance's floor (8
    eps): the max error alone passes it; the bias statistic sees it."""
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
    )
    return out + 2.4 * torch.finfo(out.dtype).eps * out.detach().abs().amax(dim=-1, keepdim=True)


def ignores_mask(
    q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """Drops attn_mask: global attention whatever the model's window (keys outside the band leak
    in)."""
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale)


def mutates_input(
    q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """Scales q in place before attending (the caller's tensor changes)."""
    with torch.no_grad():
        q.mul_(1.0)
        q.add_(0.0)
        q.data[..., 0] += 1e-3
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale
    )


class _LowPrecisionRecompute(torch.autograd.Function):
    """A backward that recomputes the scores in the inputs' dtype (bf16/fp16) against a float32
    log-sum-exp from the forward, and takes D = rowsum(P * dP) from that P: P no longer sums to one,
    so dS = P (dP - D) does not cancel, and dq, dk are far from zero where they must vanish (a sharp
    softmax over equal values: the class of anemoi-core #1027's bug). Correct in float32."""

    @staticmethod
    def forward(ctx, q, k, v, mask, scale):
        s = (q.float() @ k.float().transpose(-1, -2)) * scale
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        lse = torch.logsumexp(s, dim=-1, keepdim=True)
        out = (torch.exp(s - lse) @ v.float()).to(q.dtype)
        ctx.save_for_backward(q, k, v, lse, out)
        ctx.mask, ctx.scale = mask, scale
        return out

    @staticmethod
    def backward(ctx, go):
        q, k, v, lse, out = ctx.saved_tensors
        # the scores recomputed in q's dtype: the bug
        s = ((q @ k.transpose(-1, -2)) * ctx.scale).float()
        if ctx.mask is not None:
            s = s.masked_fill(~ctx.mask, float("-inf"))
        p = torch.exp(s - lse)
        go32 = go.float()
        dp = go32 @ v.float().transpose(-1, -2)
        delta = (p * dp).sum(-1, keepdim=True)  # D from the recomputed P, not from the output
        ds = p * (dp - delta)
        dq = (ds @ k.float()) * ctx.scale
        dk = (ds.transpose(-1, -2) @ q.float()) * ctx.scale
        dv = p.transpose(-1, -2) @ go32
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None


def low_precision_backward(
    q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """A fused-style kernel with the low-precision backward bug (``_LowPrecisionRecompute``)."""
    if dropout_p:
        raise NotImplementedError("no dropout in this kernel")
    return _LowPrecisionRecompute.apply(
        q, k, v, attn_mask, scale if scale is not None else 1 / math.sqrt(q.shape[-1])
    )


def ignores_causal(
    q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """Drops is_causal: every key reaches every query, whatever the model's causal flag."""
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale, enable_gqa=enable_gqa
    )


def bool_mask_only(
    q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """Takes a boolean attn_mask; an additive float one it reads as boolean (a wrong mask)."""
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        attn_mask = attn_mask > float("-inf")
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
        enable_gqa=enable_gqa,
    )  # fmt: skip


class NoOptions(torch.nn.Module):
    """An attention class of another library that takes none of the slot's options (no causal)."""

    def __init__(self, window=-1, softcap=0.0, dropout=0.0, alibi=False):
        super().__init__()

    def forward(
        self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
    ):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)
