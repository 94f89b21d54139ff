"""Norm and linear fakes. Correct ones compute in float32 like torch.nn; wrong ones each have one
bug."""

from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F
from torch import nn


class _Norm(nn.Module):
    def __init__(
        self,
        normalized_shape,
        eps=1e-5,
        elementwise_affine=True,
        bias=True,
        device=None,
        dtype=None,
    ):
        super().__init__()
        n = normalized_shape if isinstance(normalized_shape, int) else normalized_shape[-1]
        self.hidden, self.eps = n, eps
        self.weight = nn.Parameter(torch.ones(n, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(n, device=device, dtype=dtype)) if bias else None


def _ln32(x, w, b, eps):
    """A hand-written two-pass LayerNorm in float32 (what a correct kernel does)."""
    xf = x.float()
    mean = xf.mean(-1, keepdim=True)
    var = (xf - mean).pow(2).mean(-1, keepdim=True)
    y = (xf - mean) * torch.rsqrt(var + eps)
    y = y * w.float()
    if b is not None:
        y = y + b.float()
    return y.to(x.dtype)


def _rms32(x, w, eps):
    eps = torch.finfo(torch.float32).eps if eps is None else eps  # torch.nn.RMSNorm's None, in fp32
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * w.float()).to(x.dtype)


# ---- correct ----------------------------------------------------------------------------------
class GoodLayerNorm(_Norm):
    def forward(self, x):
        return _ln32(x, self.weight, self.bias, self.eps)


class GoodRMSNorm(_Norm):
    def __init__(
        self, normalized_shape, eps=1e-6, elementwise_affine=True, device=None, dtype=None
    ):
        super().__init__(
            normalized_shape, eps, elementwise_affine, bias=False, device=device, dtype=dtype
        )

    def forward(self, x):
        return _rms32(x, self.weight, self.eps)


class GoodLinear(nn.Module):
    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(
            torch.empty(out_features, in_features, device=device, dtype=dtype)
        )
        self.bias = (
            nn.Parameter(torch.empty(out_features, device=device, dtype=dtype)) if bias else None
        )
        # where torch.nn.Linear starts: U(-1/sqrt(in), 1/sqrt(in))
        bound = 1 / math.sqrt(in_features)
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x):
        # F.linear, not `x @ w.t() + b`: under autocast the latter promotes to float32
        return F.linear(x, self.weight, self.bias)


class HiddenSizeLayerNorm(nn.Module):
    """Correct, with liger's constructor: the size is `hidden_size` (anemoi's `normalized_shape=`
    fails)."""

    def __init__(self, hidden_size, eps=1e-6, bias=True):
        super().__init__()
        self.hidden_size, self.eps = hidden_size, eps
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.bias = nn.Parameter(torch.zeros(hidden_size)) if bias else None

    def forward(self, x):
        return _ln32(x, self.weight, self.bias, self.eps)


class HiddenSizeRMSNorm(nn.Module):
    """Correct RMSNorm with LigerRMSNorm's constructor (`hidden_size`, eps=1e-6)."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.hidden_size, self.eps = hidden_size, eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x):
        return _rms32(x, self.weight, self.eps)


class ExtraStateLayerNorm(GoodLayerNorm):
    """Correct, but like transformer-engine it adds `_extra_state` to its state dict."""

    def get_extra_state(self):
        return torch.empty(0, dtype=torch.uint8)

    def set_extra_state(self, state):
        pass


class NestedLayerNorm(nn.Module):
    """Correct maths, but its parameters live in a submodule (`norm.weight`): no portable twin."""

    def __init__(self, normalized_shape, eps=1e-5, bias=True):
        super().__init__()
        self.norm = GoodLayerNorm(normalized_shape, eps=eps, bias=bias)

    def forward(self, x):
        return self.norm(x)


# ---- wrong: each has one bug ------------------------------------------------------------------
class WrongEpsLayerNorm(_Norm):
    """Ignores the eps it is given and uses 1e-6 (liger's default vs torch's 1e-5)."""

    def forward(self, x):
        return _ln32(x, self.weight, self.bias, 1e-6)


class NoBiasLayerNorm(_Norm):
    """Accepts bias=True but never adds it."""

    def forward(self, x):
        return _ln32(x, self.weight, None, self.eps)


class IgnoresWeightLayerNorm(_Norm):
    def forward(self, x):
        return _ln32(x, torch.ones_like(self.weight), self.bias, self.eps)


class RMSNormAsLayerNorm(_Norm):
    """An RMSNorm offered as a LayerNorm: no mean subtraction (and here, no bias)."""

    def forward(self, x):
        return _rms32(x, self.weight, self.eps)


class OnePassLayerNorm(_Norm):
    """Variance as E[x^2] - E[x]^2 in the input dtype: cancellation for a large mean."""

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = (x * x).mean(-1, keepdim=True) - mean * mean
        y = (x - mean) * torch.rsqrt(var.clamp_min(0) + self.eps)
        return y * self.weight + self.bias


class LowPrecisionLayerNorm(_Norm):
    """Two-pass, but entirely in the input dtype: squares overflow in fp16."""

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        d = x - mean
        var = (d * d).sum(-1, keepdim=True) / x.shape[-1]
        return d * torch.rsqrt(var + self.eps) * self.weight + self.bias


class ContiguousOnlyLayerNorm(_Norm):
    """Reads its input as if it were contiguous (ignores strides), like a kernel missing a
    .contiguous()."""

    def forward(self, x):
        flat = torch.as_strided(x, (x.numel() // self.hidden, self.hidden), (self.hidden, 1))
        return _ln32(flat, self.weight, self.bias, self.eps).reshape(x.shape)


class StaleWeightLayerNorm(_Norm):
    """Caches a copy of its weight at the first forward and computes with it from then on: right
    until an optimizer step changes the weight (issue 54's bug class)."""

    def forward(self, x):
        if not hasattr(self, "_weight"):
            self._weight = self.weight.detach().clone()
            return _ln32(x, self.weight, self.bias, self.eps)
        return _ln32(x, self._weight, self.bias, self.eps)


class CachingLayerNorm(_Norm):
    """Caches the statistics of the first input it sees, per shape."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self._cache = {}

    def forward(self, x):
        xf = x.float()
        key = tuple(x.shape)
        if key not in self._cache:
            mean = xf.mean(-1, keepdim=True)
            rstd = torch.rsqrt(xf.var(-1, unbiased=False, keepdim=True) + self.eps)
            self._cache[key] = (mean.detach(), rstd.detach())
        mean, rstd = self._cache[key]
        return ((xf - mean) * rstd * self.weight.float() + self.bias.float()).to(x.dtype)


class _InPlaceGradFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, eps):
        ctx.save_for_backward(x, w, b)
        ctx.eps = eps
        return F.layer_norm(x, (x.shape[-1],), w, b, eps)

    @staticmethod
    def backward(ctx, gy):
        x, w, b = ctx.saved_tensors
        with torch.enable_grad():
            xx = x.detach().requires_grad_(True)
            ww = w.detach().requires_grad_(True)
            bb = b.detach().requires_grad_(True)
            y = F.layer_norm(xx, (x.shape[-1],), ww, bb, ctx.eps)
            dx, dw, db = torch.autograd.grad(y, (xx, ww, bb), gy)
        gy.copy_(dx)  # like LigerRMSNorm(in_place=True): dx is written into grad_output's buffer
        return gy, dw, db, None


class InPlaceBackwardLayerNorm(_Norm):
    def forward(self, x):
        return _InPlaceGradFn.apply(x, self.weight, self.bias, self.eps)


class MutatesInputLayerNorm(_Norm):
    def forward(self, x):
        with torch.no_grad():
            x.mul_(1.0000001).add_(0.0)  # "harmless" in-place touch of the caller's tensor
            x[..., 0] = x[..., 0] * 1.5
        return _ln32(x, self.weight, self.bias, self.eps)


class NaNLayerNorm(_Norm):
    def forward(self, x):
        y = _ln32(x, self.weight, self.bias, self.eps)
        return y * torch.where(
            torch.arange(y.shape[-1], device=y.device) == 3, float("nan"), 1.0
        ).to(y.dtype)


class WrongBackwardLayerNorm(_Norm):
    """Forward right; backward drops the mean term of dx (a classic hand-written-kernel bug)."""

    def forward(self, x):
        return _WrongGrad.apply(x, self.weight, self.bias, self.eps)


class _WrongGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, eps):
        xf = x.float()
        mean = xf.mean(-1, keepdim=True)
        rstd = torch.rsqrt(xf.var(-1, unbiased=False, keepdim=True) + eps)
        xhat = (xf - mean) * rstd
        ctx.save_for_backward(xhat, rstd, w)
        return (xhat * w.float() + b.float()).to(x.dtype)

    @staticmethod
    def backward(ctx, gy):
        xhat, rstd, w = ctx.saved_tensors
        g = gy.float() * w.float()
        dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))  # missing "- g.mean()"
        red = tuple(range(gy.dim() - 1))
        return (
            dx.to(gy.dtype),
            (gy.float() * xhat).sum(red).to(w.dtype),
            gy.float().sum(red).to(w.dtype),
            None,
        )


class UpcastingLayerNorm(_Norm):
    """Returns float32 whatever the input dtype."""

    def forward(self, x):
        return _ln32(x, self.weight, self.bias, self.eps).float()


class AbortInForwardLayerNorm(_Norm):
    def forward(self, x):
        os.abort()


class NarrowRowsLayerNorm(_Norm):
    """Right at model widths; its narrow-row path (hidden <= 128, e.g. q/k norms over head_dim 64)
    ignores eps, like a kernel that dispatches a second, less tested variant on the row width."""

    def forward(self, x):
        return _ln32(x, self.weight, self.bias, 0.0 if self.hidden <= 128 else self.eps)


class WrongLinear(GoodLinear):
    """Forgets the bias."""

    def forward(self, x):
        return F.linear(x, self.weight)


# ---- right to rounding, yet they change the model -----------------------------------------------
class RandnBiasLayerNorm(_Norm):
    """Correct maths; its fresh bias is drawn from randn (as LigerLayerNorm(bias=True) does)."""

    def __init__(
        self,
        normalized_shape,
        eps=1e-5,
        elementwise_affine=True,
        bias=True,
        device=None,
        dtype=None,
    ):
        super().__init__(normalized_shape, eps, elementwise_affine, bias, device, dtype)
        if self.bias is not None:
            with torch.no_grad():
                self.bias.normal_()

    def forward(self, x):
        return _ln32(x, self.weight, self.bias, self.eps)


class NormalInitLinear(GoodLinear):
    """Correct maths; its weight starts from N(0, 0.023) and its bias at zero (transformer-engine's
    init)."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device, dtype)
        with torch.no_grad():
            self.weight.normal_(0.0, 0.023)
            if self.bias is not None:
                self.bias.zero_()


class GammaBetaLayerNorm(nn.Module):
    """Correct maths; its parameters are called gamma and beta (declared in that order)."""

    def __init__(
        self,
        normalized_shape,
        eps=1e-5,
        elementwise_affine=True,
        bias=True,
        device=None,
        dtype=None,
    ):
        super().__init__()
        n = normalized_shape if isinstance(normalized_shape, int) else normalized_shape[-1]
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(n, device=device, dtype=dtype))
        self.beta = nn.Parameter(torch.zeros(n, device=device, dtype=dtype)) if bias else None

    def forward(self, x):
        return _ln32(x, self.gamma, self.beta, self.eps)


class TransposedLinear(nn.Module):
    """Correct maths; its weight is stored as (in, out) and applied as x @ W + b."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        super().__init__()
        bound = 1 / math.sqrt(in_features)
        self.weight = nn.Parameter(
            torch.empty(in_features, out_features, device=device, dtype=dtype).uniform_(
                -bound, bound
            )
        )
        self.bias = (
            nn.Parameter(
                torch.empty(out_features, device=device, dtype=dtype).uniform_(-bound, bound)
            )
            if bias
            else None
        )

    def forward(self, x):
        return F.linear(x, self.weight.t(), self.bias)


class UnorderedSumLayerNorm(_Norm):
    """Correct to rounding, but its reductions add in a different order on every call (like
    atomics)."""

    def forward(self, x):
        xf = x.float()
        order = torch.randperm(xf.shape[-1], device=xf.device)
        mean = xf[..., order].sum(-1, keepdim=True) / xf.shape[-1]
        var = (xf - mean).pow(2)[..., torch.randperm(xf.shape[-1], device=xf.device)].sum(
            -1, keepdim=True
        ) / xf.shape[-1]
        y = (xf - mean) * torch.rsqrt(var + self.eps) * self.weight.float()
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype)


class CudaPolicyLayerNorm(nn.LayerNorm):
    """torch.nn.LayerNorm as CUDA's autocast runs it: layer_norm is on the float32 list, so under
    autocast the output is float32 whatever the input dtype (on CPU, torch keeps bf16). The
    reference for testing the output-dtype rule on a CPU."""

    def forward(self, x):
        if torch.is_autocast_enabled(x.device.type):
            with torch.autocast(x.device.type, enabled=False):
                return F.layer_norm(
                    x.float(),
                    self.normalized_shape,
                    self.weight.float(),
                    None if self.bias is None else self.bias.float(),
                    self.eps,
                )
        return super().forward(x)


class CoarseOutputLayerNorm(_Norm):
    """Returns the input dtype with its output rounded to float8 precision: a dtype change that
    hurts."""

    def forward(self, x):
        y = _ln32(x, self.weight, self.bias, self.eps).float()
        return y.to(torch.float8_e4m3fn).to(x.dtype)


class OddLayoutLayerNorm(nn.Module):
    """Its one parameter has no counterpart in torch.nn.LayerNorm's state dict (a weight one too
    long, no bias)."""

    def __init__(
        self,
        normalized_shape,
        eps=1e-5,
        elementwise_affine=True,
        bias=True,
        device=None,
        dtype=None,
    ):
        super().__init__()
        n = normalized_shape if isinstance(normalized_shape, int) else normalized_shape[-1]
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(n + 1, device=device, dtype=dtype))

    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:], self.scale[:-1], None, self.eps)


# ---- right at the check shapes, wrong only at the model's size (issue 26) ------------------------
# Each has a limit (class attribute) below which it is exactly right; the same code with a limit the
# tensor does not reach is the control. CPU-sized limits stand for the real ones (rows >= 2^23,
# int32 element offsets past 2^31).
def _rows_of(x):
    return x.reshape(-1, x.shape[-1])


class ShiftedBeyondRowsLayerNorm(_Norm):
    """Right for the first ROWS rows; beyond them its output is shifted (a second code path for
    large row counts, like a grid that splits rows over another launch dimension)."""

    ROWS = 4096
    # within 4x torch.nn's max error in bf16 (half an ulp at |y| ~ 4): only its bias is wrong
    SHIFT = 0.05

    def forward(self, x):
        y = _ln32(x, self.weight, self.bias, self.eps)
        flat = _rows_of(y)
        row = torch.arange(flat.shape[0], device=y.device).unsqueeze(-1)
        return torch.where(row >= self.ROWS, flat + self.SHIFT, flat).reshape(y.shape)


class RoundUpLayerNorm(_Norm):
    """Right but for its rounding: the output is computed in float64 and rounded up (towards +inf)
    to the input dtype instead of to nearest. Every element is within one ulp, so its max error is
    at most twice torch.nn's half ulp and its RMS error twice torch.nn's: only its bias, half an ulp
    on every element, is wrong (a kernel storing with the wrong rounding mode)."""

    def forward(self, x):
        y = _ln32(
            x.double(),
            self.weight.double(),
            None if self.bias is None else self.bias.double(),
            self.eps,
        )
        with torch.no_grad():
            low = y.to(x.dtype)
            up = torch.where(
                low.double() < y, torch.nextafter(low, torch.full_like(low, math.inf)), low
            )
        return (y + (up.double() - y)).to(x.dtype) if not y.requires_grad else _straight(y, up)


def _straight(y, rounded):
    """``rounded``'s values with ``y``'s gradient (the rounding is not differentiated)."""
    return (y + (rounded.double() - y).detach()).to(rounded.dtype)


class OverflowLayerNorm(_Norm):
    """Element offsets wrap at 2^BITS, like int32 offsets past 2^31: a row whose first element lies
    at or beyond 2^BITS is computed from the row the wrapped offset points to (forward and
    backward)."""

    BITS = 21

    def forward(self, x):
        flat = _rows_of(x)
        rows, hidden = flat.shape
        start = torch.arange(rows, device=x.device) * hidden
        source = (start % (1 << self.BITS)) // hidden
        return _ln32(flat[source], self.weight, self.bias, self.eps).reshape(x.shape)


class _HalfGradBeyond(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, limit):
        ctx.limit = limit
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        flat = _rows_of(g).clone()
        flat[ctx.limit :] *= 0.5
        return flat.reshape(g.shape), None


class BackwardBeyondRowsLayerNorm(_Norm):
    """Forward right everywhere; the input gradient of rows beyond ROWS is halved (a backward kernel
    with its own, wrong, large-size path)."""

    ROWS = 4096

    def forward(self, x):
        return _ln32(_HalfGradBeyond.apply(x, self.ROWS), self.weight, self.bias, self.eps)


class PartialSumLayerNorm(_Norm):
    """Output and input gradient right; the weight and bias gradients sum only the first ROWS rows
    (a reduction whose partial-sum buffer is sized for fewer blocks than the tensor has)."""

    ROWS = 4096

    def forward(self, x):
        flat = _rows_of(x)
        head, tail = flat[: self.ROWS], flat[self.ROWS :]
        y_head = _ln32(head, self.weight, self.bias, self.eps)
        y_tail = _ln32(tail, self.weight.detach(), self.bias.detach(), self.eps)
        return torch.cat([y_head, y_tail]).reshape(x.shape)


class RowLimitRMSNorm(_Norm):
    """RMSNorm right for the first ROWS rows, its output scaled by 1.1 beyond them."""

    ROWS = 4096

    def __init__(
        self, normalized_shape, eps=1e-6, elementwise_affine=True, device=None, dtype=None
    ):
        super().__init__(
            normalized_shape, eps, elementwise_affine, bias=False, device=device, dtype=dtype
        )

    def forward(self, x):
        y = _rms32(x, self.weight, self.eps)
        flat = _rows_of(y)
        row = torch.arange(flat.shape[0], device=y.device).unsqueeze(-1)
        return torch.where(row >= self.ROWS, flat * 1.1, flat).reshape(y.shape)


class RowLimitLinear(GoodLinear):
    """A Linear whose rows beyond ROWS lose the bias."""

    ROWS = 4096

    def forward(self, x):
        y = F.linear(x, self.weight, self.bias)
        flat = _rows_of(y)
        row = torch.arange(flat.shape[0], device=y.device).unsqueeze(-1)
        return torch.where(row >= self.ROWS, flat - self.bias, flat).reshape(y.shape)


class FixedEpsRMSNorm(GoodRMSNorm):
    """Correct, but an eps of None becomes 1e-6 (liger's default), not torch's dtype epsilon."""

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, **kw):
        super().__init__(normalized_shape, 1e-6 if eps is None else eps, elementwise_affine, **kw)


class DtypeEpsRMSNorm(GoodRMSNorm):
    """eps=None as torch documents it, ``finfo(x.dtype).eps`` (7.8e-3 for bfloat16), where torch
    adds float32's: right in float32 only."""

    def forward(self, x):
        return _rms32(x, self.weight, torch.finfo(x.dtype).eps if self.eps is None else self.eps)


class StaleCopyLayerNorm(_Norm):
    """Computes with a copy of its weight taken at the first forward, its gradient still reaching
    the weight: every check at fixed weights passes; after an optimizer step it computes with the
    old weight (issue 54's bug class, as a per-kernel check accepts it)."""

    def forward(self, x):
        if not hasattr(self, "_weight"):
            self._weight = self.weight.detach().clone()
        weight = self._weight + (self.weight - self.weight.detach())  # stale value, live gradient
        return _ln32(x, weight, self.bias, self.eps)


# ---- issue 55: right on a fresh module's first training call, wrong as training and inference
# use it (each rejected by one case of kernel_probe.probe.lifecycle) ---------------------------
class StaleWeightLinear(GoodLinear):
    """Caches its weight transposed (a cast copy, as an FP8 weight cache does) at the first forward
    and computes with it from then on, its gradient still reaching the weight: wrong after an
    optimizer step changes the weight in place."""

    def forward(self, x):
        if not hasattr(self, "_weight_t"):
            self._weight_t = self.weight.detach().t().contiguous()
        weight = self._weight_t.t() + (self.weight - self.weight.detach())  # stale value, live grad
        return F.linear(x, weight, self.bias)


class EvalUnbiasedLayerNorm(_Norm):
    """In eval mode another path, with the unbiased variance (n - 1)."""

    def forward(self, x):
        if self.training:
            return _ln32(x, self.weight, self.bias, self.eps)
        xf = x.float()
        mean, var = xf.mean(-1, keepdim=True), xf.var(-1, unbiased=True, keepdim=True)
        y = (xf - mean) * torch.rsqrt(var + self.eps) * self.weight.float() + self.bias.float()
        return y.to(x.dtype)


def _fast_path():
    """Where a fused no-grad kernel runs: no autograd graph is recorded."""
    return not torch.is_grad_enabled()


class NoGradNoBiasLayerNorm(_Norm):
    """A no-grad fast path (a fused inference kernel) that drops the bias."""

    def forward(self, x):
        return _ln32(x, self.weight, None if _fast_path() else self.bias, self.eps)


class NoGradNoBiasLinear(GoodLinear):
    """The same for a Linear."""

    def forward(self, x):
        return F.linear(x, self.weight, None if _fast_path() else self.bias)


class InferenceModeNoBiasLinear(GoodLinear):
    """Drops the bias under torch.inference_mode() only (plain no_grad is right)."""

    def forward(self, x):
        return F.linear(x, self.weight, None if torch.is_inference_mode_enabled() else self.bias)


def _stride_one(x):
    """``x`` as a kernel that takes its rows' stride and assumes stride 1 along them reads it."""
    if x.dim() != 2:
        x = x.reshape(-1, x.shape[-1])  # a copy for a view that does not flatten, else a view
    return x.as_strided(x.shape, (x.stride(0), 1))


class StrideOneLayerNorm(_Norm):
    """Assumes its input's last dimension has stride 1 (its 2-D rows' stride taken as given)."""

    def forward(self, x):
        return _ln32(_stride_one(x), self.weight, self.bias, self.eps).reshape(x.shape)


class StrideOneLinear(GoodLinear):
    """The same for a Linear."""

    def forward(self, x):
        return F.linear(_stride_one(x), self.weight, self.bias).reshape(*x.shape[:-1], -1)


class SquareTransposingLinear(GoodLinear):
    """``load_state_dict`` transposes any square weight, as a Conv1D-layout heuristic does: right
    with parameters copied in place, wrong after loading a checkpoint of a square Linear."""

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + "weight"
        w = state_dict.get(key)
        if w is not None and w.dim() == 2 and w.shape[0] == w.shape[1]:
            state_dict[key] = w.t().contiguous()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class LateStaleCopyLayerNorm(_Norm):
    """StaleCopyLayerNorm's bug, one step later: takes its copy again once, at the first forward
    after the weight first changed, then never. Right at fixed weights and after one update (all
    the per-kernel checks see), stale from the second optimizer step: the model check's to catch."""

    def forward(self, x):
        version = self.weight._version
        if not hasattr(self, "_weight") or (version != self._taken and not self._again):
            self._again = hasattr(self, "_weight")
            self._weight, self._taken = self.weight.detach().clone(), version
        weight = self._weight + (self.weight - self.weight.detach())  # stale value, live gradient
        return _ln32(x, weight, self.bias, self.eps)
