"""The layer slots a lock pins, and what each computes.

One home for the facts about slots: their names, the semantics each must compute, the torch.nn class
a slot the lock does not pin resolves to, and how to tell what a module class computes.
"""

from __future__ import annotations

from typing import Any

SLOTS = ("LayerNorm", "RMSNorm", "Linear")
SEMANTICS = ("layer_norm", "rms_norm", "linear")
SLOT_SEMANTICS = {"LayerNorm": "layer_norm", "RMSNorm": "rms_norm", "Linear": "linear"}

# What a slot the lock does not mention resolves to: plain torch.nn, as before the lock existed.
DEFAULT_TARGETS = {"LayerNorm": "torch.nn.LayerNorm", "RMSNorm": "torch.nn.RMSNorm", "Linear": "torch.nn.Linear"}


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

    for base, semantics in ((torch.nn.RMSNorm, "rms_norm"), (torch.nn.LayerNorm, "layer_norm"), (torch.nn.Linear, "linear")):
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
