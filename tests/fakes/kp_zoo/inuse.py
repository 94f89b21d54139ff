"""Activation, Attention and GatedMLP fakes of issue 55's bug classes: right on a fresh module's
first training call, wrong as training or inference uses it (after an update, in eval mode, under
no_grad, on a view, after a load, at large magnitudes). Each has one flaw; offered as
``--candidate SLOT=kp_zoo.inuse.NAME``."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from kernel_lock.attention import SDPAttention
from kernel_lock.gated_mlp import GatedMLP


# ---- Activation --------------------------------------------------------------------------------
class EvalTanhGELU(nn.Module):
    """GELU, exact in training; in eval mode another path (the tanh form, ~4.7e-4 off)."""

    def forward(self, x):
        return F.gelu(x, approximate="none" if self.training else "tanh")


class NoGradTanhGELU(nn.Module):
    """GELU, exact where autograd records; a no-grad / inference fast path of the tanh form."""

    def forward(self, x):
        return F.gelu(x, approximate="none" if torch.is_grad_enabled() else "tanh")


def _as_if_contiguous(x):
    """x's storage read as if its last dimension had stride 1 (a kernel's pointer arithmetic)."""
    if x.is_contiguous():
        return x
    strides, step = [], 1
    for n in reversed(x.shape):
        strides.insert(0, step)
        step *= n
    return x.as_strided(x.shape, strides)


class _ContiguousGELU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return F.gelu(_as_if_contiguous(x.detach())).contiguous()

    @staticmethod
    def backward(ctx, gy):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            xf = x.detach().contiguous().requires_grad_(True)
            (dx,) = torch.autograd.grad(F.gelu(xf), xf, gy)
        return dx


class StrideOneGELU(nn.Module):
    """GELU reading its input's memory as if contiguous (the last dimension's stride assumed 1):
    right on a contiguous input, on a view it reads other elements (or a strided one's gaps)."""

    def forward(self, x):
        return _ContiguousGELU.apply(x)


# ---- GatedMLP ------------------------------------------------------------------------------------
class CachedWeightGatedMLP(GatedMLP):
    """Its weights transposed and cast once, at the first forward, and reused ever after (TE's FP8
    weight cache; float8 experiments): right until an optimizer step changes them in place."""

    def forward(self, x):
        projections = (self.gate_proj, self.value_proj)
        if not hasattr(self, "_cache"):
            self._cache = [p.weight.detach().t().clone() for p in projections]
        # the forward sees the cached copy; the gradient still reaches the weight (as TE's does)
        gate, value = (
            F.linear(x, p.weight + (c.t().to(p.weight.dtype) - p.weight).detach(), p.bias)
            for p, c in zip(projections, self._cache, strict=True)
        )
        return self.gate_and_multiply(gate, value)


class Conv1DLoadGatedMLP(GatedMLP):
    """``load_state_dict`` transposes every square weight (GPT-2's Conv1D heuristic): right with
    anemoi's rectangular weights, wrong after loading a square one."""

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for key, t in list(state_dict.items()):
            square = t.dim() == 2 and t.shape[0] == t.shape[1]
            if key.startswith(prefix) and key.endswith("weight") and square:
                state_dict[key] = t.t().contiguous()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class ProductFirstGatedMLP(GatedMLP):
    """SwiGLU as ``(g * v) * sigmoid(g)`` in the inputs' dtype: the same value as ``silu(g) * v``
    in exact arithmetic, inf in fp16 where |g * v| > 65504 while ``silu(g) * v`` fits."""

    def gate_and_multiply(self, gate, value):
        return (gate * value) * torch.sigmoid(gate)


# ---- Attention -----------------------------------------------------------------------------------
class EvalScaleAttention(SDPAttention):
    """torch's SDPA in training; in eval mode another path, whose scale is 1/sqrt(head_dim + 1)."""

    def attend(self, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
        if not self.training and scale is None:
            scale = 1.0 / math.sqrt(q.shape[-1] + 1)
        return super().attend(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


class NoGradHalfAttention(SDPAttention):
    """torch's SDPA where autograd records; a no-grad / inference fast path in float16."""

    def attend(self, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
        if torch.is_grad_enabled():
            return super().attend(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        half = [t.half() for t in (q, k, v)]
        mask = (
            attn_mask.half()
            if attn_mask is not None and attn_mask.is_floating_point()
            else attn_mask
        )
        out = super().attend(*half, mask, dropout_p, is_causal, scale, enable_gqa)
        return out.to(q.dtype)


class StrideOneAttention(SDPAttention):
    """torch's SDPA on q, k, v read as if contiguous (BHSD offsets from the shape alone): right on
    contiguous tensors, on a view it attends to other elements (or a strided one's gaps)."""

    def attend(self, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
        q, k, v = (_as_if_contiguous(t) for t in (q, k, v))
        return super().attend(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


class FirstOutputAttention(SDPAttention):
    """Caches its first output per shape and returns it on later calls of that shape (a kernel
    memoising its result: right on every first call). Its gradients are computed afresh."""

    def attend(self, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
        out = super().attend(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        memo = self.__dict__.setdefault("_memo", {})
        first = memo.setdefault((tuple(q.shape), q.dtype), out.detach())
        return out + (first - out).detach()


class _RoundedSoftmaxDelta(torch.autograd.Function):
    """Attention with float32 accumulation whose backward takes softmax's delta, rowsum(P * dP),
    from P rounded to the inputs' dtype: where every key carries the same value dP is constant
    along the row, dS = P (dP - delta) must vanish and with a rounded P it does not (anemoi-core
    #1027's class)."""

    @staticmethod
    def scores(q, k, mask, scale):
        s = (q.float() @ k.float().transpose(-1, -2)) * scale
        if mask is None:
            return s
        return s.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else s + mask.float()

    @staticmethod
    def forward(ctx, q, k, v, mask, scale):
        s = _RoundedSoftmaxDelta.scores(q, k, mask, scale)
        lse = torch.logsumexp(s, -1, keepdim=True)
        ctx.save_for_backward(q, k, v, lse)
        ctx.mask, ctx.scale = mask, scale
        return (torch.exp(s - lse) @ v.float()).to(q.dtype)

    @staticmethod
    def backward(ctx, go):
        q, k, v, lse = ctx.saved_tensors
        p = torch.exp(_RoundedSoftmaxDelta.scores(q, k, ctx.mask, ctx.scale) - lse)
        dp = go.float() @ v.float().transpose(-1, -2)
        delta = (p.to(q.dtype).float() * dp).sum(-1, keepdim=True)  # the flaw: P rounded
        ds = p * (dp - delta)
        dq = (ds @ k.float()) * ctx.scale
        dk = (ds.transpose(-1, -2) @ q.float()) * ctx.scale
        dv = p.transpose(-1, -2) @ go.float()
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None


class RoundedDeltaAttention(SDPAttention):
    """``_RoundedSoftmaxDelta`` with the window, causal and the caller's mask; no grouped heads or
    dropout (it refuses them)."""

    def attend(self, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
        if enable_gqa or dropout_p:
            raise NotImplementedError("RoundedDeltaAttention takes no grouped heads or dropout")
        mask, is_causal = self._masked(q, k, attn_mask, is_causal)
        if is_causal:
            mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        return _RoundedSoftmaxDelta.apply(q, k, v, mask, scale or 1.0 / math.sqrt(q.shape[-1]))
