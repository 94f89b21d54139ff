"""The layer slots a lock pins, what each computes, and the closed sets every module names.

One home for the facts about slots: their names, the semantics each must compute, the torch.nn class
a slot the lock does not pin resolves to, its canonical configuration and call convention, what the
portable twins compute, and how to tell what a module class computes. Also the enums the lock, the
resolver, the profiles and the command line share (``MODES``, ``PRECISIONS``, ``STATUSES``) and the
one "did you mean" hint for a misspelt slot. Plain data: importing this costs nothing (no torch).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

SLOTS = ("LayerNorm", "RMSNorm", "Linear")
SEMANTICS = ("layer_norm", "rms_norm", "linear")
SLOT_SEMANTICS = {"LayerNorm": "layer_norm", "RMSNorm": "rms_norm", "Linear": "linear"}

# What a slot the lock does not mention resolves to: plain torch.nn, as before the lock existed.
DEFAULT_TARGETS = {"LayerNorm": "torch.nn.LayerNorm", "RMSNorm": "torch.nn.RMSNorm", "Linear": "torch.nn.Linear"}

# Canonical configuration per slot: what the lock pins unless a profile or the user says otherwise.
# RMSNorm's eps is pinned because torch.nn.RMSNorm's default (eps=None) means finfo(dtype).eps,
# which differs between fp32 and bf16, and liger defaults to 1e-6.
CANONICAL: dict[str, dict[str, Any]] = {
    "LayerNorm": {"eps": 1e-5, "bias": True},
    "RMSNorm": {"eps": 1e-6},
    "Linear": {"bias": True},
}

# How a class offered for a slot is called when its declaration does not say: the positional
# arguments (dimensions) and the pinned keyword arguments, as candidate templates ("$name" is filled
# with the canonical value ``name``; see kernel_probe.candidates).
CALL_ARGS: dict[str, tuple[str, ...]] = {
    "LayerNorm": ("$normalized_shape",),
    "RMSNorm": ("$normalized_shape",),
    "Linear": ("$in_features", "$out_features"),
}
CALL_KWARGS: dict[str, dict[str, Any]] = {
    "LayerNorm": {"eps": "$eps"},
    "RMSNorm": {"eps": "$eps"},
    "Linear": {"bias": "$bias"},
}

# What the portable twins compute. A twin records no semantics of its own, so a twin target listed
# here whose semantics differ from its slot's (an RMSNorm standing in for a LayerNorm) is refused;
# a target not listed (a trusted module's class) cannot be judged and is taken at the lock's word.
TWIN_SEMANTICS = {
    "torch.nn.LayerNorm": "layer_norm",
    "torch.nn.modules.normalization.LayerNorm": "layer_norm",
    "torch.nn.RMSNorm": "rms_norm",
    "torch.nn.modules.normalization.RMSNorm": "rms_norm",
    "torch.nn.Linear": "linear",
    "torch.nn.modules.linear.Linear": "linear",
    "kernel_lock.adapters.CompiledLayerNorm": "layer_norm",
    "kernel_lock.adapters.CompiledRMSNorm": "rms_norm",
    "kernel_lock.adapters.CompiledLinear": "linear",
}

# The semantics a kernel may compute by mistake instead of its own (same shapes, same parameters):
# a "LayerNorm" whose output matches an RMSNorm reference computes the other one.
CONFUSABLE = {"layer_norm": "rms_norm", "rms_norm": "layer_norm"}

MODES = ("training", "inference")


class Precision(NamedTuple):
    dtype: str  # torch dtype name, without "torch."
    regime: str  # "true": parameters and compute in dtype; "mixed": float32 parameters under autocast


# Lightning / anemoi precision names -> (dtype, regime); the names are the keys, in this order.
PRECISIONS: Mapping[str, Precision] = MappingProxyType(
    {
        "32-true": Precision("float32", "true"),
        "bf16-true": Precision("bfloat16", "true"),
        "16-true": Precision("float16", "true"),
        "bf16-mixed": Precision("bfloat16", "mixed"),
        "16-mixed": Precision("float16", "mixed"),
    }
)

# What a candidate's check came to, as the lock records it per candidate; worst first (a candidate
# checked in several dtypes gets the worst of its results, kernel_probe.judge.worst_status).
STATUSES = ("crashed", "timeout", "rejected", "unavailable", "accepted", "skipped")


def slot_name_fix(name: str) -> str:
    """The fix for an unknown slot ``name``: the slot it misspells, if only case differs, else the list."""
    close = [s for s in SLOTS if s.lower() == str(name).lower()]
    if close:
        return f"did you mean {close[0]!r}? slot names are case-sensitive"
    return f"known slots: {', '.join(SLOTS)}"


def class_semantics(cls: Any) -> str | None:
    """What a module class computes, where that can be told; None where it cannot.

    torch's own classes are told exactly: a subclass of ``torch.nn.RMSNorm``, ``LayerNorm`` or
    ``Linear`` computes that; any other torch module computes something else (``other: Identity``).
    Another library's class is told by its name and its bases' (``LigerRMSNorm`` is an RMSNorm);
    RMSNorm is looked for first, over the whole MRO, so an adapter subclassing LigerRMSNorm is one.
    """
    if not isinstance(cls, type):
        return None
    import torch

    for base, semantics in (
        (torch.nn.RMSNorm, "rms_norm"),
        (torch.nn.LayerNorm, "layer_norm"),
        (torch.nn.Linear, "linear"),
    ):
        if issubclass(cls, base):
            return semantics
    names = [c.__name__.lower() for c in cls.__mro__]
    if any("rmsnorm" in n for n in names):
        return "rms_norm"
    if any("layernorm" in n for n in names):
        return "layer_norm"
    if any(n.endswith("linear") for n in names[:-2]):  # the class and its bases, not nn.Module / object
        return "linear"
    if cls.__module__.split(".")[0] == "torch":
        return f"other: {cls.__name__}"
    return None
