"""Thin module classes kernel_lock ships so a lock can name them as targets.

Each keeps the parameters and state-dict keys of the class it adapts, so a checkpoint moves freely
between the adapter and plain torch.nn. Importing this module imports torch; it is only imported
when a lock resolves one of these targets.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

_compiled: dict[str, Callable[..., Any]] = {}


def _compiled_fn(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    # one compiled function per op, shared by every instance (compilation is per process and shape)
    f = _compiled.get(name)
    if f is None:
        f = _compiled[name] = torch.compile(fn)
    return f


def _layer_norm(x, normalized_shape, weight, bias, eps):
    return F.layer_norm(x, normalized_shape, weight, bias, eps)


def _rms_norm(x, normalized_shape, weight, eps):
    return F.rms_norm(x, normalized_shape, weight, eps)


def _linear(x, weight, bias):
    return F.linear(x, weight, bias)


class CompiledLayerNorm(nn.LayerNorm):
    """``torch.nn.LayerNorm`` whose forward runs through ``torch.compile`` (same parameters)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _compiled_fn("layer_norm", _layer_norm)(x, self.normalized_shape, self.weight, self.bias, self.eps)


class CompiledRMSNorm(nn.RMSNorm):
    """``torch.nn.RMSNorm`` whose forward runs through ``torch.compile`` (same parameters)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _compiled_fn("rms_norm", _rms_norm)(x, self.normalized_shape, self.weight, self.eps)


class CompiledLinear(nn.Linear):
    """``torch.nn.Linear`` whose forward runs through ``torch.compile`` (same parameters)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _compiled_fn("linear", _linear)(x, self.weight, self.bias)
