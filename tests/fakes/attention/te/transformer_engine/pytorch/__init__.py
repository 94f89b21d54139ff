"""A fake ``transformer_engine.pytorch.DotProductAttention`` with TE's constructor and forward
signatures (qkv_format "sbhd" by default, attn_mask_type "causal" by default, the output flattened
to (..., heads * head_dim)), computing in torch on CPU. No softcap: TE's module takes none."""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
)
from kp_attention_common import attention  # noqa: E402


class DotProductAttention(torch.nn.Module):
    def __init__(
        self,
        num_attention_heads,
        kv_channels,
        num_gqa_groups=None,
        attention_dropout=0.0,
        qkv_format="sbhd",
        attn_mask_type="causal",
        window_size=None,
        sequence_parallel=False,
        tp_size=1,
        get_rng_state_tracker=None,
        tp_group=None,
        layer_number=None,
        attention_type="self",
        cp_group=None,
        cp_global_ranks=None,
        cp_stream=None,
        cp_comm_type="p2p",
        softmax_scale=None,
    ):
        super().__init__()
        self.heads, self.dim, self.dropout = num_attention_heads, kv_channels, attention_dropout
        self.qkv_format, self.mask_type, self.window = (
            qkv_format,
            attn_mask_type,
            window_size or (-1, -1),
        )
        self.scale = softmax_scale

    def forward(
        self, query_layer, key_layer, value_layer, attention_mask=None, qkv_format=None, **kwargs
    ):
        fmt = qkv_format or self.qkv_format
        q, k, v = query_layer, key_layer, value_layer
        if fmt == "sbhd":
            q, k, v = (t.transpose(0, 1) for t in (q, k, v))
        out = attention(
            q,
            k,
            v,
            softmax_scale=self.scale,
            causal=self.mask_type == "causal",
            window_size=self.window,
            dropout_p=self.dropout if self.training else 0.0,
        )
        if fmt == "sbhd":
            out = out.transpose(0, 1)
        return out.reshape(*out.shape[:2], self.heads * self.dim)
