"""The adapters ``kernel_lock.adapters`` builds, by name: what each wraps, read without torch.

A lock or an anemoi config names an adapter as ``kernel_lock.adapters.NAME``; that module builds the
class (torch) on first lookup. The tables below and the generic naming scheme are the facts behind
those names. They are import-light, so that the export (``kernel_lock.anemoi``) and a lock's trust
check (``kernel_lock.lock.check_target``, which runs before anything is imported) read them without
importing torch. Adding a library class with a known signature is adding a row here.
"""

from __future__ import annotations

import inspect
from typing import Any

__all__ = [
    "ADAPTERS",
    "AUTOCAST_ADAPTERS",
    "GENERIC_PREFIXES",
    "GENERIC_SEPARATOR",
    "SIZE_ADAPTERS",
    "SIZE_NAMES",
    "WRAPPING_ADAPTERS",
    "adapter_for",
    "generic_kernel",
    "generic_parts",
    "size_parameter",
    "wrapping_adapter_for",
]

ADAPTERS = "kernel_lock.adapters"

# anemoi builds norms as ``LayerNorm(C)`` and ``LayerNorm(normalized_shape=C)``; these library
# classes call the size ``hidden_size``, so anemoi cannot build them directly. Each entry is an
# adapter: a subclass of the library class (same parameters, same state-dict keys) whose first
# argument is ``normalized_shape``. Adding a library with that signature is adding a row here.
# adapter name -> (the library class it subclasses, the name of that class's size parameter)
SIZE_ADAPTERS: dict[str, tuple[str, str]] = {
    "LigerLayerNormAnemoi": ("liger_kernel.transformers.LigerLayerNorm", "hidden_size"),
    "LigerRMSNormAnemoi": ("liger_kernel.transformers.LigerRMSNorm", "hidden_size"),
    "FlashAttnRMSNormAnemoi": ("flash_attn.ops.triton.layer_norm.RMSNorm", "hidden_size"),
}

# anemoi's AutocastLayerNorm is torch.nn.LayerNorm with its output cast back to the input dtype, and
# anemoi's gnn preset (and every QueryNorm/KeyNorm default) relies on that cast. Where a lock pins
# another LayerNorm kernel, these keep the cast around it: a subclass of the kernel's anemoi-ready
# class whose forward returns ``super().forward(x).type_as(x)`` (same parameters and state dict).
# adapter name -> the class it subclasses (a library class, or another adapter)
AUTOCAST_ADAPTERS: dict[str, str] = {
    "AutocastCompiledLayerNorm": f"{ADAPTERS}.CompiledLayerNorm",
    "AutocastLigerLayerNormAnemoi": f"{ADAPTERS}.LigerLayerNormAnemoi",
    "AutocastTELayerNorm": "transformer_engine.pytorch.LayerNorm",
    "AutocastFusedLayerNorm": "apex.normalization.FusedLayerNorm",
}

# the adapters that keep an anemoi wrapper's behaviour, by the wrapper's adapter prefix
WRAPPING_ADAPTERS: dict[str, dict[str, str]] = {"Autocast": AUTOCAST_ADAPTERS}

# Generic adapters: for a kernel no table above names (a site's own class, a library not listed),
# the adapter's *name* carries the kernel's dotted path, its dots written ``__``:
#   kernel_lock.adapters.Autocast__site_kernels__norms__FastLayerNorm
# is site_kernels.norms.FastLayerNorm (given anemoi's ``normalized_shape`` argument if it takes its
# size as one of SIZE_NAMES) with its output cast back to the input dtype; ``Sized__...`` only
# renames the size argument. Built on first lookup like every adapter, so it pickles by name, and it
# subclasses the kernel (same parameters and state dict). Nothing in kernel_lock is edited to use a
# new kernel.
GENERIC_SEPARATOR = "__"
GENERIC_PREFIXES = ("Autocast", "Sized")
SIZE_NAMES = ("hidden_size", "dim")


def generic_parts(name: str) -> tuple[str, str] | None:
    """(prefix, kernel path) of a generic adapter's class name, or None."""
    prefix, sep, rest = name.partition(GENERIC_SEPARATOR)
    if not sep or prefix not in GENERIC_PREFIXES:
        return None
    parts = rest.split(GENERIC_SEPARATOR)
    if len(parts) < 2 or any(not p.isidentifier() or p.startswith("_") for p in parts):
        return None
    return prefix, ".".join(parts)


def generic_kernel(target: str) -> str | None:
    """The kernel a generic adapter target wraps (``kernel_lock.adapters.Autocast__a__B`` ->
    ``a.B``), or None."""
    module, _, name = target.rpartition(".")
    if module != ADAPTERS:
        return None
    parts = generic_parts(name)
    return parts[1] if parts else None


def adapter_for(target: str) -> str | None:
    """The ``kernel_lock.adapters`` path of the size adapter for ``target``, or None if there is
    none."""
    for name, (wrapped, _) in SIZE_ADAPTERS.items():
        if wrapped == target:
            return f"{ADAPTERS}.{name}"
    return None


def wrapping_adapter_for(prefix: str, target: str) -> str | None:
    """The ``kernel_lock.adapters`` path of the class that runs ``target`` inside the behaviour of
    the anemoi wrapper ``prefix`` names (e.g. Autocast: the output cast back to the input dtype)."""
    for name, base in WRAPPING_ADAPTERS.get(prefix, {}).items():
        if base == target:
            return f"{ADAPTERS}.{name}"
    return None


def size_parameter(cls: Any) -> str | None:
    """The name a norm class gives its size where it is not anemoi's ``normalized_shape`` (one of
    ``SIZE_NAMES``, as its first parameter), else None."""
    try:
        params = [p for p in inspect.signature(cls).parameters.values() if p.name != "self"]
    except (TypeError, ValueError):
        return None
    if not params or any(p.name == "normalized_shape" for p in params):
        return None
    return params[0].name if params[0].name in SIZE_NAMES else None
