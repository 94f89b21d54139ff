"""The LayerNorm and RMSNorm slots: each the other's likely mistake (an RMSNorm drops the mean and
the bias). RMSNorm's eps is pinned: torch.nn.RMSNorm's default (``eps=None``) means
``finfo(dtype).eps``, which differs between fp32 and bf16, and liger defaults to 1e-6."""

from __future__ import annotations

from .base import SlotSpec, TargetFacts, torch_aliases

__all__ = ["LAYER_NORM", "RMS_NORM"]

_LAYER_NORM = frozenset(
    ("normalized_shape", "eps", "elementwise_affine", "bias", "device", "dtype")
)
_RMS_NORM = frozenset(("normalized_shape", "eps", "elementwise_affine", "device", "dtype"))

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
)
