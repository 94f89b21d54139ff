"""What the fake flash-attn and transformer-engine libraries compute (on CPU, in torch): BSHD
attention with flash-attn's window, softcap, dropout and alibi semantics. Each fake library imports
this from its own directory's parent (the test puts that directory on the path)."""

from __future__ import annotations

import math

import torch


def attention(
    q,
    k,
    v,
    *,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    dropout_p=0.0,
    alibi_slopes=None,
):
    """BSHD in, BSHD out: softmax(q k^T * scale [softcap] [alibi] [window]) [dropout] v."""
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))  # BHSD
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    s = (qh.float() @ kh.float().transpose(-1, -2)) * scale
    if softcap and softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(q.shape[1])[:, None]
    j = torch.arange(k.shape[1])[None, :]
    if alibi_slopes is not None:
        s = s - alibi_slopes.float()[:, :, None, None] * (i - j).abs()
    left, right = window_size
    if left is not None and left >= 0:
        s = s.masked_fill(j < i - left, float("-inf"))
    if right is not None and right >= 0:
        s = s.masked_fill(j > i + right, float("-inf"))
    if causal:
        s = s.masked_fill(j > i, float("-inf"))
    p = torch.softmax(s, dim=-1)
    if dropout_p > 0:
        p = torch.nn.functional.dropout(p, dropout_p)
    return (p @ vh.float()).to(q.dtype).transpose(1, 2)
