"""A fake flash-attn 4 (``flash_attn.cute.flash_attn_func``'s signature: it returns (out, lse); it
takes softcap, but anemoi passes it only softmax_scale and the window), computing in torch on
CPU."""

from __future__ import annotations

import os
import sys

sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
)
from kp_attention_common import attention  # noqa: E402


def flash_attn_func(
    q,
    k,
    v,
    softmax_scale=None,
    causal=False,
    window_size=(None, None),
    learnable_sink=None,
    softcap=0.0,
    num_splits=1,
    pack_gqa=None,
    deterministic=False,
    return_lse=True,
):
    out = attention(
        q,
        k,
        v,
        softmax_scale=softmax_scale,
        causal=causal,
        window_size=window_size,
        softcap=softcap,
    )
    return out, None
