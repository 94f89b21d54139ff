"""GraphTransformer attention functions with anemoi's conv signature ``f(q, k, v, e, edge_index,
size)``, offered to the GraphAttention check as ``kp_graph_attention.NAME``: one correct, and the
flaw the check must catch (the low-precision backward of anemoi-core #1027's class), each for its
reason."""

from __future__ import annotations

import math

import torch


def _scores(q, k, e, src, dst):
    return (q.index_select(0, dst) * (k.index_select(0, src) + e)).sum(-1) / math.sqrt(q.shape[-1])


def _softmax(scores, dst, n_dst):
    peak = torch.full((n_dst, scores.shape[1]), -math.inf, dtype=scores.dtype)
    peak = peak.scatter_reduce(0, dst[:, None].expand_as(scores), scores, "amax", include_self=True)
    w = torch.exp(scores - peak.index_select(0, dst))
    total = torch.zeros((n_dst, scores.shape[1]), dtype=scores.dtype).index_add(0, dst, w)
    return w / total.index_select(0, dst), peak + torch.log(total)


class _LowPrecisionRecompute(torch.autograd.Function):
    """Forward in float32 (correct, cast to the inputs' dtype), saving a float32 log-sum-exp; the
    backward recomputes the scores in the inputs' dtype (bf16/fp16) against it and takes D =
    sum(alpha * dalpha) from those weights: they no longer sum to one, so dq and dk do not cancel
    where they must vanish (a sharp softmax over equal messages). Correct in float32."""

    @staticmethod
    def forward(ctx, q, k, v, e, src, dst):
        n_dst = q.shape[0]
        alpha, lse = _softmax(_scores(q.float(), k.float(), e.float(), src, dst), dst, n_dst)
        msg = (v.float().index_select(0, src) + e.float()) * alpha[..., None]
        out = torch.zeros((n_dst, *q.shape[1:]), dtype=torch.float32).index_add(0, dst, msg)
        ctx.save_for_backward(q, k, v, e, src, dst, lse)
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, go):
        q, k, v, e, src, dst, lse = ctx.saved_tensors
        c = math.sqrt(q.shape[-1])
        if q.dtype == torch.float32:
            alpha, _ = _softmax(_scores(q, k, e, src, dst), dst, q.shape[0])
        else:  # the bug: scores recomputed in bf16/fp16, against the float32 log-sum-exp
            alpha = torch.exp(_scores(q, k, e, src, dst).float() - lse.index_select(0, dst))
        q32, k32, v32, e32, g = q.float(), k.float(), v.float(), e.float(), go.float()
        key, msg, g_e = (
            k32.index_select(0, src) + e32,
            v32.index_select(0, src) + e32,
            g.index_select(0, dst),
        )
        dalpha = (g_e * msg).sum(-1)
        delta = torch.zeros(lse.shape, dtype=torch.float32).index_add(0, dst, alpha * dalpha)
        ds = alpha * (dalpha - delta.index_select(0, dst))
        dmsg = alpha[..., None] * g_e
        dkey = ds[..., None] * q32.index_select(0, dst) / c
        dq = torch.zeros_like(q32).index_add(0, dst, ds[..., None] * key / c)
        dk = torch.zeros_like(k32).index_add(0, src, dkey)
        dv = torch.zeros_like(v32).index_add(0, src, dmsg)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), (dmsg + dkey).to(e.dtype), None, None


def low_precision_backward(q, k, v, e, edge_index, size):
    """The #1027 class of bug: a forward that is right, a backward recomputed in low precision."""
    return _LowPrecisionRecompute.apply(q, k, v, e, edge_index[0], edge_index[1])


def float32_formula(q, k, v, e, edge_index, size):
    """Correct: the formula in float32 with autograd's own backward, cast back to the inputs'
    dtype."""
    src, dst = edge_index
    alpha, _ = _softmax(_scores(q.float(), k.float(), e.float(), src, dst), dst, q.shape[0])
    msg = (v.float().index_select(0, src) + e.float()) * alpha[..., None]
    return (
        torch.zeros((q.shape[0], *q.shape[1:]), dtype=torch.float32)
        .index_add(0, dst, msg)
        .to(q.dtype)
    )
