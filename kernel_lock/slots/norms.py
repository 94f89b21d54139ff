"""The LayerNorm and RMSNorm slots, each the other's likely mistake. RMSNorm's eps is
pinned: torch's default depends on the dtype, liger's is 1e-6."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from math import prod
from typing import Any

from .base import SlotSpec, TargetFacts, TwinArgs, torch_aliases

__all__ = ["LAYER_NORM", "RMS_NORM"]

_LAYER_NORM = frozenset(
    ("normalized_shape", "eps", "elementwise_affine", "bias", "device", "dtype")
)
_RMS_NORM = frozenset(("normalized_shape", "eps", "elementwise_affine", "device", "dtype"))


def _eps(module: Any) -> float | None:
    for name in ("eps", "variance_epsilon"):  # where norm classes keep their eps
        value = getattr(module, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def _twin_args(
    module: Any, state: Mapping[str, Any], accepted: set[str], *, bias: bool
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The module's own size and eps (a call site may have set it), and its affine parameters."""
    shape = getattr(module, "normalized_shape", None)
    if shape is None:
        shape = tuple(state["weight"].shape) if "weight" in state else (int(module.hidden_size),)
    kwargs: dict[str, Any] = {}
    eps = _eps(module)
    if eps is not None and "eps" in accepted:
        kwargs["eps"] = eps
    if "elementwise_affine" in accepted:
        kwargs["elementwise_affine"] = "weight" in state
    if bias and "bias" in accepted:
        kwargs["bias"] = "bias" in state
    return (tuple(shape) if not isinstance(shape, int) else (shape,),), kwargs


def _sample_width(twin: Any) -> int:
    params = list(twin.parameters())
    return int(prod(getattr(twin, "normalized_shape", (params[0].shape[0],))))


_LAYER_NORM_TWIN: TwinArgs = partial(_twin_args, bias=True)
_RMS_NORM_TWIN: TwinArgs = partial(_twin_args, bias=False)

LAYER_NORM = SlotSpec(
    name="LayerNorm",
    semantics="layer_norm",
    default_target="torch.nn.LayerNorm",
    canonical={"eps": 1e-5, "bias": True},
    call_args=("$normalized_shape",),
    call_kwargs={"eps": "$eps"},
    known_targets={
        "torch.nn.LayerNorm": TargetFacts("layer_norm", _LAYER_NORM, True),
        # kernel_lock.adapters: a subclass with the same constructor (a torch.compile'd forward)
        "kernel_lock.adapters.CompiledLayerNorm": TargetFacts("layer_norm", _LAYER_NORM, True),
    },
    computed_by=("torch.nn.LayerNorm",),
    aliases=torch_aliases("normalization", "LayerNorm"),
    confusable="rms_norm",
    twin_args=_LAYER_NORM_TWIN,
    sample_width=_sample_width,
)

RMS_NORM = SlotSpec(
    name="RMSNorm",
    semantics="rms_norm",
    default_target="torch.nn.RMSNorm",
    canonical={"eps": 1e-6},
    call_args=("$normalized_shape",),
    call_kwargs={"eps": "$eps"},
    known_targets={
        "torch.nn.RMSNorm": TargetFacts("rms_norm", _RMS_NORM, True),
        "kernel_lock.adapters.CompiledRMSNorm": TargetFacts("rms_norm", _RMS_NORM, True),
    },
    computed_by=("torch.nn.RMSNorm",),
    aliases=torch_aliases("normalization", "RMSNorm"),
    confusable="layer_norm",
    twin_args=_RMS_NORM_TWIN,
    sample_width=_sample_width,
)
