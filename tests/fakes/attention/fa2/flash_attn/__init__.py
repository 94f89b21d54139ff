"""A fake flash-attn 2 (its ``flash_attn_func`` signature), computing in torch on CPU. Its flaw is
real flash-attn 2's: dq is not deterministic (its backward accumulates dq with atomic adds, so two
identical calls differ in the last bits) unless ``deterministic=True``."""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from kp_attention_common import attention  # noqa: E402

__version__ = "2.8.3"

_noise = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))


class _AtomicOrder(torch.autograd.Function):
    """Identity forward; the backward perturbs the gradient in its last bits, differently on every
    call."""

    @staticmethod
    def forward(ctx, q):
        return q.view_as(q)

    @staticmethod
    def backward(ctx, g):
        eps = torch.finfo(g.dtype).eps
        wobble = (torch.rand(g.shape, generator=_noise) - 0.5).to(g.dtype) * eps
        return g + g * wobble


def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    if not deterministic:
        q = _AtomicOrder.apply(q)
    return attention(
        q,
        k,
        v,
        softmax_scale=softmax_scale,
        causal=causal,
        window_size=window_size,
        softcap=softcap,
        dropout_p=dropout_p,
        alibi_slopes=alibi_slopes,
    )
